"""Plugin loading: how models and Evaluator subclasses get registered in any process.

A plugin is a module (imported for its registration side effect) or a callable,
declared either

* as an entry point in the ``evalsnap.plugins`` group of an installed
  distribution (``[project.entry-points."evalsnap.plugins"]``), loaded in every
  process that scores — the CLI, a Prefect worker's flow run, a Dask worker; or
* in ``test_config.json`` under ``"evalsnapPlugins": ["my_pkg.metrics"]``,
  imported before the config is validated.

Plugins come only from the installed environment and the live config, never from
a stored record.
"""

from __future__ import annotations

import importlib
import logging
import threading
from importlib.metadata import entry_points

from evalsnap.errors import MetricImportError

logger = logging.getLogger(__name__)

GROUP = "evalsnap.plugins"
_lock = threading.Lock()
_loaded: set[str] = set()


_scanned = False


def load_entry_point_plugins() -> None:
    """Loads every ``evalsnap.plugins`` entry point once per process.

    The installed distributions are scanned once (a scan reads every distribution's
    metadata, ~60 ms, and every config resolution asks); a plugin that failed to load is
    tried again on the next call, and raises again.
    """
    global _scanned
    with _lock:
        if _scanned:
            return
        for ep in entry_points(group=GROUP):
            if ep.value in _loaded:
                continue
            try:
                obj = ep.load()
            except Exception as exc:  # a broken plugin must not look like a missing metric
                raise MetricImportError(
                    f"plugin entry point {ep.name!r} ({ep.value}) failed to load: {exc}; "
                    "fix or uninstall the distribution that declares it."
                ) from exc
            if callable(obj):
                obj()
            _loaded.add(ep.value)
        _scanned = True


def load_module_plugins(modules: list[str]) -> None:
    """Imports plugin modules named in the live config."""
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:
            raise MetricImportError(
                f"plugin module {name!r} named in evalsnapPlugins cannot be imported: {exc}; "
                "check the module path (relative to the agent's parent directory)."
            ) from exc
