"""The one limiter for model calls (the agent's and the judge's).

``async with limiter.slot("judge"): ...`` (a :class:`ModelLimiter`, one per run, held by its
:class:`~evalsnap.pipeline.context.RunContext`) holds one slot of the run's limit in this
process (``EVALSNAP_JUDGE_CONCURRENCY`` / ``EVALSNAP_AGENT_CONCURRENCY``) and, inside a Prefect
run, one slot of the Prefect global concurrency limit named by
``EVALSNAP_JUDGE_CONCURRENCY_LIMIT`` / ``EVALSNAP_AGENT_CONCURRENCY_LIMIT`` (default
``evalsnap-judge-model`` / ``evalsnap-agent-model``) if that limit exists on the server —
so one limit holds across the tasks of a run, and across machines.

The limit is shared by every thread and event loop of the run in the process: Prefect runs
each task on its own event loop, which an ``asyncio.Semaphore`` (bound to one loop) cannot
span. A waiter is a future on its own loop, woken with ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from evalsnap.settings import Settings

ModelKind = Literal["agent", "judge"]

#: How long a "this Prefect limit exists / does not" answer is trusted, in seconds.
_LIMIT_TTL = 60.0


class ProcessLimiter:
    """At most ``slots`` holders at once across the threads and event loops of a process."""

    def __init__(self, slots: int) -> None:
        self.slots = max(1, slots)
        self._free = self.slots
        self._lock = threading.Lock()
        self._waiters: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = deque()

    async def acquire(self) -> None:
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._free > 0 and not self._waiters:
                self._free -= 1
                return
            fut: asyncio.Future[None] = loop.create_future()
            self._waiters.append((loop, fut))
        try:
            await fut
        except asyncio.CancelledError:
            with self._lock:
                waiting = (loop, fut) in self._waiters
                if waiting:
                    self._waiters.remove((loop, fut))
            if not waiting and fut.done() and not fut.cancelled():
                self.release()  # granted while being cancelled: give it back
            raise

    def release(self) -> None:
        with self._lock:
            while self._waiters:
                loop, fut = self._waiters.popleft()
                try:
                    loop.call_soon_threadsafe(self._grant, fut)
                    return  # the slot passes to that waiter
                except RuntimeError:  # its loop is closed
                    continue
            self._free += 1

    def _grant(self, fut: asyncio.Future[None]) -> None:
        if fut.done():  # cancelled meanwhile: the slot goes to the next waiter
            self.release()
        else:
            fut.set_result(None)

    @property
    def in_use(self) -> int:
        with self._lock:
            return self.slots - self._free

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        await self.acquire()
        try:
            yield
        finally:
            self.release()


class ModelLimiter:
    """The model-call limits of a run: one :class:`ProcessLimiter` per kind of call (sized
    by ``settings``) and, inside a Prefect run, the Prefect global concurrency limits."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._limiters = {"agent": ProcessLimiter(settings.agent_concurrency),
                          "judge": ProcessLimiter(settings.judge_concurrency)}
        self._known: dict[str, tuple[float, bool]] = {}
        self._lookup_lock = threading.Lock()

    def limiter(self, kind: ModelKind) -> ProcessLimiter:
        """The run's limiter for ``kind``'s calls in this process."""
        return self._limiters[kind]

    @asynccontextmanager
    async def slot(self, kind: ModelKind) -> AsyncIterator[None]:
        """Holds one slot of ``kind``'s limit and, in a Prefect run, of its Prefect global
        concurrency limit where that exists."""
        async with self._limiters[kind].slot():
            name = self.settings.limit_name(kind)
            if name is None or not _in_prefect_run() or not await asyncio.to_thread(
                    self._limit_exists, name):
                yield
                return
            from prefect.concurrency.asyncio import concurrency

            async with concurrency(name, occupy=1, strict=False):
                yield

    def _limit_exists(self, name: str) -> bool:
        """Asks the server at most once a minute per run (Prefect's non-strict mode would
        warn on every acquisition of a limit that does not exist)."""
        with self._lookup_lock:
            cached = self._known.get(name)
            if cached is not None and time.monotonic() - cached[0] < _LIMIT_TTL:
                return cached[1]
            from prefect.client.orchestration import get_client
            from prefect.exceptions import ObjectNotFound

            try:
                with get_client(sync_client=True) as client:
                    limit = client.read_global_concurrency_limit_by_name(name)
                exists = bool(getattr(limit, "active", True))
            except ObjectNotFound:
                exists = False
            self._known[name] = (time.monotonic(), exists)
            return exists


def _in_prefect_run() -> bool:
    from prefect.context import FlowRunContext, TaskRunContext

    return TaskRunContext.get() is not None or FlowRunContext.get() is not None
