"""Processes the agent's tools started during inference do not outlive it.

A tool may start a child process (``subprocess.Popen("sleep 900")``, or one that detaches
with ``setsid`` and a double fork). :func:`reaped_after` wraps a run's inference: while it
runs, this process is the *child subreaper* (Linux ``PR_SET_CHILD_SUBREAPER``), so a
detached grandchild is re-parented here instead of to init and stays a descendant; when it
ends, every descendant that was not there before is stopped (SIGTERM, then SIGKILL) and
reaped. Processes evalsnap started earlier (a temporary Prefect API, Dask workers) are
left alone; a stopped run's children are stopped by the CLI (``evalsnap.cli.signals``).
"""

from __future__ import annotations

import ctypes
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

logger = logging.getLogger(__name__)

_PR_SET_CHILD_SUBREAPER, _PR_GET_CHILD_SUBREAPER = 36, 37
_WAIT = 3.0


def _subreaper(on: bool) -> bool:
    """Sets or clears the flag; True when this call changed it (it was not set already)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        current = ctypes.c_int(0)
        if libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(current), 0, 0, 0) != 0:
            return False
        if bool(current.value) == on:
            return False
        return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _descendants() -> dict[int, float]:
    import psutil

    try:
        found = psutil.Process().children(recursive=True)
    except psutil.Error:
        return {}
    out = {}
    for proc in found:
        try:
            out[proc.pid] = proc.create_time()
        except psutil.Error:
            continue
    return out


def stop(processes: list[Any], wait: float) -> None:
    """Stops and reaps ``processes`` (psutil's): SIGTERM, then SIGKILL to those still alive
    after ``wait`` seconds; one already gone is passed over."""
    import psutil

    for proc in processes:
        try:
            proc.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(processes, timeout=wait)
    for proc in alive:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=wait)


def stop_new(before: dict[int, float]) -> int:
    """Stops and reaps every descendant not in ``before`` (pid → start time); how many."""
    import psutil

    new = []
    for pid, started in _descendants().items():
        if before.get(pid) == started:
            continue
        try:
            new.append(psutil.Process(pid))
        except psutil.Error:
            continue
    stop(new, _WAIT)
    if new:
        logger.warning("stopped %d process(es) the agent's tools left running after inference",
                       len(new))
    return len(new)


@contextmanager
def reaped_after() -> Iterator[None]:
    """The processes started inside the block are stopped when it ends."""
    before = _descendants()
    was_set = _subreaper(True)
    try:
        yield
    finally:
        try:
            stop_new(before)
        finally:
            if was_set:
                _subreaper(False)
