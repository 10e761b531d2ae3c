"""Where tasks run, and how model calls are rate-limited across every run.

Task runners
    ``threads`` (default): a bounded ``ThreadPoolTaskRunner`` in the flow's process.
    ``dask``: prefect-dask's ``DaskTaskRunner`` — a ``LocalCluster`` of worker processes,
    or an existing scheduler when an address is given.

    The runner is chosen when the flow is *called* (CLI option, deployment parameter, or
    the ``EVALSNAP_TASK_RUNNER`` / ``EVALSNAP_DASK_ADDRESS`` environment, which a work
    pool's job variables can set). A Prefect flow fixes its runner at decoration time, so
    :func:`task_runner_scope` enters the chosen runner inside the running flow and makes
    it the one ``task.submit`` uses; the flow run stays one run in the UI.

Model-call limits
    :func:`model_slot` holds a slot of a Prefect *global concurrency limit* around a model
    call: ``EVALSNAP_AGENT_CONCURRENCY_LIMIT`` (default ``evalsnap-agent-model``) for the
    agent, ``EVALSNAP_JUDGE_CONCURRENCY_LIMIT`` (default ``evalsnap-judge-model``) for the
    judge. A limit that does not exist on the server is skipped (non-strict), as is every
    call outside a Prefect run; setting the variable to ``""`` or ``off`` disables it.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Literal

from evalsnap.errors import UsageError

TaskRunnerName = Literal["threads", "dask"]
TASK_RUNNERS: tuple[str, ...] = ("threads", "dask")
ModelKind = Literal["agent", "judge"]

DEFAULT_LIMITS: dict[str, str] = {"agent": "evalsnap-agent-model",
                                  "judge": "evalsnap-judge-model"}
_LIMIT_ENV: dict[str, str] = {"agent": "EVALSNAP_AGENT_CONCURRENCY_LIMIT",
                              "judge": "EVALSNAP_JUDGE_CONCURRENCY_LIMIT"}
#: How long a "this limit exists / does not" answer is trusted, in seconds.
_LIMIT_TTL = 60.0


# ---- task runners ---------------------------------------------------------------------------

def resolve_runner(task_runner: str | None, dask_address: str | None) -> tuple[str, str | None]:
    """The runner name and scheduler address to use: arguments, else environment, else threads.

    An address alone implies ``dask``.
    """
    address = dask_address or os.environ.get("EVALSNAP_DASK_ADDRESS") or None
    name = task_runner or os.environ.get("EVALSNAP_TASK_RUNNER") or ("dask" if address else
                                                                      "threads")
    if name not in TASK_RUNNERS:
        raise UsageError(f"task runner {name!r} is unknown; choose one of {list(TASK_RUNNERS)}.")
    if address and name != "dask":
        raise UsageError(f"a Dask address ({address}) needs --task-runner dask.")
    return name, address


def thread_workers() -> int:
    """Threads of the default runner (``EVALSNAP_MAX_WORKERS``; Prefect's is unbounded)."""
    return int(os.environ.get("EVALSNAP_MAX_WORKERS", "8"))


@functools.cache
def _cpu_slots() -> threading.BoundedSemaphore:
    raw = os.environ.get("EVALSNAP_CPU_SLOTS", "").strip()
    return threading.BoundedSemaphore(int(raw) if raw else (os.cpu_count() or 1))


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

    return ThreadPoolTaskRunner(max_workers=thread_workers())


def build_task_runner(task_runner: str | None = None, dask_address: str | None = None) -> Any:
    """A fresh, unstarted Prefect task runner."""
    name, address = resolve_runner(task_runner, dask_address)
    if name == "threads":
        return thread_runner()
    try:
        from prefect_dask import DaskTaskRunner
    except ImportError as exc:  # pragma: no cover - prefect-dask is a dependency
        raise UsageError("--task-runner dask needs prefect-dask: pip install prefect-dask") \
            from exc
    if address:
        return DaskTaskRunner(address=address)
    workers = os.environ.get("EVALSNAP_DASK_WORKERS")
    # Processes, one thread each: ADK agents and custom metrics need not be thread-safe.
    cluster_kwargs: dict[str, Any] = {"processes": True, "threads_per_worker": 1}
    if workers:
        cluster_kwargs["n_workers"] = int(workers)
    return DaskTaskRunner(cluster_kwargs=cluster_kwargs)


@contextmanager
def task_runner_scope(task_runner: str | None = None,
                      dask_address: str | None = None) -> Iterator[str]:
    """Inside a running flow: submit this block's tasks through the chosen runner.

    Yields the runner's name. With ``threads`` the flow's own (bounded thread) runner is
    kept. Otherwise the runner is started here and shut down on exit, after the block
    has waited for its futures.
    """
    from prefect.context import FlowRunContext

    name, address = resolve_runner(task_runner, dask_address)
    ctx = FlowRunContext.get()
    if name == "threads" or ctx is None:
        yield name
        return
    with build_task_runner(name, address) as runner, \
            ctx.model_copy(update={"task_runner": runner}):
        yield name


# ---- model-call concurrency -----------------------------------------------------------------

def limit_name(kind: ModelKind) -> str | None:
    """The Prefect global concurrency limit for ``agent`` or ``judge`` calls, or None (off)."""
    value = os.environ.get(_LIMIT_ENV[kind], DEFAULT_LIMITS[kind]).strip()
    return None if value.lower() in ("", "off", "none") else value


_known: dict[str, tuple[float, bool]] = {}
_known_lock = threading.Lock()
_lookup_lock = threading.Lock()


async def _limit_exists(name: str) -> bool:
    """Asks the server once a minute per process, so a missing limit costs no call per task
    and logs no warning per task (Prefect's non-strict mode warns on every acquisition)."""
    cached = _cached_limit(name)
    if cached is not None:
        return cached
    # One lookup for all the threads and coroutines that get here at once (the first calls
    # of every scoring task start together); the others wait for its answer.
    return await asyncio.to_thread(_lookup_limit, name)


def _cached_limit(name: str) -> bool | None:
    with _known_lock:
        cached = _known.get(name)
    if cached is not None and time.monotonic() - cached[0] < _LIMIT_TTL:
        return cached[1]
    return None


def _lookup_limit(name: str) -> bool:
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with _lookup_lock:
        cached = _cached_limit(name)
        if cached is not None:
            return cached
        try:
            with get_client(sync_client=True) as client:
                limit = client.read_global_concurrency_limit_by_name(name)
            exists = bool(getattr(limit, "active", True))
        except ObjectNotFound:
            exists = False
        with _known_lock:
            _known[name] = (time.monotonic(), exists)
        return exists


def limit_exists(kind: ModelKind) -> bool:
    """Whether calls of this kind go through a Prefect global concurrency limit (named,
    and present and active on the server). Synchronous; same per-process cache."""
    name = limit_name(kind)
    return name is not None and _lookup_limit(name)


def _in_prefect_run() -> bool:
    from prefect.context import FlowRunContext, TaskRunContext

    return TaskRunContext.get() is not None or FlowRunContext.get() is not None


@asynccontextmanager
async def model_slot(kind: ModelKind) -> AsyncIterator[None]:
    """Holds one slot of the agent's or the judge's concurrency limit around a model call.

    ``async with model_slot("judge"): response = await judge(...)``. A no-op outside a
    Prefect run, when the limit is switched off, or when it does not exist on the server.
    """
    name = limit_name(kind)
    if name is None or not _in_prefect_run() or not await _limit_exists(name):
        yield
        return
    from prefect.concurrency.asyncio import concurrency

    async with concurrency(name, occupy=1, strict=False):
        yield
