"""Deferred imports of heavy optional dependencies of ADK's evaluation package, and optional
imports that fail fast once they have failed. Nothing here runs on import: the CLI's ``main``
(:func:`evalsnap.startup.cli_start`) and the processes evalsnap starts call :func:`install`.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import types
from typing import Any

# ---- deferred imports -----------------------------------------------------------------------
#
# Deferred imports of heavy optional dependencies of ADK's evaluation package.
#
# ``google.adk.evaluation.metric_evaluator_registry`` imports every evaluator module, and two
# of them import big libraries at module level that they only use when a metric of theirs
# actually scores: the Vertex AI SDK (``agentplatform``, ``vertexai``: ~2.5 s) and ``pandas``
# (~0.5 s) for the Vertex-based metrics, and ``nltk`` through ``rouge_score`` (~1.7 s) for
# ``response_match_score``. That was most of a ``--reuse`` or ``rescore`` run's start-up,
# where nothing scores with them.
#
# :func:`install` registers each such module as a :class:`DeferredModule`: the module
# object exists at once (``import x`` and ``from pkg import x`` succeed), and its code runs in
# full, into that same object, on the first access to a name it defines, so behaviour is
# unchanged, only later. (The standard library's ``LazyLoader`` cannot do this on Python
# 3.11: the import statement itself reads ``__spec__`` and so loads the module.) It does
# nothing for a module already imported or not installed; ``EVALSNAP_LAZY_IMPORTS=0`` turns
# it off.

#: Modules used only when a metric of theirs runs (see the module docstring).
LAZY_MODULES = ("agentplatform", "vertexai", "rouge_score.rouge_scorer", "rouge_score.tokenizers",
                "pandas")


class DeferredModule(types.ModuleType):
    """A module whose code runs on the first lookup of a name it does not have yet."""

    def __getattr__(self, attr: str) -> Any:
        _load(self)
        if type(self) is DeferredModule:  # still loading, in this thread (its own code)
            raise AttributeError(f"module {self.__name__!r} has no attribute {attr!r}")
        return getattr(self, attr)


def _load(module: types.ModuleType) -> None:
    """Runs a deferred module's code once; other threads wait for it instead of failing."""
    state = module.__dict__
    lock = state.get("_evalsnap_lock")
    spec = state.get("__spec__")
    if lock is None or spec is None or spec.loader is None:
        return
    with lock:  # reentrant: the module's own code may look up its names while it runs
        if type(module) is not DeferredModule or state.get("_evalsnap_loading"):
            return
        state["_evalsnap_loading"] = True
        if spec.submodule_search_locations is not None:
            state["__path__"] = list(spec.submodule_search_locations)
        try:
            spec.loader.exec_module(module)
        except BaseException:
            # Still deferred: the next use runs it again and raises the real error (a
            # failed background preload must not leave a module without its names).
            if spec.submodule_search_locations is not None:
                state.pop("__path__", None)
            raise
        else:
            object.__setattr__(module, "__class__", types.ModuleType)  # ordinary from now on
        finally:
            del state["_evalsnap_loading"]


#: Deferred modules that a metric needs as soon as it scores (ADK metric name → modules).
NEEDED_BY_METRIC = {"response_match_score": ("rouge_score.rouge_scorer",
                                             "rouge_score.tokenizers")}


def preload(metric_names: list[str]) -> threading.Thread | None:
    """Loads, in a background thread, the deferred modules the given metrics will need.

    The CLI calls it while it waits for Prefect's temporary API, when this process is idle:
    the scoring tasks then find the modules loaded instead of loading them on the clock.
    """
    wanted = [name for metric in metric_names for name in NEEDED_BY_METRIC.get(metric, ())]
    modules = [m for m in (sys.modules.get(name) for name in wanted)
               if type(m) is DeferredModule]
    if not modules:
        return None

    def run() -> None:
        for module in modules:
            try:
                _load(module)
            except Exception:  # noqa: BLE001 - the first real use reports it
                return

    thread = threading.Thread(target=run, name="evalsnap-preload", daemon=True)
    thread.start()
    return thread


def install(names: tuple[str, ...] = LAZY_MODULES) -> list[str]:
    """Registers each module as a :class:`DeferredModule`; returns the names it registered."""
    from evalsnap import settings
    from evalsnap.errors import UsageError

    try:
        lazy = settings.get().lazy_imports
    except UsageError:  # a bad EVALSNAP_* value: the command reports it (exit 2), not the import
        lazy = True
    if not lazy:
        return []
    done = []
    for name in names:
        if name in sys.modules:
            continue
        try:
            spec = importlib.util.find_spec(name)  # imports the parent package, if any
        except (ImportError, ValueError):
            continue
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            continue
        module = importlib.util.module_from_spec(spec)
        module.__class__ = DeferredModule
        module.__dict__["_evalsnap_lock"] = threading.RLock()
        # A package keeps no __path__ until it loads: importing one of its submodules asks
        # for it, and so runs the package's own code first, as a normal import would.
        module.__dict__.pop("__path__", None)
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent and parent in sys.modules:
            setattr(sys.modules[parent], child, module)
        done.append(name)
    return done


#: ADK modules that its runtime imports inside functions, in ``try/except ImportError``,
#: for an optional dependency (``a2a``). When that dependency is missing, the import fails
#: on every call and runs the module's code each time: ``build_node`` did so several
#: times per agent run (~1 s per 300 runs on the GIL).
OPTIONAL_IMPORTED_PER_CALL = ("google.adk.agents.remote_a2a_agent",)


def remember_missing(names: tuple[str, ...] = OPTIONAL_IMPORTED_PER_CALL) -> list[str]:
    """Makes a failed optional import fail fast from then on; returns the names it marked.

    It tries each import once; a module whose import raises ``ImportError`` is entered in
    ``sys.modules`` as ``None``, which Python answers with ``ImportError`` at once (the
    documented way to block an import), so callers that catch it behave as before.
    """
    marked = []
    for name in names:
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except ImportError:
            sys.modules[name] = None  # type: ignore[assignment]
            marked.append(name)
    return marked
