"""The identity of code: what a callable or a class *is*, stably, in every process.

Shared by every framework lane (the ADK agent tree, :mod:`evalsnap.adk._describe`; a
LangGraph graph's nodes and tools, :mod:`evalsnap.langgraph.identity`).

A callable is its qualified name and a hash of its code (:func:`code_digest`): bytecode,
constants, names, argument layout, recursively for nested code, plus what the code reads
from its module and its closure (constants by value, helper functions of the user's own
code by their code). Never a ``repr``, which holds a memory address. Secret-named
variables, keyword defaults and keys (:func:`is_secret_name`) are left out.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import math
import os
import re
import sys
import types
from pathlib import Path
from typing import Any

from pydantic import BaseModel

__all__ = ["code_digest", "describe_callable", "describe_class", "is_secret_name", "is_user_code",
           "qualname"]

_SECRET_SUFFIXES = ("KEY", "KEYS", "TOKEN", "TOKENS", "SECRET", "SECRETS", "PASSWORD",
                    "PASSWORDS", "PASSWD", "CREDENTIAL", "CREDENTIALS")


def is_secret_name(name: str) -> bool:
    """Whether a variable, field or key names a secret (…KEY, …TOKEN, …SECRET, …PASSWORD,
    …CREDENTIAL(S), ``GOOGLE_APPLICATION_CREDENTIALS``): such values are never described."""
    upper = re.sub(r"[^A-Z0-9]", "_", name.upper()).rstrip("_")
    return upper.endswith(_SECRET_SUFFIXES)


def _digest(value: Any) -> str:
    body = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(body.encode()).hexdigest()


def qualname(obj: Any) -> str:
    module = getattr(obj, "__module__", None) or type(obj).__module__
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) \
        or type(obj).__qualname__
    return f"{module}.{name}"


_user_modules: dict[tuple[str, int], bool] = {}


def _is_user_module(module: str) -> bool:
    """Code of the user's project, not of the standard library or an installed package.

    Memoized per imported module object (its ``id``), never for a name not imported yet: a
    long-lived process (the Python API) that imports, edits and re-imports an agent package
    must not keep an answer given before the package was there."""
    top = module.split(".")[0]
    if not top or top in sys.stdlib_module_names or top in ("builtins", "__main__"):
        return top == "__main__"
    mod = sys.modules.get(top)
    if mod is None:
        return False
    key = (top, id(mod))
    known = _user_modules.get(key)
    if known is None:
        files = [getattr(mod, "__file__", None), *list(getattr(mod, "__path__", []) or [])]
        paths = [Path(os.path.realpath(f)) for f in files if f]
        known = _user_modules[key] = bool(paths) and not any(
            {"site-packages", "dist-packages"} & set(p.parts) for p in paths)
    return known


def is_user_code(obj: Any) -> bool:
    return _is_user_module(getattr(obj, "__module__", None) or "")


# ---- code --------------------------------------------------------------------------------------

def _const(value: Any) -> Any:
    if isinstance(value, types.CodeType):
        return _code_body(value)
    if isinstance(value, frozenset | set):
        return {"set": sorted((_const(v) for v in value), key=lambda v: json.dumps(v, default=str))}
    if isinstance(value, tuple | list):
        return [_const(v) for v in value]
    if isinstance(value, bytes):
        return {"bytes": hashlib.sha256(value).hexdigest()}
    if isinstance(value, float | complex):
        return {"number": repr(value)}
    if value is None or isinstance(value, bool | int | str):
        return value
    return {"const": qualname(type(value))}


def _code_body(code: types.CodeType) -> dict[str, Any]:
    """A code object without its file, line numbers or addresses: what it does."""
    return {"name": code.co_qualname if hasattr(code, "co_qualname") else code.co_name,
            "code": code.co_code.hex(), "consts": [_const(c) for c in code.co_consts],
            "names": list(code.co_names), "varnames": list(code.co_varnames),
            "freevars": list(code.co_freevars), "cellvars": list(code.co_cellvars),
            "args": [code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount],
            "flags": code.co_flags}


def _all_names(code: types.CodeType) -> list[str]:
    names = list(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names += _all_names(const)
    return names


def _referenced(name: str, value: Any, seen: set[int], depth: int) -> Any:
    """What a global or closure variable contributes to a function's code hash."""
    if value is None or isinstance(value, bool | int | float | str):
        return value if not isinstance(value, float) or math.isfinite(value) else repr(value)
    if isinstance(value, types.ModuleType):
        return {"module": value.__name__}
    if isinstance(value, list | tuple | dict | set | frozenset) and len(value) <= 1000:
        try:
            return json.loads(json.dumps(value, sort_keys=True, default=lambda v: f"<{qualname(type(v))}>"))
        except (TypeError, ValueError):
            return {"container": qualname(type(value))}
    if (inspect.isfunction(value) or inspect.ismethod(value)) and is_user_code(value) \
            and depth < 6 and id(value) not in seen:
        return describe_callable(value, seen, depth + 1)
    if isinstance(value, type):
        return describe_class(value) if depth < 6 else {"class": qualname(value)}
    return {"object": qualname(type(value))}


def code_digest(fn: Any, seen: set[int] | None = None, depth: int = 0) -> str:
    """The hash of a function's code, its defaults, and what it reads from its module and
    closure (secret-named variables left out)."""
    seen = set() if seen is None else seen
    seen.add(id(fn))
    code: types.CodeType = fn.__code__
    fn_globals = getattr(fn, "__globals__", {}) or {}
    refs = {n: _referenced(n, fn_globals[n], seen, depth) for n in sorted(set(_all_names(code)))
            if n in fn_globals and not is_secret_name(n)}
    cells = {}
    for name, cell in zip(code.co_freevars, getattr(fn, "__closure__", None) or (), strict=False):
        try:
            contents = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if not is_secret_name(name):
            cells[name] = _referenced(name, contents, seen, depth)
    return _digest({"code": _code_body(code), "globals": refs, "closure": cells,
                    "defaults": _const(fn.__defaults__ or ()),
                    "kwdefaults": {k: _referenced(k, v, seen, depth)
                                   for k, v in sorted((fn.__kwdefaults__ or {}).items())
                                   if not is_secret_name(k)}})


def describe_callable(fn: Any, seen: set[int] | None = None, depth: int = 0) -> dict[str, Any]:
    """``{"callable": qualified name, "code": hash}`` (partials, methods, decorated functions
    and callable objects unwrapped)."""
    seen = set() if seen is None else seen
    if isinstance(fn, functools.partial):
        return {"partial": describe_callable(fn.func, seen, depth),
                "args": [_referenced("", a, seen, depth) for a in fn.args],
                "keywords": {k: _referenced(k, v, seen, depth) for k, v in sorted(fn.keywords.items())
                             if not is_secret_name(k)}}
    if inspect.ismethod(fn):
        owner = fn.__self__ if isinstance(fn.__self__, type) else type(fn.__self__)
        return {"method_of": qualname(owner), **describe_callable(fn.__func__, seen, depth)}
    if hasattr(fn, "__code__"):
        out: dict[str, Any] = {"callable": qualname(fn), "code": code_digest(fn, seen, depth)}
        wrapped = getattr(fn, "__wrapped__", None)
        if wrapped is not None and wrapped is not fn and depth < 6:
            out["wraps"] = describe_callable(wrapped, seen, depth + 1)
        return out
    if isinstance(fn, type) or inspect.isbuiltin(fn):
        return {"callable": qualname(fn)}
    call = vars(type(fn)).get("__call__")
    out = {"callable": qualname(type(fn))}
    if call is not None and hasattr(call, "__code__"):
        out["code"] = code_digest(call, seen, depth)
    return out


def describe_class(cls: type) -> dict[str, Any]:
    """A class by name, with the code of its methods where it is the user's own code."""
    out: dict[str, Any] = {"class": qualname(cls)}
    methods = {}
    for klass in cls.__mro__:
        if not is_user_code(klass):
            continue
        for name, member in sorted(vars(klass).items()):
            fn = member.fget if isinstance(member, property) else \
                getattr(member, "__func__", member)
            if hasattr(fn, "__code__") and f"{klass.__qualname__}.{name}" not in methods:
                methods[f"{klass.__qualname__}.{name}"] = code_digest(fn)
    if methods:
        out["methods"] = methods
    if issubclass(cls, BaseModel) and is_user_code(cls):
        try:
            out["schema"] = _digest(cls.model_json_schema())
        except Exception:  # noqa: BLE001 - a schema pydantic cannot render: its code still counts
            out["schema"] = None
    return out
