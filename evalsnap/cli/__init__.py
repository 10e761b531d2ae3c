"""The ``evalsnap`` command line (the public contract in DESIGN.md).

This package imports nothing heavy and changes nothing when imported: :func:`main` (the
console entry point, and ``python -m evalsnap.cli``) first runs the start-up tricks
(:func:`evalsnap.startup.cli_start`: Prefect's temporary API started early, ADK's heavy
optional imports deferred, Prefect's defaults), then imports the typer app
(:mod:`evalsnap.cli._app`), whose names (``app``, ``out``, ``err``, the shared options…)
are also reachable here.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names of __getattr__ below used from outside, for the type checker
    from evalsnap.cli._app import app, err, out  # noqa: F401

__all__ = ["main"]


def main() -> None:
    """The console entry point: runs the command, then leaves without tearing down.

    Once the command has returned, the non-daemon threads are joined and the exit handlers
    run (Prefect's log and event flushes, stopping the temporary API), and output is
    flushed; then the process exits at once. Python's own teardown of a process that has
    imported ADK and Prefect (~650,000 objects) takes 1-2 s and does nothing that
    outlives the process. Every exit code comes from :mod:`evalsnap.exitcodes`.
    """
    from evalsnap import startup

    startup.cli_start(sys.argv)  # before the heavy imports below (ADK, then Prefect)
    from evalsnap.cli.signals import install_process_handlers, result_printed

    install_process_handlers()  # SIGINT, SIGTERM, SIGHUP: from now to the process's end
    import atexit
    import threading

    from rich.markup import escape

    from evalsnap import errors, exitcodes, settings
    from evalsnap.cli._app import app, crash_message, err

    try:
        settings.get()  # a bad EVALSNAP_* value is a usage error, whatever the command
    except errors.UsageError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        startup.leave_now(exitcodes.exit_code(exitcodes.Failed(exc)))
    code: Any
    try:
        app()
        code = None
    except SystemExit as exc:
        code = exc.code
    except Exception as exc:  # noqa: BLE001 - outside a command's own handling: still a crash
        crash_message(exc)
        code = exitcodes.exit_code(exitcodes.Failed(exc))
    if code is not None and not isinstance(code, int):  # SystemExit("message") prints it
        sys.stderr.write(f"{code}\n")
    code = exitcodes.of_system_exit(code)
    result_printed(code)  # a signal from now on ends the process with this code
    shutdown = getattr(threading, "_shutdown", None)  # joins what the interpreter would join
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    startup.leave_now(code)


def __getattr__(name: str) -> Any:
    """The typer app's names (``evalsnap.cli.app``, ``_handled``, the shared options…), from
    :mod:`evalsnap.cli._app`, imported on first use."""
    if name.startswith("__") or name == "_app":  # the submodule itself: the import system's
        raise AttributeError(name)
    import importlib

    app_module = importlib.import_module("evalsnap.cli._app")
    try:
        return getattr(app_module, name)
    except AttributeError:
        raise AttributeError(f"module 'evalsnap.cli' has no attribute {name!r}") from None
