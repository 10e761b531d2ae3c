"""Ctrl-C, SIGTERM and SIGHUP: a command that runs a flow stops within seconds, whatever it is doing.

The flow runs on a worker thread; the main thread only waits, so a signal reaches evalsnap
and not Prefect's engine (whose shutdown waits for every task thread, and a stuck metric's
thread never ends). On the first SIGINT, SIGTERM or SIGHUP (a closed terminal, handled like
SIGTERM) the CLI

1. waits (at most :data:`COMMIT_WAIT` s) for a run that is committing to finish its commit
   (its run context's :class:`~evalsnap.pipeline.commits.Commits`), so no run is left
   half published;
2. stops every process it started (scoring processes, Dask workers, the temporary Prefect
   API): SIGTERM, then SIGKILL after :data:`CHILD_WAIT` s;
3. says what was published (records named) and what is kept: finished inference and judge
   answers are in the store, and ``--reuse`` reuses them;
4. exits 130 (SIGINT), 143 (SIGTERM) or 129 (SIGHUP) at once (:mod:`evalsnap.exitcodes`):
   in-flight work ends with the process.

Once the flow has returned its result, a signal no longer stops anything: the result is
printed whole and the process exits with the printed result's code (a signal that arrives
while it is printed waits for the end of the printing). The CLI's ``main`` installs these
handlers for the whole process (:func:`install_process_handlers`), so the same holds on its
way out, and for every command.

Everything a run writes is written atomically (temporary file or object, then rename or
a single PUT), so nothing in the store is torn by the exit.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from evalsnap.pipeline import leftovers

if TYPE_CHECKING:
    from evalsnap.pipeline.commits import Commits

T = TypeVar("T")

COMMIT_WAIT = 10.0
CHILD_WAIT = 2.0
#: The signals that stop a command (each exits 128 + its number).
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _State:
    """Where the command is: running a flow, printing its result, or done printing."""

    started = time.monotonic()
    running = False  # a flow runs on the worker thread
    finishing = False  # the flow returned; its result is being printed
    pending: int | None = None  # a signal that arrived while the result was printed
    printed: int | None = None  # the exit code of the printed result
    commits: Commits | None = None  # the running flow's (its run context's)


def install_process_handlers() -> None:
    """Handles :data:`SIGNALS` for the rest of this process (the CLI's ``main``)."""
    for s in SIGNALS:
        signal.signal(s, _on_signal)


def _on_signal(signum: int, _frame: Any) -> None:
    if _State.printed is not None:
        _leave_with_result(signum, _State.printed)
    if _State.finishing:
        _State.pending = signum
        return
    stop(signum, _State.started)


def result_printed(code: int) -> None:
    """The result (whose exit code is ``code``) is printed: a signal from now on ends the
    process with ``code``, and one that arrived while it was printed does so now."""
    _State.printed, _State.finishing = code, False
    if _State.pending is not None:
        _leave_with_result(_State.pending, code)


def _leave_with_result(signum: int, code: int) -> None:
    _say(f"evalsnap: {signal.Signals(signum).name} received after the result was printed; "
         f"exiting with its exit code {code}.")
    stop_children()
    from evalsnap import startup

    startup.leave_now(code)


def run_stoppable(fn: Callable[..., T], *args: Any, commits: Commits | None = None,
                  **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on a worker thread, stopped as above on a signal (waiting
    for the run's ``commits``).

    Outside the main thread (signals cannot be handled there) it is a plain call."""
    if threading.current_thread() is not threading.main_thread():
        return fn(*args, **kwargs)
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
            outcome["error"] = exc

    worker = threading.Thread(target=target, name="evalsnap-run", daemon=True)
    _State.started, _State.running, _State.commits = time.monotonic(), True, commits
    _State.finishing, _State.pending, _State.printed = False, None, None
    previous = {s: signal.signal(s, _on_signal) for s in SIGNALS}
    try:
        worker.start()
        while worker.is_alive():
            worker.join(0.2)
        _State.finishing = "value" in outcome  # a signal now waits for the result's printing
    finally:
        _State.running = False
        for s, handler in previous.items():
            signal.signal(s, handler)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]  # type: ignore[no-any-return]


def stop(signum: int, started: float) -> None:
    """Ends the process as described in the module docstring (never returns)."""
    from evalsnap import exitcodes, startup

    name = signal.Signals(signum).name
    code = exitcodes.exit_code(exitcodes.Stopped(signum))
    for s in SIGNALS:  # a second signal while stopping ends the process at once
        signal.signal(s, lambda *_: os._exit(code))
    if not _State.running:
        _say(f"evalsnap: {name} received; stopping.")
        stop_children()
        startup.leave_now(code)
    _say(f"evalsnap: {name} received after {time.monotonic() - started:.0f} s; stopping the run.")
    commits = _State.commits
    committed = commits.hold(COMMIT_WAIT) if commits is not None else True
    stopped = stop_children()
    done = commits.published() if commits is not None else []
    if done:
        for p in done:
            _say(f"evalsnap: record {p.record_oid} of eval set {p.eval_set_id!r} (run {p.run_id}) "
                 "was published before the stop.")
    if not committed:
        _say(f"evalsnap: a run was still committing after {COMMIT_WAIT:g} s: its record may "
             "be in the store without its run manifest; `evalsnap verify` shows it.")
    rest = "the rest of the run was not" if done else "nothing was"
    _say(f"evalsnap: {rest} published; finished inference and judge answers are kept in the "
         f"store, and `evalsnap run --reuse` reuses them. Stopped {stopped} child process"
         f"{'' if stopped == 1 else 'es'}.")
    startup.leave_now(code)


def stop_children() -> int:
    """Stops every process this one started (and theirs): SIGTERM, then SIGKILL."""
    import psutil

    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return 0
    leftovers.stop(children, CHILD_WAIT)
    return len(children)


def _say(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
