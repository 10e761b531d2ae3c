"""Loading an agent package the way ``adk eval`` does, and its identity.

The package is trusted live code, as in ADK. Its folder's ``.env`` is loaded into the
environment first, by ADK's own ``load_dotenv_for_agent`` (the nearest ``.env`` from the agent
folder up; variables set before the first load win; ``ADK_DISABLE_LOAD_DOTENV=1`` skips it).
evalsnap never reads ``.env`` itself, never hashes it and writes none of its values into a
record, a log or an artifact: what the agent does with them is the agent's.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import inspect
import os
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.adk.agents.base_agent import BaseAgent
from google.adk.apps.app import App
from google.adk.cli.utils.envs import load_dotenv_for_agent
from google.adk.version import __version__ as ADK_VERSION

from evalsnap import startup
from evalsnap.errors import AgentLoadError, InputFileError
from evalsnap.fingerprint import fingerprint

#: Files that describe the evaluation, not the agent: editing a reference answer
#: must not look like a new agent. (An old test file's initial session is a case input,
#: in the inference fingerprint through the case's ``session_input``.)
_EVAL_FILE_SUFFIXES = (".evalset.json", ".test.json", ".evalset_result.json")
_SKIP_NAMES = {"test_config.json", "initial.session.json"}
_SKIP_DIRS = {"__pycache__", ".adk", ".evalsnap", ".git", ".venv", "node_modules"}
#: Files that hold credentials: never part of the identity (see :func:`_files_digest`).
_SECRET_FILES = frozenset({".env", ".envrc", ".netrc", ".pypirc", ".npmrc", ".pgpass",
                           ".git-credentials"})


@dataclass
class LoadedAgent:
    """An imported agent package."""

    path: Path
    name: str
    root_agent: BaseAgent
    app: App | None
    identity: str
    """Fingerprint of the package files (secrets excluded) + the resolved agent tree +
    google-adk version (+ the selected sub-agent's name); for a LangGraph agent, the files +
    the graph's structure (:mod:`evalsnap.langgraph.identity`)."""
    framework: str = "adk"
    """``adk``, or ``langgraph`` (then ``root_agent`` is a named placeholder and ``graph`` runs)."""
    graph: Any = None
    """The compiled LangGraph graph of a ``langgraph`` agent."""


def ensure_importable(agent_dir: str | Path) -> Path:
    """Puts the agent's parent on ``sys.path`` so ``my_agent.metrics.fn`` imports."""
    path = Path(agent_dir).resolve()
    parent = str(path.parent)
    if parent not in sys.path:
        sys.path.insert(0, parent)
    return path


def _is_secret_file(name: str) -> bool:
    """``.env``, ``.env.<anything>`` (``.env.local``…) and the other credential dotfiles."""
    return name in _SECRET_FILES or name.startswith(".env.")


def _skipped_file(name: str) -> bool:
    return (name in _SKIP_NAMES or name.endswith(_EVAL_FILE_SUFFIXES) or name.endswith(".pyc")
            or _is_secret_file(name))


def _files_digest(path: Path) -> str:
    """Hash of every file of the package that is code or data of the agent.

    Left out: eval files (eval sets, ``.test.json``, ``test_config.json``,
    ``initial.session.json``: editing a reference answer is not a new agent), caches, and
    secret files: ``.env`` (and ``.env.*``, ``.envrc``, ``.netrc``, ``.pypirc``, ``.npmrc``,
    ``.pgpass``, ``.git-credentials``) are never read here, so rotating an API key does not
    make the agent look new and does not rerun inference. A ``.env`` value still counts where
    it shapes the agent: a model name or instruction read at import is in the resolved agent
    tree (:func:`agent_tree`), which is part of the identity. A value used only at call time
    (a key, an endpoint) is not: after switching an endpoint, run without ``--reuse``.
    A package without any of these files hashes as it always did.
    """
    h = hashlib.sha256()
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
        for name in sorted(files):
            if _skipped_file(name):
                continue
            file = Path(root, name)
            try:
                data = file.read_bytes()
            except OSError as exc:
                raise InputFileError(
                    f"cannot read {file} in agent dir {path} ({exc}); every file of the agent "
                    "package is part of its identity: make it readable or move it out."
                ) from exc
            h.update(str(file.relative_to(path)).encode() + b"\0")
            h.update(hashlib.sha256(data).digest())
    return "sha256:" + h.hexdigest()


def _tool_summary(tool: Any) -> dict[str, Any]:
    name = getattr(tool, "name", None) or getattr(tool, "__name__", type(tool).__name__)
    decl = None
    get_decl = getattr(tool, "_get_declaration", None)
    if callable(get_decl):
        try:
            d = get_decl()
            decl = d.model_dump(mode="json", exclude_none=True) if d is not None else None
        except Exception:  # a tool that cannot declare itself still has a name
            decl = None
    return {"name": name, "description": getattr(tool, "description", None), "declaration": decl}


def agent_tree(agent: BaseAgent) -> dict[str, Any]:
    """Names, models, instructions and tool declarations, recursively."""
    model = getattr(agent, "model", None)
    instruction = getattr(agent, "instruction", None)
    return {
        "name": agent.name,
        "class": f"{type(agent).__module__}.{type(agent).__qualname__}",
        "model": model if isinstance(model, str) else getattr(model, "model", type(model).__name__)
        if model is not None else None,
        "instruction": instruction if isinstance(instruction, str) else repr(instruction),
        "tools": [_tool_summary(t) for t in getattr(agent, "tools", []) or []],
        "sub_agents": [agent_tree(a) for a in agent.sub_agents],
    }


def load_agent(agent_dir: str | Path, agent_name: str | None = None,
               framework: str | None = None) -> LoadedAgent:
    """Imports an agent package as ``adk eval`` does.

    ``framework`` (``--framework``): ``adk`` or ``langgraph`` forces one; None detects it: a
    dir with ``langgraph.json``, or a package exposing ``graph`` and no ADK agent, is a
    LangGraph agent (:mod:`evalsnap.langgraph.loader`).

    The package's ``agent`` module (or the package itself) exposes one of, in ``adk eval``'s
    order: ``app`` (an ADK ``App``), ``root_agent``, or ``get_agent_async`` (an async function
    returning ``(root_agent, exit_stack)``, as ADK awaits it; a bare agent is accepted too).
    ``get_agent_async`` runs on its own event loop in a fresh thread, so this function may be
    called where a loop is already running (inside a Prefect task). As in ADK, the exit stack
    is not closed.

    ``agent_name`` (``AgentEvaluator.evaluate``'s): evaluate the agent of that name found
    anywhere in the tree (``root_agent.find_agent``) instead of the root; its name joins the
    identity (naming the root itself changes nothing). With an ``app``,
    ``.app`` is then a copy of it whose ``root_agent`` is that agent, which is the runner ADK
    builds for it, so the App's plugins and configs still apply.
    """
    from evalsnap.langgraph import loader as langgraph_loader

    framework = langgraph_loader.check_framework(framework)
    if framework == "langgraph" or (framework is None and langgraph_loader.has_config(agent_dir)):
        return langgraph_loader.load_agent(agent_dir, agent_name)
    path = _package_dir(agent_dir)
    load_dotenv_for_agent(path.name, str(path.parent))
    holder = _import_package(path)
    if framework is None and langgraph_loader.exposes_graph(holder, sys.modules.get(path.name)):
        return langgraph_loader.load_agent(agent_dir, agent_name)
    app, root = _app_and_root(holder, path)
    selected = root if agent_name is None else _find_sub_agent(root, agent_name, path)
    if app is not None and selected is not root:
        app = app.model_copy(update={"root_agent": selected})
    return LoadedAgent(path=path, name=path.name, root_agent=selected, app=app,
                       identity=_identity(path, root, None if selected is root else agent_name))


def _package_dir(agent_dir: str | Path) -> Path:
    path = Path(agent_dir)
    if not path.is_dir():
        raise InputFileError(
            f"agent dir {path} does not exist; pass the directory of an ADK agent package."
        )
    if not (path / "__init__.py").is_file():
        raise AgentLoadError(
            f"{path} is not a Python package (no __init__.py); an ADK agent dir has "
            "__init__.py importing agent.py, which defines root_agent."
        )
    return ensure_importable(path)


def _import_package(path: Path) -> Any:
    """The module holding the agent: the package's ``agent`` member, else the package."""
    startup.remember_missing()  # ADK's agent runs retry a missing optional import per call
    try:
        module = importlib.import_module(path.name)
    except Exception as exc:
        from evalsnap.langgraph.loader import missing_extra

        raise (missing_extra(path, exc)
               or AgentLoadError(f"importing agent package {path} failed: {exc!r}")) from exc
    return getattr(module, "agent", module)


def _app_and_root(holder: Any, path: Path) -> tuple[App | None, BaseAgent]:
    app = getattr(holder, "app", None)
    if isinstance(app, App) and app.root_agent is not None:
        if not isinstance(app.root_agent, BaseAgent):
            raise AgentLoadError(
                f"{path}: `app.root_agent` is a {type(app.root_agent).__name__}, not an ADK "
                "agent; evalsnap evaluates agents (BaseAgent): make an Agent the App's root."
            )
        return app, app.root_agent
    root = getattr(holder, "root_agent", None)
    if root is None:
        factory = getattr(holder, "get_agent_async", None)
        if callable(factory):
            root = _agent_from_factory(factory, path)
    if not isinstance(root, BaseAgent):
        raise AgentLoadError(
            f"{path} does not expose `root_agent` (an ADK agent), `app` (an ADK App) or "
            "`get_agent_async` in agent.py or __init__.py; define `root_agent = Agent(...)` "
            "as `adk eval` expects."
        )
    return None, root


def _agent_from_factory(factory: Callable[[], Any], path: Path) -> BaseAgent:
    """Awaits ``get_agent_async()`` on a new event loop in a new thread."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="evalsnap-get-agent") as pool:
        future = pool.submit(asyncio.run, _awaited(factory, path))
        try:
            result = future.result()
        except AgentLoadError:
            raise
        except Exception as exc:  # the user's own code: any failure is a load failure
            raise AgentLoadError(f"get_agent_async() of {path} failed: {exc!r}") from exc
    agent = result[0] if isinstance(result, tuple) and len(result) == 2 else result
    if not isinstance(agent, BaseAgent):
        raise AgentLoadError(
            f"get_agent_async() of {path} returned a {type(result).__name__}; return "
            "`(root_agent, exit_stack)` as ADK expects (exit_stack may be None)."
        )
    return agent


async def _awaited(factory: Callable[[], Any], path: Path) -> Any:
    result = factory()
    if not inspect.isawaitable(result):
        raise AgentLoadError(
            f"{path}: get_agent_async is not an async function (it returned a "
            f"{type(result).__name__}); define it `async def get_agent_async():` as ADK awaits it."
        )
    return await result


def _agent_names(agent: BaseAgent) -> list[str]:
    return [agent.name, *(n for sub in agent.sub_agents for n in _agent_names(sub))]


def _find_sub_agent(root: BaseAgent, agent_name: str, path: Path) -> BaseAgent:
    found = root.find_agent(agent_name)
    if found is None:
        raise AgentLoadError(
            f"{path} has no agent named {agent_name!r} in its tree; choose one of "
            f"{', '.join(_agent_names(root))}, or leave the agent name out to evaluate the root."
        )
    return found


def _identity(path: Path, root: BaseAgent, agent_name: str | None) -> str:
    """The whole tree (a sub-agent can transfer to its parent and peers) and, when a sub-agent
    is selected, its name; for the root itself, the key is what it always was."""
    key: dict[str, Any] = {
        "files": _files_digest(path), "tree": agent_tree(root), "adk_version": ADK_VERSION,
    }
    if agent_name is not None:
        key["agent_name"] = agent_name
    return fingerprint("agent", key)
