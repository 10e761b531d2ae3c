"""Where tasks run: Prefect's own task runners, chosen per run.

``threads`` (default): a bounded ``ThreadPoolTaskRunner`` in the flow's process.
``dask``: prefect-dask's ``DaskTaskRunner`` — a ``LocalCluster`` of worker processes, or
an existing scheduler when an address is given.

The runner is chosen when the flow is *called* (CLI option, deployment parameter, or the
``EVALSNAP_TASK_RUNNER`` / ``EVALSNAP_DASK_ADDRESS`` settings, which a work pool's job
variables can set). A Prefect flow fixes its runner at decoration time, so
:func:`task_runner_scope` enters the chosen runner inside the running flow and makes it
the one ``task.submit`` uses; the flow run stays one run in the UI. Model calls are
limited by :mod:`evalsnap.pipeline.limits`, whatever the runner.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from evalsnap import settings
from evalsnap.errors import UsageError
from evalsnap.settings import TaskRunnerName

TASK_RUNNERS: tuple[str, ...] = ("threads", "dask")
__all__ = ["TASK_RUNNERS", "TaskRunnerName", "cpu_slot", "resolve_runner", "task_runner_scope",
           "thread_runner"]


def resolve_runner(task_runner: str | None, dask_address: str | None,
                   s: settings.Settings | None = None) -> tuple[str, str | None]:
    """The runner name and scheduler address to use: arguments, else settings (``s``, the
    run's; default: the environment's), else threads.

    An address alone implies ``dask``.
    """
    s = s or settings.get()
    address = dask_address or s.dask_address or None
    name = task_runner or s.task_runner or ("dask" if address else "threads")
    if name not in TASK_RUNNERS:
        raise UsageError(f"task runner {name!r} is unknown; choose one of {list(TASK_RUNNERS)}.")
    if address and name != "dask":
        raise UsageError(f"a Dask address ({address}) needs --task-runner dask.")
    return name, address


@functools.cache
def _cpu_slots() -> threading.BoundedSemaphore:
    return threading.BoundedSemaphore(settings.get().cpu_slot_count)


@contextmanager
def cpu_slot() -> Iterator[None]:
    """Holds one of this process's CPU slots (``EVALSNAP_CPU_SLOTS``, default: the cores).

    An agent run is mostly Python on the GIL: more inference batches at once than cores
    only adds lock churn (measured: 300 cases took 8.3 s on 8 threads, 5.1 s on 2). Model
    latency is covered inside a batch, whose cases share one event loop.
    """
    with _cpu_slots():
        yield


def thread_runner() -> Any:
    """The default runner: a bounded thread pool (Prefect's own default is unbounded)."""
    from prefect.task_runners import ThreadPoolTaskRunner

    return ThreadPoolTaskRunner(max_workers=settings.get().max_workers)


def _dask_runner(address: str | None, s: settings.Settings) -> Any:
    try:
        from prefect_dask import DaskTaskRunner
    except ImportError as exc:  # pragma: no cover - prefect-dask is a dependency
        raise UsageError("--task-runner dask needs prefect-dask: pip install prefect-dask") \
            from exc
    if address:
        return DaskTaskRunner(address=address)
    # Processes, one thread each: ADK agents and custom metrics need not be thread-safe.
    cluster_kwargs: dict[str, Any] = {"processes": True, "threads_per_worker": 1}
    if s.dask_workers:
        cluster_kwargs["n_workers"] = s.dask_workers
    return DaskTaskRunner(cluster_kwargs=cluster_kwargs)


@contextmanager
def task_runner_scope(task_runner: str | None = None, dask_address: str | None = None,
                      s: settings.Settings | None = None) -> Iterator[str]:
    """Inside a running flow: submit this block's tasks through the chosen runner.

    Yields the runner's name. With ``threads`` the flow's own (bounded thread) runner is
    kept. Otherwise the runner is started here and shut down on exit, after the block
    has waited for its futures. ``s``: the run's settings (default: the environment's).
    """
    from prefect.context import FlowRunContext

    s = s or settings.get()
    name, address = resolve_runner(task_runner, dask_address, s)
    ctx = FlowRunContext.get()
    if name == "threads" or ctx is None:
        yield name
        return
    with _dask_runner(address, s) as runner, ctx.model_copy(update={"task_runner": runner}):
        yield name
