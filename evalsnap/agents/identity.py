"""An agent's identity: what it is, as a manifest that is stored and a fingerprint of it.

The manifest (JSON data, no secret values) holds

* ``files``: every file of the agent package that is code or data of the agent, by path,
  with a hash of its bytes (eval files, caches and credential files left out);
* what the framework's lane adds: for ADK the resolved agent ``tree``
  (:mod:`evalsnap.adk._describe`) and the ``app``; for LangGraph the ``graph``'s structure
  (:mod:`evalsnap.langgraph.identity`);
* ``env``: every non-secret key of the ``.env`` ADK loads for the agent, with a hash of the
  value the agent sees (a secret-named key is left out entirely: rotating it reruns nothing);
* ``declared``: what the config's ``evalsnapIdentity`` adds (``env`` variables and ``files``
  from outside the package), the same way;
* the google-adk and Python versions (bytecode is per Python version).

The identity is the fingerprint of that manifest, so the stored manifest proves it, and
two manifests say what changed (:func:`changes`).
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evalsnap.agents.code import is_secret_name
from evalsnap.errors import ConfigError, InputFileError

__all__ = ["DeclaredInputs", "changes", "declare", "declared_inputs", "dotenv_values_of",
           "file_hash", "forget_declared", "is_secret_name", "read_declared", "resolve_declared"]

CONFIG_KEY = "evalsnapIdentity"
_FORMAT = (f'"{CONFIG_KEY}": {{"env": ["MY_VAR"], "files": ["../prompts/*.md"]}} (variables '
           "the agent reads from the environment, files it reads from outside its package, "
           "relative to the config file)")
_VAR = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def file_hash(data: bytes) -> str:
    """A file's bytes, short: a manifest lists every file of the package."""
    return hashlib.sha256(data).hexdigest()[:32]


def _value_hash(key: str, value: str | None) -> str | None:
    return None if value is None else hashlib.sha256(
        f"{key}\0{value}".encode()).hexdigest()[:32]


# ---- the .env ADK loads -----------------------------------------------------------------------

def dotenv_values_of(path: Path) -> dict[str, str | None]:
    """The non-secret keys of the ``.env`` ADK loads for the agent at ``path`` (the nearest
    one from the agent folder up), each with a hash of the value the agent sees (the
    environment's: a variable set before ADK's load wins, as in ADK); none when
    ``ADK_DISABLE_LOAD_DOTENV`` is on, since ADK then loads nothing."""
    from dotenv import dotenv_values
    from google.adk.cli.utils.envs import _walk_to_root_until_found
    from google.adk.utils.env_utils import is_env_enabled

    if is_env_enabled("ADK_DISABLE_LOAD_DOTENV"):
        return {}
    found = _walk_to_root_until_found(str(path.resolve()), ".env")
    if not found:
        return {}
    keys = dotenv_values(found).keys()
    return {k: _value_hash(k, os.environ.get(k)) for k in sorted(keys) if not is_secret_name(k)}


# ---- what the config declares -----------------------------------------------------------------

@dataclass(frozen=True)
class DeclaredInputs:
    """``evalsnapIdentity`` of one config: variables and file patterns (with their base)."""

    env: tuple[str, ...] = ()
    files: tuple[tuple[str, str], ...] = ()
    """(pattern as written, directory it is relative to)."""


def read_declared(raw: dict[str, Any], where: str) -> DeclaredInputs | None:
    """The config's ``evalsnapIdentity``, checked: a bad entry is a ConfigError naming it."""
    table = raw.get(CONFIG_KEY)
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: `{CONFIG_KEY}` must be an object, as in {_FORMAT}.")
    unknown = sorted(set(table) - {"env", "files"})
    if unknown:
        raise ConfigError(f"{where}: `{CONFIG_KEY}.{unknown[0]}` is not a key evalsnap reads; "
                          f"write {_FORMAT}.")
    env, files = table.get("env", []), table.get("files", [])
    for key, entries in (("env", env), ("files", files)):
        if not isinstance(entries, list) or not all(isinstance(e, str) and e.strip()
                                                    for e in entries):
            raise ConfigError(f"{where}: `{CONFIG_KEY}.{key}` must be a list of non-empty "
                              f"strings, as in {_FORMAT}.")
    for name in env:
        if not _VAR.match(name):
            raise ConfigError(f"{where}: `{CONFIG_KEY}.env` entry {name!r} is not an "
                              "environment variable name (letters, digits and _).")
        if is_secret_name(name):
            raise ConfigError(f"{where}: `{CONFIG_KEY}.env` entry {name!r} names a secret; "
                              "secrets are never part of the identity (rotating a key reruns "
                              "nothing): remove it.")
    base = str(Path(where).resolve().parent) if Path(where).is_file() else os.getcwd()
    declared = DeclaredInputs(env=tuple(env), files=tuple((f, base) for f in files))
    for pattern, _ in declared.files:
        if not _matches(pattern, base):
            raise ConfigError(f"{where}: `{CONFIG_KEY}.files` entry {pattern!r} matches no file "
                              f"(relative to {base}); fix the path or remove the entry.")
    return declared


def _matches(pattern: str, base: str) -> list[Path]:
    full = pattern if os.path.isabs(pattern) else os.path.join(base, pattern)
    return sorted(Path(p) for p in glob.glob(full, recursive=True) if os.path.isfile(p))


def resolve_declared(declared: list[DeclaredInputs]) -> dict[str, Any]:
    """The ``declared`` part of a manifest: each variable's value hash and each file's hash,
    files named as matched relative to the config (so a copied project hashes the same)."""
    env: dict[str, str | None] = {}
    files: dict[str, str] = {}
    for item in declared:
        for name in item.env:
            env[name] = _value_hash(name, os.environ.get(name))
        for pattern, base in item.files:
            for file in _matches(pattern, base):
                try:
                    data = file.read_bytes()
                except OSError as exc:
                    raise InputFileError(f"cannot read {file}, declared in `{CONFIG_KEY}.files` "
                                         f"({exc}); make it readable or remove the entry.") from exc
                files[os.path.relpath(file, base)] = file_hash(data)
    return {"env": dict(sorted(env.items())), "files": dict(sorted(files.items()))}


_lock = threading.Lock()
_declared: list[DeclaredInputs] = []


def declare(inputs: DeclaredInputs) -> None:
    """Adds a resolved config's declarations to this process's agent identities.

    The agent is loaded before the config (it may register what the config names), so
    a config's declarations join every identity computed afterwards in this process: a
    process that resolves several configs takes all of them, which can only rerun more.
    """
    with _lock:
        if inputs not in _declared:
            _declared.append(inputs)


def declared_inputs() -> tuple[DeclaredInputs, ...]:
    with _lock:
        return tuple(_declared)


def forget_declared() -> None:
    """Forgets every declaration (for a process that runs several unrelated commands, such
    as a test running the CLI in its own process)."""
    with _lock:
        _declared.clear()


def versions() -> dict[str, str]:
    from google.adk.version import __version__ as adk_version

    return {"google-adk": adk_version, "python": f"{sys.version_info[0]}.{sys.version_info[1]}"}


# ---- what changed -----------------------------------------------------------------------------

def _label(item: Any, index: int) -> str:
    if isinstance(item, dict):
        for key in ("agent", "tool", "name", "callable", "class"):
            if isinstance(item.get(key), str):
                return item[key]
    return str(index)


def _walk(a: Any, b: Any, path: list[str], out: list[list[str]]) -> None:
    if a == b:
        return
    if isinstance(a, dict) and isinstance(b, dict):
        if {"callable", "code"} <= a.keys() and a.get("callable") == b.get("callable"):
            out.append([*path, "code"])
            return
        for key in sorted(set(a) | set(b)):
            _walk(a.get(key), b.get(key), [*path, key], out)
        return
    if isinstance(a, list) and isinstance(b, list):
        la = {_label(x, i): x for i, x in enumerate(a)}
        lb = {_label(x, i): x for i, x in enumerate(b)}
        if len(la) == len(a) and len(lb) == len(b):
            for key in list(la) + [k for k in lb if k not in la]:
                _walk(la.get(key), lb.get(key), [*path, f"[{key}]"], out)
            if list(la) != list(lb) and set(la) == set(lb):
                out.append([*path, "order"])
            return
    out.append(path)


def _tree_change(path: list[str], a: Any, b: Any) -> str:
    """``place_agent.instruction``, ``root.tools[map_tool] code``: the agent nearest to the
    change, then the field path under it."""
    node = a if a is not None else b
    agent = node["agent"] if isinstance(node, dict) and isinstance(node.get("agent"), str) else ""
    rest: list[str] = []
    nodes: list[Any] = [a, b]
    for segment in path:
        nodes = [n.get(segment) if isinstance(n, dict) else
                 _by_label(n, segment) if isinstance(n, list) else None for n in nodes]
        node = next((n for n in nodes if n is not None), None)
        if isinstance(node, dict) and isinstance(node.get("agent"), str):
            agent, rest = node["agent"], []
            continue
        if segment.startswith("[") and rest and rest[-1] == "sub_agents":
            rest = rest[:-1]
        rest.append(segment)
    text = ".".join(rest).replace(".[", "[").replace(".code", " code")
    if text.endswith(".order"):
        text = text[:-len(".order")] + " order"
    return f"{agent}.{text}" if agent and text else agent or text


def _by_label(items: list[Any], segment: str) -> Any:
    key = segment[1:-1]
    return next((x for i, x in enumerate(items) if _label(x, i) == key), None)


def changes(a: dict[str, Any] | None, b: dict[str, Any] | None, limit: int = 20) -> list[str]:
    """What differs between two identity manifests, in words (names, never values)."""
    if a is None or b is None:
        return [] if a == b else ["agent identity not recorded for the earlier inference"]
    out: list[str] = []
    for key in ("google-adk", "python"):
        if (a.get("versions") or {}).get(key) != (b.get("versions") or {}).get(key):
            out.append(f"{key} version {a['versions'].get(key)} → {b['versions'].get(key)}")
    if a.get("framework") != b.get("framework"):
        out.append(f"framework {a.get('framework')} → {b.get('framework')}")
    if a.get("agent_name") != b.get("agent_name"):
        out.append(f"evaluated agent {a.get('agent_name')} → {b.get('agent_name')}")
    for part, label in (("env", ".env"), ("files", "file")):
        out += _keyed(a.get(part) or {}, b.get(part) or {}, label)
    da, db = a.get("declared") or {}, b.get("declared") or {}
    out += _keyed(da.get("env") or {}, db.get("env") or {}, "declared env")
    out += _keyed(da.get("files") or {}, db.get("files") or {}, "declared file")
    for part in ("tree", "app", "graph"):
        found: list[list[str]] = []
        _walk(a.get(part), b.get(part), [], found)
        prefix = "app: " if part == "app" else ""
        out += [prefix + (_tree_change(p, a.get(part), b.get(part)) or part) for p in found]
    if not out and a != b:
        out.append("agent identity")
    seen: list[str] = []
    for item in out:
        if item not in seen:
            seen.append(item)
    return seen if len(seen) <= limit else [*seen[:limit], f"… and {len(seen) - limit} more"]


def _keyed(a: dict[str, Any], b: dict[str, Any], label: str) -> list[str]:
    out = []
    for key in sorted(set(a) | set(b)):
        if a.get(key) != b.get(key):
            what = "" if key in a and key in b else " added" if key in b else " removed"
            out.append(f"{label} {key}{what}")
    return out
