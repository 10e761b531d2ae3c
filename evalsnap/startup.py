"""Prefect settings evalsnap applies before Prefect is imported (CLI processes only)."""

from __future__ import annotations

import os
from typing import Any


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


_server: Any = None
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

    This is Prefect's own ephemeral server (the same uvicorn command, SQLite under
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
    env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
           "PREFECT__SERVER_FINAL": "1",
           # No block catalog for a UI nobody opens: registering it imports every installed
           # Prefect collection first (prefect-dask brings Dask: ~0.75 s of the start-up).
           # A block evalsnap saves registers its own type.
           "PREFECT_API_BLOCKS_REGISTER_ON_START": "false",
           "PREFECT_MEMOIZE_BLOCK_AUTO_REGISTRATION": "false"}
    from evalsnap._child import module_command

    # dies with this process even when it is killed (no exit handler runs then)
    _server = subprocess.Popen(
        module_command("uvicorn", "--app-dir", os.path.dirname(os.path.dirname(spec.origin)),
                       "--factory", "prefect.server.api.server:create_app",
                       "--host", "127.0.0.1", "--port", str(port),
                       "--log-level", "error", "--lifespan", "on"),
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    atexit.register(_stop_server)
    _api_url = f"http://127.0.0.1:{port}/api"
    os.environ["PREFECT_API_URL"] = _api_url
    import threading

    _ready = threading.Thread(target=_wait_and_warm, args=(_api_url, _server),
                              name="evalsnap-api-start", daemon=True)
    _ready.start()


def _wait_and_warm(api_url: str, process: Any, timeout: float = 90.0) -> None:
    """Waits for the server, then sends it one API request: the first request after start-up
    takes ~0.5 s (the server's lazy set-up), which then overlaps with this process's work."""
    import urllib.request

    healthy = wait_healthy(api_url, process, timeout)
    if healthy:
        try:
            with urllib.request.urlopen(api_url + "/admin/version", timeout=30) as response:
                response.read()
        except OSError:
            pass  # only a warm-up: the flow's own first call reports real problems
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
        f"{_server.poll()}); run `prefect server start` and set PREFECT_API_URL, or check "
        "PREFECT_HOME is writable.")


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
