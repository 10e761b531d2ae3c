"""Detecting a LangGraph agent dir and loading its graph.

A dir is a LangGraph agent when it holds a ``langgraph.json`` (the LangGraph CLI's file:
``{"graphs": {"name": "./agent.py:graph"}}``) or when its package exposes ``graph`` and no
ADK agent (``app``, ``root_agent``, ``get_agent_async``: the dispatcher,
:mod:`evalsnap.agents.lanes`, decides). ``graph`` may be a compiled graph,
a ``StateGraph`` (compiled here, as the LangGraph CLI does) or a function returning either
(called with no argument, or with an empty ``RunnableConfig``).
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import importlib.util
import inspect
import json
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from google.adk.agents.base_agent import BaseAgent
from google.adk.cli.utils.envs import load_dotenv_for_agent

from evalsnap import startup
from evalsnap.agents.base import LoadedAgent, ensure_importable
from evalsnap.errors import AgentLoadError, InputFileError, UsageError
from evalsnap.langgraph import EXTRA_HINT

CONFIG_FILE = "langgraph.json"
_EXTRA_MODULES = frozenset({"langgraph", "langchain_core"})


def has_config(agent_dir: str | Path) -> bool:
    return (Path(agent_dir) / CONFIG_FILE).is_file()


def exposes_graph(*modules: Any) -> bool:
    """A module that exposes ``graph`` (an ADK agent beside it wins: :mod:`evalsnap.agents.lanes`)."""
    return any(getattr(m, "graph", None) is not None for m in modules)


def missing_extra(path: Path, exc: BaseException) -> AgentLoadError | None:
    """The typed error for an import that failed because LangGraph is not installed."""
    seen: BaseException | None = exc
    while seen is not None:
        root = (getattr(seen, "name", None) or "").split(".")[0]
        if isinstance(seen, ModuleNotFoundError) and root in _EXTRA_MODULES:
            return AgentLoadError(
                f"{path} needs LangGraph, which is not installed (no module {root}); install the "
                f"LangGraph extra: {EXTRA_HINT}")
        seen = seen.__cause__ or seen.__context__
    return None


def _require_langgraph(path: Path) -> None:
    try:
        importlib.import_module("langgraph.pregel")
    except ImportError as exc:
        raise (missing_extra(path, exc) or AgentLoadError(
            f"{path} is a LangGraph agent, but importing LangGraph failed ({exc!r}); "
            f"reinstall the LangGraph extra: {EXTRA_HINT}")) from exc


def _import(module_name: str, path: Path) -> Any:
    startup.remember_missing()
    try:
        return importlib.import_module(module_name)
    except Exception as exc:
        raise (missing_extra(path, exc) or AgentLoadError(
            f"importing {module_name} of LangGraph agent {path} failed: {exc!r}")) from exc


def load_agent(agent_dir: str | Path, agent_name: str | None = None) -> LoadedAgent:
    """The LangGraph agent of ``agent_dir``; ``agent_name`` picks a graph of ``langgraph.json``."""
    if not Path(agent_dir).is_dir():
        raise InputFileError(f"agent dir {agent_dir} does not exist; pass the directory of an agent "
                             "package (exposing `graph`) or of a langgraph.json.")
    path = ensure_importable(agent_dir)
    _require_langgraph(path)
    load_dotenv_for_agent(path.name, str(path.parent))
    if has_config(path):
        graph_name, found = _from_config(path, agent_name)
    else:
        graph_name, found = None, _from_package(path, agent_name)
    graph = _compiled(found, path)
    from evalsnap.langgraph.identity import graph_manifest

    return LoadedAgent(path=path, name=path.name, root_agent=BaseAgent(name=_agent_name(graph, graph_name, path)),
                       app=None, base_manifest=graph_manifest(path, graph, graph_name),
                       framework="langgraph", graph=graph)


def _from_package(path: Path, agent_name: str | None) -> Any:
    if not (path / "__init__.py").is_file():
        raise AgentLoadError(f"{path} is not a Python package (no __init__.py) and has no {CONFIG_FILE}; "
                             "a LangGraph agent dir exposes `graph` from __init__.py or agent.py.")
    if agent_name is not None:
        raise UsageError(f"--agent-name {agent_name!r}: a LangGraph package has one `graph`; agent "
                         f"names select a graph of {CONFIG_FILE}. Leave --agent-name out.")
    package = _import(path.name, path)
    holder = getattr(package, "agent", package)
    found = getattr(holder, "graph", None) or getattr(package, "graph", None)
    if found is None:
        raise AgentLoadError(f"{path} exposes no `graph` in agent.py or __init__.py; define "
                             "`graph = builder.compile()` (a compiled LangGraph graph).")
    return found


def _read_config(path: Path) -> dict[str, Any]:
    file = path / CONFIG_FILE
    try:
        raw = json.loads(file.read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise AgentLoadError(f"{file} is not readable JSON ({exc}); fix it or remove it.") from exc
    graphs = raw.get("graphs") if isinstance(raw, dict) else None
    if not isinstance(graphs, dict) or not graphs:
        raise AgentLoadError(f"{file} names no graph; add `\"graphs\": {{\"agent\": \"./agent.py:graph\"}}`.")
    return graphs


def _from_config(path: Path, agent_name: str | None) -> tuple[str, Any]:
    graphs = _read_config(path)
    if agent_name is None and len(graphs) > 1:
        raise UsageError(f"{path / CONFIG_FILE} names several graphs ({', '.join(graphs)}); choose one "
                         "with --agent-name.")
    name = agent_name if agent_name is not None else next(iter(graphs))
    if name not in graphs:
        raise AgentLoadError(f"{path / CONFIG_FILE} has no graph named {name!r}; choose one of "
                             f"{', '.join(graphs)}.")
    spec = graphs[name]
    spec = spec.get("path") if isinstance(spec, dict) else spec
    target, _, attr = str(spec or "").rpartition(":")
    if not target or not attr:
        raise AgentLoadError(f"graph {name!r} of {path / CONFIG_FILE} is {spec!r}; write it "
                             "`./file.py:attribute` or `package.module:attribute`.")
    module = _module_of(target, path)
    if not hasattr(module, attr):
        raise AgentLoadError(f"{target} has no attribute {attr!r} (graph {name!r} of {path / CONFIG_FILE}).")
    return name, getattr(module, attr)


def _module_of(target: str, path: Path) -> Any:
    """A ``./file.py`` inside the package imports as its module (relative imports work); any
    other file by location; a dotted name with the config's dir on ``sys.path``."""
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))
    if not (target.endswith(".py") or "/" in target):
        return _import(target, path)
    file = (path / target).resolve()
    if not file.is_file():
        raise InputFileError(f"{file}, named in {path / CONFIG_FILE}, does not exist.")
    if (path / "__init__.py").is_file() and file.is_relative_to(path):
        parts = file.relative_to(path).with_suffix("").parts
        return _import(".".join((path.name, *parts)).removesuffix(".__init__"), path)
    name = "evalsnap_langgraph_" + hashlib.sha256(str(file).encode()).hexdigest()[:12]
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise AgentLoadError(f"{file} cannot be imported as a Python module.")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise (missing_extra(path, exc) or AgentLoadError(f"importing {file} failed: {exc!r}")) from exc
    return module


def _compiled(found: Any, path: Path) -> Any:
    from langgraph.graph import StateGraph
    from langgraph.pregel import Pregel

    if not isinstance(found, Pregel | StateGraph) and callable(found):
        found = _call_factory(found, path)
    if isinstance(found, StateGraph):
        found = found.compile()
    if not isinstance(found, Pregel):
        raise AgentLoadError(f"`graph` of {path} is a {type(found).__name__}, not a LangGraph graph; "
                             "expose `graph = builder.compile()`.")
    return found


def _call_factory(factory: Any, path: Path) -> Any:
    try:
        takes_config = bool(inspect.signature(factory).parameters)
    except (TypeError, ValueError):
        takes_config = False
    try:
        result = factory({}) if takes_config else factory()
        if inspect.isawaitable(result):
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="evalsnap-make-graph") as pool:
                result = pool.submit(asyncio.run, _await(result)).result()
    except Exception as exc:  # the user's own code: any failure is a load failure
        raise AgentLoadError(f"the graph factory of {path} failed: {exc!r}") from exc
    return result


async def _await(awaitable: Any) -> Any:
    return await awaitable


def _agent_name(graph: Any, graph_name: str | None, path: Path) -> str:
    """An identifier for ``agent_name`` of records: the langgraph.json key, the graph's own
    name, else the package's."""
    own = graph.get_name()
    name = graph_name or (own if own and own != "LangGraph" else path.name)
    name = re.sub(r"\W", "_", name)
    name = name if name and not name[0].isdigit() else f"_{name}"
    return name if name != "user" else "user_graph"
