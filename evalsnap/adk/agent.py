"""Loading an agent package the way ``adk eval`` does, and its identity.

The package is trusted live code, as in ADK. Its folder's ``.env`` is loaded into the
environment first, by ADK's own ``load_dotenv_for_agent`` (the nearest ``.env`` from the agent
folder up; variables set before the first load win; ``ADK_DISABLE_LOAD_DOTENV=1`` skips it).
The identity (:mod:`evalsnap.adk.identity`) holds each non-secret ``.env`` key with a hash of
its value; a secret-named key is left out entirely, and no ``.env`` value is ever written
into a record, a log or an artifact.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import os
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.adk.agents.base_agent import BaseAgent
from google.adk.apps.app import App
from google.adk.cli.utils.envs import load_dotenv_for_agent

from evalsnap import startup
from evalsnap.adk import identity
from evalsnap.adk._describe import describe
from evalsnap.errors import AgentLoadError, InputFileError
from evalsnap.fingerprint import fingerprint

#: Files that describe the evaluation, not the agent: editing a reference answer
#: must not look like a new agent. (An old test file's initial session is a case input,
#: in the inference fingerprint through the case's ``session_input``.)
_EVAL_FILE_SUFFIXES = (".evalset.json", ".test.json", ".evalset_result.json")
_SKIP_NAMES = {"test_config.json", "initial.session.json"}
_SKIP_DIRS = {"__pycache__", ".adk", ".evalsnap", ".git", ".venv", "node_modules"}
#: Files that hold credentials: never part of the identity (see :func:`files_manifest`).
_SECRET_FILES = frozenset({".env", ".envrc", ".netrc", ".pypirc", ".npmrc", ".pgpass",
                           ".git-credentials"})


@dataclass
class LoadedAgent:
    """An imported agent package."""

    path: Path
    name: str
    root_agent: BaseAgent
    app: App | None
    base_manifest: dict[str, Any]
    """What the agent is, before the config's declarations (:mod:`evalsnap.adk.identity`):
    package files, the resolved agent tree and App, the ``.env`` values, versions (+ the
    selected sub-agent's name); for a LangGraph agent the graph's structure instead of the
    tree (:mod:`evalsnap.langgraph.identity`)."""
    framework: str = "adk"
    """``adk``, or ``langgraph`` (then ``root_agent`` is a named placeholder and ``graph`` runs)."""
    graph: Any = None
    """The compiled LangGraph graph of a ``langgraph`` agent."""
    _identities: dict[Any, tuple[dict[str, Any], str]] = field(
        default_factory=dict, repr=False, compare=False)

    def _resolved(self) -> tuple[dict[str, Any], str]:
        declared = identity.declared_inputs()
        if declared not in self._identities:
            manifest = dict(self.base_manifest)
            if declared:
                manifest["declared"] = identity.resolve_declared(list(declared))
            self._identities[declared] = manifest, fingerprint("agent", manifest)
        return self._identities[declared]

    @property
    def manifest(self) -> dict[str, Any]:
        """The identity manifest (no secret values): stored with every inference."""
        return self._resolved()[0]

    @property
    def identity(self) -> str:
        """The fingerprint of :attr:`manifest`: the agent part of the inference key."""
        return self._resolved()[1]


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


def files_manifest(path: Path) -> dict[str, str]:
    """Every file of the package that is code or data of the agent, by relative path, with a
    hash of its bytes.

    Left out: eval files (eval sets, ``.test.json``, ``test_config.json``,
    ``initial.session.json``: editing a reference answer is not a new agent), caches, and
    secret files: ``.env`` (and ``.env.*``, ``.envrc``, ``.netrc``, ``.pypirc``, ``.npmrc``,
    ``.pgpass``, ``.git-credentials``) are never read here. The non-secret values of the
    ``.env`` ADK loads are in the identity by key (:func:`evalsnap.adk.identity.dotenv_values_of`),
    so rotating an API key reruns nothing while a scenario switch does.
    """
    out: dict[str, str] = {}
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
            out[file.relative_to(path).as_posix()] = identity.file_hash(data)
    return out


def agent_tree(agent: BaseAgent) -> dict[str, Any]:
    """The resolved agent tree (:mod:`evalsnap.adk._describe`)."""
    tree: dict[str, Any] = describe(agent)
    return tree


def app_summary(app: App | None) -> dict[str, Any] | None:
    """The App around the agent: its name, plugins and configs (its root is the tree)."""
    if app is None:
        return None
    out: dict[str, Any] = {"name": app.name, "plugins": [describe(p) for p in app.plugins]}
    for name in sorted(type(app).model_fields):
        if name not in ("name", "root_agent", "plugins"):
            value = describe(getattr(app, name, None))
            if value is not None:
                out[name] = value
    return out


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
    app_of_root = app
    selected = root if agent_name is None else _find_sub_agent(root, agent_name, path)
    if app is not None and selected is not root:
        app = app.model_copy(update={"root_agent": selected})
    return LoadedAgent(path=path, name=path.name, root_agent=selected, app=app,
                       base_manifest=base_manifest(path, root, app_of_root,
                                                   None if selected is root else agent_name))


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


def base_manifest(path: Path, root: BaseAgent, app: App | None,
                  agent_name: str | None) -> dict[str, Any]:
    """The whole tree (a sub-agent can transfer to its parent and peers) and, when a
    sub-agent is selected, its name."""
    manifest: dict[str, Any] = {
        "framework": "adk", "files": files_manifest(path), "env": identity.dotenv_values_of(path),
        "tree": agent_tree(root), "app": app_summary(app), "versions": identity.versions(),
    }
    if agent_name is not None:
        manifest["agent_name"] = agent_name
    return manifest
