"""The CLI in the test process, cut when it hangs (for tests whose failure mode is a hang).

:func:`tests._cli.run_inproc` takes a ``timeout`` but nothing stops a stuck call. A test
whose product failure would be a call that never returns (a deadline that is not kept)
used to pay a CLI process for ``subprocess.run(timeout=...)`` to cut the hang.
:func:`run_cut` runs the call in this process instead and cuts it the same way: a
``SIGALRM`` after ``timeout`` seconds raises :class:`Hung` in the main thread (where the
CLI waits for its run: ``evalsnap.cli.signals.run_stoppable`` joins its worker in short
steps, and a blocking socket read returns to Python for a signal handler), and the test
fails saying so. A ``BaseException``, so no ``except Exception`` of the code under test
takes it for an error of its own. What the hung call left behind (a daemon thread of user
code, an abandoned task) stays in the test process: only when the test has failed.

Calls that need a process of their own (:func:`tests._cli.needs_a_process`) run as
:func:`tests.conftest.run_cli` runs them, with its ``timeout``.
"""

from __future__ import annotations

import functools
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests._cli import CliResult, needs_a_process, run_inproc

#: What a CLI process imported before its ``timeout`` ran too; here they are imported once,
#: before the first call is timed, so a busy machine's seconds of imports are not a "hang".
_WARM = ("prefect.main", "evalsnap.cli", "google.adk.evaluation.metric_evaluator_registry",
         "google.adk.models.registry", "google.adk.runners", "evalsnap.pipeline.infer",
         "evalsnap.pipeline.score", "evalsnap.pipeline.judge", "evalsnap.pipeline.publish",
         "rouge_score.rouge_scorer", "s3fs")


@functools.cache
def _warm() -> None:
    import importlib

    for name in _WARM:
        try:
            importlib.import_module(name)
        except ImportError:
            pass


class Hung(BaseException):
    """The call was still running when its time was up."""


@contextmanager
def cut_after(seconds: float, what: str) -> Iterator[None]:
    """Raises :class:`Hung` in the main thread if the block runs longer than ``seconds``."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("cut_after needs the main thread (SIGALRM)")

    def on_alarm(signum: int, frame: object) -> None:
        raise Hung(f"{what} still running after {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_cut(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
            timeout: float = 300) -> CliResult:
    """:func:`tests._cli.run_inproc`, failing the test if the call takes over ``timeout`` s."""
    if needs_a_process(args, env):
        from tests.conftest import run_cli

        return run_cli(*args, env=env, cwd=cwd, timeout=timeout)
    _warm()
    try:
        with cut_after(timeout, f"evalsnap {' '.join(args[:1])}"):
            return run_inproc(*args, env=env, cwd=cwd, timeout=timeout)
    except Hung as exc:
        pytest.fail(f"{exc}: the call hung ({list(args)})")
