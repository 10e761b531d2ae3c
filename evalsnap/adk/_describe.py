"""The resolved agent tree as JSON data: what every part of an agent *is*, stably.

Everything that changes what an agent does is described, by walking the agent's own pydantic
fields (so a field ADK adds is covered without a change here): sub-agents and workflow
agents, AgentTool agents (recursively, with the wrapper's options), models and their
generate-content config, instructions, schemas, output key, include_contents, planner, code
executor, tools (declarations; a function tool's code), callbacks, and an App's plugins.

A callable is its qualified name and a hash of its code (:mod:`evalsnap.agents.code`,
shared with the other lanes). Secret-named fields, attributes and keys
(:func:`~evalsnap.agents.code.is_secret_name`) are left out wherever they appear; transport
settings (``http_options``) too. Long strings are kept as their hash, so a stored tree
stays small.
"""

from __future__ import annotations

import enum
import hashlib
import inspect
import json
import math
from typing import Any

from pydantic import BaseModel

from evalsnap.agents.code import describe_callable, describe_class, is_secret_name, is_user_code, qualname

__all__ = ["describe"]

_TRANSPORT = frozenset({"http_options", "httpOptions"})
_LONG = 240
"""Strings longer than this are described by their hash (a tree is stored per inference)."""
_MAX_DEPTH = 24


# ---- values ------------------------------------------------------------------------------------

def _text(value: str) -> str:
    if len(value) <= _LONG:
        return value
    return f"<{len(value)} chars sha256:{hashlib.sha256(value.encode()).hexdigest()}>"


def _keep(key: str, value: Any) -> bool:
    return not is_secret_name(key) and key not in _TRANSPORT and value is not None \
        and value != [] and value != {}


def _fields(obj: BaseModel, seen: list[int], depth: int, skip: frozenset[str] = frozenset(),
            secret_filter: bool = True) -> dict[str, Any]:
    out = {}
    for name in sorted(type(obj).model_fields):
        if name in skip:
            continue
        value = getattr(obj, name, None)
        if secret_filter and not _keep(name, value):
            continue
        described = describe(value, seen, depth + 1)
        if described is not None and described != [] and described != {}:
            out[name] = described
    return out


def _declaration(tool: Any) -> Any:
    get = getattr(tool, "_get_declaration", None)
    try:
        decl = get() if callable(get) else None
        return decl.model_dump(mode="json", exclude_none=True) if decl is not None else None
    except Exception:  # noqa: BLE001 - a tool that cannot declare itself still has its code
        return None


def _agent(agent: Any, seen: list[int], depth: int) -> dict[str, Any]:
    if id(agent) in seen:
        return {"agent": agent.name, "see": "above"}
    seen.append(id(agent))
    try:
        # Agent fields are named by ADK, never secrets: `output_key` is no key.
        out = {"agent": agent.name, **describe_class(type(agent)),
               **_fields(agent, seen, depth, skip=frozenset({"parent_agent", "name", "tools"}),
                         secret_filter=False)}
        tools = getattr(agent, "tools", None)
        if tools:
            out["tools"] = _tools(list(tools), seen, depth)
        return out
    finally:
        seen.pop()


def _tool(tool: Any, seen: list[int], depth: int) -> dict[str, Any]:
    out: dict[str, Any] = {"tool": getattr(tool, "name", None), **describe_class(type(tool)),
                           **_attributes(tool, seen, depth, skip=frozenset({"name"}))}
    if "_require_confirmation" in vars(tool):  # FunctionTool keeps it private
        out["require_confirmation"] = describe(vars(tool)["_require_confirmation"], seen, depth + 1)
    declaration = _declaration(tool)
    if declaration is not None:
        out["declaration"] = declaration
    return out


def _attributes(obj: Any, seen: list[int], depth: int,
                skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Public instance attributes (private ones are caches and clients)."""
    out = {}
    for name, value in sorted(getattr(obj, "__dict__", {}).items()):
        if name.startswith("_") or name in skip or not _keep(name, value):
            continue
        described = describe(value, seen, depth + 1)
        if described is not None and described != [] and described != {}:
            out[name] = described
    return out


def describe(value: Any, seen: list[int] | None = None, depth: int = 0) -> Any:
    """JSON data that is equal for equal agents, in every process."""
    from google.adk.agents.base_agent import BaseAgent
    from google.adk.plugins.base_plugin import BasePlugin
    from google.adk.tools.base_tool import BaseTool
    from google.adk.tools.base_toolset import BaseToolset

    seen = [] if seen is None else seen
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, str):
        return _text(value)
    if isinstance(value, enum.Enum):
        return describe(value.value, seen, depth)
    if isinstance(value, bytes):
        return {"bytes": hashlib.sha256(value).hexdigest()}
    if depth > _MAX_DEPTH:
        return {"object": qualname(type(value)), "depth": "too deep to describe"}
    if isinstance(value, BaseAgent):
        return _agent(value, seen, depth)
    if isinstance(value, BaseTool):
        return _tool(value, seen, depth)
    if isinstance(value, BaseToolset | BasePlugin):
        return {"name": getattr(value, "name", None), **describe_class(type(value)),
                **_attributes(value, seen, depth, skip=frozenset({"name"}))}
    if isinstance(value, type):
        return describe_class(value)
    if isinstance(value, BaseModel):
        return {**describe_class(type(value)), **_fields(value, seen, depth)}
    if isinstance(value, dict):
        return {str(k): describe(v, seen, depth + 1) for k, v in value.items() if _keep(str(k), v)}
    if isinstance(value, list | tuple):
        return [describe(v, seen, depth + 1) for v in value]
    if isinstance(value, set | frozenset):
        items = [describe(v, seen, depth + 1) for v in value]
        return sorted(items, key=lambda v: json.dumps(v, sort_keys=True, default=str))
    if callable(value):
        return describe_callable(value)
    out = {"object": qualname(type(value))}
    if is_user_code(type(value)):
        out.update(describe_class(type(value)))
        out.update(_attributes(value, seen, depth))
    return out


def _tools(tools: list[Any], seen: list[int], depth: int) -> list[Any]:
    """An agent's ``tools``: a plain function with the declaration ADK makes of it."""
    return [_function_tool(t) if callable(t) and not isinstance(t, type)
            and not hasattr(t, "_get_declaration") else describe(t, seen, depth + 1)
            for t in tools]


def _function_tool(fn: Any) -> dict[str, Any]:
    out = {"tool": getattr(fn, "__name__", None), **describe_callable(fn)}
    if inspect.isfunction(fn) or inspect.ismethod(fn):
        from google.adk.tools.function_tool import FunctionTool

        try:
            declaration = _declaration(FunctionTool(fn))
        except Exception:  # noqa: BLE001 - not a function ADK can wrap: a callback, say
            declaration = None
        if declaration is not None:
            out["declaration"] = declaration
    return out
