"""The identity of a LangGraph agent: its package files and its graph's structure.

Structure = nodes (with the callable each runs: qualified name and code hash), edges, tools
(name, description, argument schema, function code), the chat models the nodes reference
(class, identifying parameters, bound tools), state channels, subgraphs recursively, and the
LangGraph / LangChain versions. As for ADK agents (:mod:`evalsnap.agents.identity`), the
manifest also holds the non-secret ``.env`` values and what the config declares. Editing a
tool or a node changes it (the files, the schema or both); editing an eval set does not.
"""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path
from typing import Any

from evalsnap.agents import identity
from evalsnap.agents.base import files_manifest
from evalsnap.agents.code import describe_callable
from evalsnap.fingerprint import fingerprint


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', None) or type(obj).__module__}." \
           f"{getattr(obj, '__qualname__', None) or type(obj).__qualname__}"


def _jsonable(value: Any) -> Any:
    """JSON data as is; anything else by its type only (a repr may hold a memory address)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return f"<{_qualname(type(value))}>"


def tool_summary(tool: Any) -> dict[str, Any]:
    schema = getattr(tool, "tool_call_schema", None)
    try:
        render = getattr(schema, "model_json_schema", None)
        args = render() if callable(render) else schema
    except Exception:  # a schema pydantic cannot render still has a name and description
        args = None
    func = getattr(tool, "func", None) or getattr(tool, "coroutine", None)
    return {"name": getattr(tool, "name", None), "description": getattr(tool, "description", None),
            "args_schema": _jsonable(args), "class": _qualname(type(tool)),
            "func": describe_callable(func) if func is not None else None}


def _model_summary(model: Any) -> dict[str, Any] | None:
    """A chat model (or a binding of one, ``bind_tools``) as far as LangChain describes it."""
    from langchain_core.language_models import BaseLanguageModel
    from langchain_core.runnables import RunnableBinding

    kwargs: dict[str, Any] = {}
    while isinstance(model, RunnableBinding):
        kwargs = {**dict(model.kwargs), **kwargs}
        model = model.bound
    if not isinstance(model, BaseLanguageModel):
        return None
    try:
        params = dict(model._identifying_params)  # noqa: SLF001 - LangChain's own identity of a model
    except Exception:
        params = {}
    return {"class": _qualname(type(model)), "params": _jsonable(params), "bound": _jsonable(kwargs)}


def _node_callable(runnable: Any) -> Any:
    return getattr(runnable, "func", None) or getattr(runnable, "afunc", None)


def _referenced_models(func: Any) -> list[dict[str, Any]]:
    """Chat models a node function names: globals it reads and cells it closes over."""
    code = getattr(func, "__code__", None)
    if code is None:
        return []
    candidates = [func.__globals__.get(n) for n in code.co_names]
    candidates += [c.cell_contents for c in getattr(func, "__closure__", None) or ()
                   if _cell_is_set(c)]
    found = [_model_summary(c) for c in candidates]
    return [m for m in found if m is not None]


def _cell_is_set(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - an empty cell raises ValueError
    except ValueError:
        return False
    return True


def graph_structure(graph: Any) -> dict[str, Any]:
    """Nodes, edges, tools, chat models, channels and subgraphs of a compiled graph."""
    from langgraph.prebuilt import ToolNode

    drawable = graph.get_graph()
    nodes, tools, models = [], [], []
    for node_id in drawable.nodes:
        spec = graph.nodes.get(node_id)
        runnable = getattr(spec, "bound", None)
        func = _node_callable(runnable)
        nodes.append({"id": node_id, "runs": describe_callable(func) if func is not None
                      else _qualname(runnable) if runnable is not None else None})
        if isinstance(runnable, ToolNode):
            tools += [{"node": node_id, **tool_summary(t)} for t in runnable.tools_by_name.values()]
        models += [{"node": node_id, **m} for m in _referenced_models(func)]
    edges = [{"source": e.source, "target": e.target, "conditional": e.conditional,
              "data": _jsonable(e.data)} for e in drawable.edges]
    return {
        "name": graph.get_name(), "class": _qualname(type(graph)), "nodes": nodes, "edges": edges,
        "tools": tools, "models": models, "channels": list(graph.stream_channels_list),
        "checkpointer": _qualname(type(graph.checkpointer)) if graph.checkpointer else None,
        "subgraphs": {name: graph_structure(sub) for name, sub in graph.get_subgraphs()},
    }


def graph_manifest(path: Path, graph: Any, graph_name: str | None) -> dict[str, Any]:
    """The package files (secrets and eval files excluded, as for ADK agents), the ``.env``
    values, the graph's structure, the selected langgraph.json graph, library versions."""
    structure = json.loads(json.dumps(graph_structure(graph), sort_keys=True))
    return {
        "framework": "langgraph", "files": files_manifest(path),
        "env": identity.dotenv_values_of(path), "graph": structure, "graph_name": graph_name,
        "versions": {**identity.versions(),
                     **{d: _version(d) for d in ("langgraph", "langchain-core")}},
    }


def graph_identity(path: Path, graph: Any, graph_name: str | None) -> str:
    """Fingerprint of :func:`graph_manifest` (the agent's identity without declared inputs)."""
    return fingerprint("agent", graph_manifest(path, graph, graph_name))
