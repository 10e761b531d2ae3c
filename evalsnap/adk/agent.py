"""Loading an agent package the way ``adk eval`` does, and its identity."""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.adk.agents.base_agent import BaseAgent
from google.adk.apps.app import App
from google.adk.version import __version__ as ADK_VERSION

from evalsnap import startup
from evalsnap.errors import AgentLoadError, InputFileError
from evalsnap.fingerprint import fingerprint

#: Files that describe the evaluation, not the agent: editing a reference answer
#: must not look like a new agent.
_EVAL_FILE_SUFFIXES = (".evalset.json", ".test.json", ".evalset_result.json")
_SKIP_NAMES = {"test_config.json"}
_SKIP_DIRS = {"__pycache__", ".adk", ".evalsnap", ".git", ".venv", "node_modules"}


@dataclass
class LoadedAgent:
    """An imported agent package."""

    path: Path
    name: str
    root_agent: BaseAgent
    app: App | None
    identity: str
    """Fingerprint of the package files + the resolved agent tree + google-adk version."""


def ensure_importable(agent_dir: str | Path) -> Path:
    """Puts the agent's parent on ``sys.path`` so ``my_agent.metrics.fn`` imports."""
    path = Path(agent_dir).resolve()
    parent = str(path.parent)
    if parent not in sys.path:
        sys.path.insert(0, parent)
    return path


def _files_digest(path: Path) -> str:
    h = hashlib.sha256()
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
        for name in sorted(files):
            if name in _SKIP_NAMES or name.endswith(_EVAL_FILE_SUFFIXES) or name.endswith(".pyc"):
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


def load_agent(agent_dir: str | Path) -> LoadedAgent:
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
    path = ensure_importable(path)
    startup.remember_missing()  # ADK's agent runs retry a missing optional import per call
    try:
        module = importlib.import_module(path.name)
    except Exception as exc:
        raise AgentLoadError(f"importing agent package {path} failed: {exc!r}") from exc
    holder = getattr(module, "agent", module)
    app = getattr(holder, "app", None)
    root: Any
    if isinstance(app, App) and app.root_agent is not None:
        root = app.root_agent
    else:
        app = None
        root = getattr(holder, "root_agent", None)
    if not isinstance(root, BaseAgent):
        raise AgentLoadError(
            f"{path} does not expose `root_agent` (an ADK agent) in agent.py or __init__.py; "
            "define `root_agent = Agent(...)` as `adk eval` expects."
        )
    identity = fingerprint("agent", {
        "files": _files_digest(path), "tree": agent_tree(root), "adk_version": ADK_VERSION,
    })
    return LoadedAgent(path=path, name=path.name, root_agent=root, app=app, identity=identity)
