"""Start-up: everything evalsnap does to start fast, in one module — and none of it on import.

Importing any evalsnap module registers, patches, starts and mutes nothing (a user's own
pytest that imports evalsnap sees the Python it expects). The tricks below run only where
evalsnap owns the process:

* the CLI's ``main`` calls :func:`cli_start` first, before its heavy imports;
* a process evalsnap starts itself (a scoring process of Prefect's process pool) runs
  :func:`child_start` as its initializer.

The tricks:

* **Prefect's temporary API, early.** The CLI starts Prefect's own ephemeral server (its app
  under uvicorn, :mod:`evalsnap._tempapi`) before its heavy imports, so the server's seconds of
  start-up overlap them
  (:func:`prestart_for_command`), in a child that dies with the CLI (:func:`module_command`).
* **Deferred imports** of ADK's heavy optional dependencies (:func:`install`), and optional
  imports that fail fast once they have failed (:func:`remember_missing`); both live in
  :mod:`evalsnap._deferred`.
* **Prefect settings** applied before Prefect is imported (:func:`apply_defaults`).

The CLI also leaves without the interpreter's teardown (``evalsnap.cli.main``).
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from evalsnap._deferred import (
    LAZY_MODULES,
    NEEDED_BY_METRIC,
    OPTIONAL_IMPORTED_PER_CALL,
    DeferredModule,
    install,
    preload,
    remember_missing,
)

__all__ = ["LAZY_MODULES", "NEEDED_BY_METRIC", "OPTIONAL_IMPORTED_PER_CALL", "DeferredModule",
           "api_starting", "apply_defaults", "child_start", "cli_start", "die_with_parent",
           "exit_without_teardown", "install", "leave_now", "module_command", "on_temporary_api",
           "prestart_ephemeral_api", "prestart_for_command", "preload", "preload_flow_engine",
           "remember_missing", "wait_for_ephemeral_api", "wait_healthy"]


def cli_start(argv: list[str]) -> None:
    """Every start-up trick of the ``evalsnap`` process, in order; called first by
    ``evalsnap.cli.main``, before the command line's heavy imports (ADK, Prefect)."""
    apply_defaults()
    install()
    prestart_for_command(argv)


def child_start(target: str, *args: Any) -> None:
    """Initializer of a process evalsnap starts (``ProcessPoolTaskRunner(initializer=
    child_start, initargs=("tasks.score:_warm", ...))``): the start-up tricks first, then
    ``target`` (``"module:function"``) is imported and called with ``args``.

    Naming the target by string keeps its module's imports (ADK's evaluation package) after
    the deferral is installed: a spawned process imports a pickled function's module before
    it runs anything."""
    apply_defaults()
    install()
    remember_missing()
    module, _, name = target.partition(":")
    function: Callable[..., None] = getattr(importlib.import_module(module), name)
    function(*args)


def apply_defaults() -> None:
    import warnings

    # ADK marks its whole eval API experimental and warns on every construction.
    warnings.filterwarnings("ignore", message=r"\[EXPERIMENTAL\]", category=UserWarning)
    # No telemetry from an offline tool; keep Prefect's own console quiet on stdout.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    os.environ.setdefault("PREFECT_RESULTS_PERSIST_BY_DEFAULT", "false")
    fewer_malloc_arenas()


def fewer_malloc_arenas() -> None:
    """At most ``MALLOC_ARENA_MAX`` glibc malloc arenas (2 unless the variable says otherwise)
    in this process and the ones it starts (the scoring process, the temporary API). glibc's
    default is 8 per core: a run's threads (inference, scoring, Prefect's) each kept what
    they freed in an arena of their own, and a 3,000-case run peaked at 1,161 MB of RSS
    instead of 939 MB.

    And blocks of 1 MiB or more mapped on their own (``MALLOC_MMAP_THRESHOLD_``, 1 MiB unless
    set): glibc's threshold otherwise rises to the largest block freed (up to 32 MiB), so a
    run's packs, pages and JSON documents came from the arenas, whose freed middles stay in
    the process. Measured at 10,000 cases: the scoring process 673-684 → 595 MB, the CLI's
    scoring plateau ~830 → ~740 MB (bench/RESULTS.md)."""
    if sys.platform != "linux":
        return
    settings = ((-8, "MALLOC_ARENA_MAX", "2"),  # M_ARENA_MAX, for the threads to come
                (-3, "MALLOC_MMAP_THRESHOLD_", str(1 << 20)))  # M_MMAP_THRESHOLD
    try:
        import ctypes

        libc = ctypes.CDLL(None)
    except OSError:
        return
    for param, name, default in settings:
        value = os.environ.setdefault(name, default)
        try:
            libc.mallopt(param, int(value))
        except (AttributeError, ValueError):  # not glibc, or a value that is no number
            pass


def give_back_freed() -> None:
    """Returns to the system the memory this process has freed (glibc's ``malloc_trim``,
    which also releases the free pages in the middle of its arenas): called between a run's
    phases, so what one phase let go (the eval set after freeze, the unit outcomes after
    publish) is not still counted in the next phase's peak. A no-op off glibc."""
    if sys.platform != "linux":
        return
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


#: Seconds at least between two :func:`give_back_now_and_then` trims of one process.
TRIM_EVERY = 1.0
_trimmed = [0.0]


def give_back_now_and_then() -> None:
    """:func:`give_back_freed`, at most once every :data:`TRIM_EVERY` seconds: called inside
    a phase that reads and lets go of many objects (a metric task's chunks, the own packs
    publish reads). What such a phase frees stays in glibc's arenas until a trim, and it
    grows with the number of objects read, not with what is held at a time: at 30,030 cases
    the own packs' read let ~85 MB accumulate before its trim (~57 MB at 10,010), which was
    that run's peak. A trim walks the arenas (a few ms)."""
    now = time.monotonic()
    if now - _trimmed[0] < TRIM_EVERY:
        return
    _trimmed[0] = now
    give_back_freed()


_server: Any = None
_server_log: Any = None
_api_url: str | None = None
_ready: Any = None  # the thread that waits for the server and warms it up
_healthy: list[bool] = []

# Commands that run a flow; the CLI starts the API for them before its own heavy imports.
FLOW_COMMANDS = frozenset({"run", "rescore"})


def prestart_for_command(argv: list[str]) -> None:
    """Starts the temporary API at once when ``argv`` asks the CLI for a flow command.

    Called first thing by ``evalsnap.cli``, so that the server's seconds of start-up
    overlap with all of the CLI's imports (ADK, Prefect), not only the later ones.
    """
    args = argv[1:]
    if args and args[0] in FLOW_COMMANDS and not {"--help", "-h"} & set(args):
        prestart_ephemeral_api()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def prestart_ephemeral_api() -> None:
    """Starts a temporary local Prefect API in the background when none is configured.

    This is Prefect's own ephemeral server (its app under uvicorn, SQLite under
    ``PREFECT_HOME``), started by evalsnap instead of by the first flow call, for two
    reasons: its seconds of start-up overlap with ADK's imports, and this process never
    imports Prefect's server package (FastAPI app, ORM), which would compete for the GIL.
    ``PREFECT_API_URL`` is set for this process before Prefect is imported; the server is
    stopped by PID when the process exits.
    """
    global _server, _api_url, _ready
    if _server is not None or os.environ.get("PREFECT_API_URL"):
        return
    if os.environ.get("PREFECT_SERVER_EPHEMERAL_ENABLED", "").lower() in ("0", "false"):
        return
    import atexit
    import subprocess
    from importlib.util import find_spec

    spec = find_spec("prefect")
    if spec is None or spec.origin is None:
        return
    port = _free_port()
    # Its log is read only if it fails to start: its shutdown logs tracebacks of event
    # flushes it cancels, which are no business of a run that has finished.
    global _server_log
    import tempfile

    _server_log = tempfile.TemporaryFile()
    env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
           "PREFECT__SERVER_FINAL": "1",
           # No block catalog for a UI nobody opens: registering it imports every installed
           # Prefect collection first (prefect-dask brings Dask: ~0.75 s of the start-up).
           # A block evalsnap saves registers its own type.
           "PREFECT_API_BLOCKS_REGISTER_ON_START": "false",
           "PREFECT_MEMOIZE_BLOCK_AUTO_REGISTRATION": "false"}
    # dies with this process even when it is killed (no exit handler runs then)
    _server = subprocess.Popen(
        # Prefect's server app under uvicorn, its automation services only for automations
        # (evalsnap._tempapi)
        module_command("evalsnap._tempapi", "127.0.0.1", str(port)),
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=_server_log)
    atexit.register(_stop_server)
    _api_url = f"http://127.0.0.1:{port}/api"
    os.environ["PREFECT_API_URL"] = _api_url
    import threading

    _ready = threading.Thread(target=_wait_and_warm, args=(_api_url, _server),
                              name="evalsnap-api-start", daemon=True)
    _ready.start()


#: What the server is asked once it answers, before the flow's first call: the first request
#: after start-up takes ~0.4 s (the server's lazy set-up), and so does its first read of the
#: database (~0.3-0.4 s: the connection, the flow and run tables' first queries), which the
#: flow's ``POST /flows/`` otherwise paid. Reads only: nothing is created.
WARM_UP = (("GET", "/admin/version", None),
           ("POST", "/flow_runs/filter", b'{"limit": 1}'),
           ("POST", "/task_runs/filter", b'{"limit": 1}'))


def _wait_and_warm(api_url: str, process: Any, timeout: float = 90.0) -> None:
    """Waits for the server, then sends it the :data:`WARM_UP` requests, which then overlap
    with this process's work when it is still busy."""
    import urllib.request

    healthy = wait_healthy(api_url, process, timeout)
    if healthy:
        for method, path, body in WARM_UP:
            request = urllib.request.Request(api_url + path, data=body, method=method,
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    response.read()
            except OSError:
                break  # only a warm-up: the flow's own first call reports real problems
    _healthy.append(healthy)


def _stop_server() -> None:
    import subprocess

    if _server is None or _server.poll() is not None:
        return
    _server.terminate()
    try:
        _server.wait(timeout=5)
    except subprocess.TimeoutExpired:
        _server.kill()
        _server.wait()


def preload_flow_engine() -> None:
    """Imports what a flow's first call would import (Prefect's flow and task engines, and
    FastAPI's encoder for the flow's parameters, ~0.5 s), so that it happens while the
    temporary API starts rather than after."""
    import fastapi.encoders  # noqa: F401
    import prefect.flow_engine  # noqa: F401
    import prefect.task_engine  # noqa: F401


def api_starting() -> bool:
    """True while the temporary API this process started has not answered yet."""
    return _ready is not None and _ready.is_alive()


def on_temporary_api() -> bool:
    """True when this process talks to the temporary API it started (gone when it exits:
    nothing should link to it)."""
    return _api_url is not None and os.environ.get("PREFECT_API_URL") == _api_url


def wait_for_ephemeral_api(timeout: float = 90.0) -> None:
    """Blocks until the server started by ``prestart_ephemeral_api`` answers."""
    if _server is None or _api_url is None or _ready is None:
        return
    _ready.join(timeout)
    if _healthy and _healthy[-1]:
        return
    from evalsnap.errors import EvalsnapError

    _stop_server()
    raise EvalsnapError(
        f"the temporary Prefect API did not start within {timeout:.0f} s (exit code "
        f"{_server.poll()}; its log ends: {_log_tail()!r}); run `prefect server start` and set "
        "PREFECT_API_URL, or check "
        "PREFECT_HOME is writable.")


def _log_tail(size: int = 2000) -> str:
    if _server_log is None:
        return ""
    _server_log.seek(0, 2)
    _server_log.seek(max(0, _server_log.tell() - size))
    return _server_log.read().decode("utf-8", "replace").strip()


def wait_healthy(api_url: str, process: Any, timeout: float) -> bool:
    """Polls ``<api_url>/health`` until it answers 200 (True), ``process`` exits or
    ``timeout`` seconds pass (False)."""
    import time
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(api_url + "/health", timeout=2) as response:
                if response.status == 200:
                    return True
        except OSError:
            time.sleep(0.1)
    return False


# ---- leaving without the interpreter's teardown ---------------------------------------------

def exit_without_teardown() -> None:
    """Makes this process, once its exit handlers have run, leave at once.

    Python's teardown of a process that has imported ADK and Prefect (~650,000 objects)
    takes 1-2 s and does nothing that outlives the process. Registered first, this runs
    after every exit handler registered later (Prefect's flushes among them): it shuts
    logging down, flushes the standard streams and calls ``os._exit``. For processes
    evalsnap starts itself, such as a scoring process (the CLI does the same in
    ``evalsnap.cli.main``).
    """
    import atexit
    import logging

    def leave() -> None:
        logging.shutdown()
        leave_now(0)

    atexit.register(leave)


def leave_now(code: int) -> None:
    """Flushes the standard streams and ends the process with ``code``, skipping teardown
    (call it once every exit handler has run)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


# ---- children that die with their parent ----------------------------------------------------

_LAUNCHER = """
import ctypes, os, runpy, signal, sys
if sys.platform == "linux":
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):
        pass
if os.getppid() != int(sys.argv.pop(1)):
    sys.exit(0)  # the parent died before the signal was armed
runpy.run_module(sys.argv.pop(1), run_name="__main__", alter_sys=True)
"""


def die_with_parent(parent_pid: int) -> None:
    """Makes this process (a child evalsnap started, e.g. a scoring process of Prefect's
    process pool) end when ``parent_pid`` does, however it ends: killed, ``os._exit``, a crash.
    Linux only (``PR_SET_PDEATHSIG``); elsewhere the pool's own shutdown is all there is."""
    if sys.platform == "linux":
        import ctypes
        import signal

        try:
            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # nothing here is worth a clean exit
        except (OSError, AttributeError):
            return
    if os.getppid() != parent_pid:
        os._exit(0)  # the parent died before the signal was armed


def module_command(module: str, *args: str) -> list[str]:
    """The argv for ``python -m module *args`` in a child that dies with this process."""
    return [sys.executable, "-c", _LAUNCHER, str(os.getpid()), module, *args]


