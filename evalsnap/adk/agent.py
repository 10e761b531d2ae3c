"""Loading an agent package the way ``adk eval`` does, and its identity.

The package is trusted live code, as in ADK. Its folder's ``.env`` is loaded into the
environment first, by ADK's own ``load_dotenv_for_agent`` (the nearest ``.env`` from the agent
folder up; variables set before the first load win; ``ADK_DISABLE_LOAD_DOTENV=1`` skips it).
The identity (:mod:`evalsnap.agents.identity`) holds each non-secret ``.env`` key with a hash of
its value; a secret-named key is left out entirely, and no ``.env`` value is ever written
into a record, a log or an artifact.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from google.adk.agents.base_agent import BaseAgent
from google.adk.apps.app import App
from google.adk.cli.utils.envs import load_dotenv_for_agent

from evalsnap import startup
from evalsnap.adk._describe import describe
from evalsnap.agents import identity
from evalsnap.agents.base import LoadedAgent, ensure_importable, files_manifest
from evalsnap.errors import AgentLoadError, InputFileError

#: What ``adk eval`` looks for in the package's ``agent`` module (or the package), in its order.
ADK_NAMES = ("app", "root_agent", "get_agent_async")


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


def exposes_agent(*modules: Any) -> bool:
    """Whether a module exposes one of ADK's entry points (:data:`ADK_NAMES`)."""
    return any(getattr(m, n, None) is not None for m in modules for n in ADK_NAMES)


def import_package(agent_dir: str | Path) -> tuple[Any, ...]:
    """Imports the agent package as :func:`load_agent` does (its ``.env`` first): the module
    holding the agent and the package (the modules that may expose an entry point)."""
    return _imported(_package_dir(agent_dir))


def _imported(path: Path) -> tuple[Any, ...]:
    load_dotenv_for_agent(path.name, str(path.parent))
    return _import_package(path), sys.modules.get(path.name)


def load_agent(agent_dir: str | Path, agent_name: str | None = None,
               imported: tuple[Any, ...] | None = None) -> LoadedAgent:
    """Imports an ADK agent package as ``adk eval`` does (which lane an agent dir is:
    :func:`evalsnap.agents.lanes.load_agent`).

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

    ``imported``: what :func:`import_package` returned for this dir, when the dispatcher
    imported the package already (to detect its framework).
    """
    path = _package_dir(agent_dir)
    holder = (imported or _imported(path))[0]
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
        from evalsnap.agents.lanes import missing_extra

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
