"""Deadlines: no call evalsnap makes or hands to user code can wait forever.

Each is a setting (``EVALSNAP_*_TIMEOUT``, seconds; :mod:`evalsnap.settings`); a metric's
own deadline can be set in the config (``evalsnapTimeouts``). A deadline hit is never a
hang: an agent model call or a whole inference past its deadline is a failed inference
(retried as failed inferences are); a judge call past its deadline is a transient judge
error (retried, then the unit is NOT_EVALUATED); a metric past its deadline is a
NOT_EVALUATED unit. Store calls have theirs in :mod:`storage._backend`.

Synchronous user code (a custom metric function, an evaluator whose methods are plain
functions) runs on a daemon thread of its own, so the event loop stays free for the other
units and a deadline can be kept even when the code never returns: the thread is left
behind (it cannot be stopped from outside) and ends with the process.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from evalsnap import settings
from evalsnap.errors import ConfigError

T = TypeVar("T")

CONFIG_KEY = "evalsnapTimeouts"
_FORMAT = f'"{CONFIG_KEY}": {{"<metric name>": 30}}'


class DeadlineExceeded(TimeoutError):
    """A call took longer than its deadline (the message names the setting)."""


def exceeded(what: str, seconds: float, setting: str) -> DeadlineExceeded:
    return DeadlineExceeded(f"{what} got no answer within {seconds:g} s (deadline {setting}; "
                            "raise it if the call is slow rather than stuck)")


def read_metric_timeouts(raw: dict[str, Any], where: str, metrics: list[str]) -> dict[str, float]:
    """The config's per-metric deadlines (``evalsnapTimeouts``); a malformed table or a
    name that is not a configured metric is a ConfigError."""
    table = raw.get(CONFIG_KEY)
    if table is None:
        return {}
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: `{CONFIG_KEY}` must be an object, as in {_FORMAT}.")
    out: dict[str, float] = {}
    for name, seconds in table.items():
        if name not in metrics:
            raise ConfigError(f"{where}: `{CONFIG_KEY}.{name}` names no metric under `criteria` "
                              f"(configured: {', '.join(metrics)}); fix the name or remove it.")
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0 \
                or seconds != seconds or seconds == float("inf"):
            raise ConfigError(f"{where}: `{CONFIG_KEY}.{name}` must be a number of seconds above "
                              f"0, as in {_FORMAT}.")
        out[name] = float(seconds)
    return out


def metric_timeout(timeouts: dict[str, float], metric_name: str,
                   s: settings.Settings | None = None) -> tuple[float, str]:
    """The deadline of one unit of ``metric_name`` and where it comes from (``s``: the run's
    settings; default: the environment's)."""
    if metric_name in timeouts:
        return timeouts[metric_name], f"{CONFIG_KEY}.{metric_name}"
    return (s or settings.get()).metric_timeout, "EVALSNAP_METRIC_TIMEOUT"


def in_daemon_thread(fn: Callable[..., T], *args: Any) -> Awaitable[T]:
    """``fn(*args)`` on a daemon thread; an awaitable of its result.

    Not ``asyncio.to_thread``: the loop's default executor joins its threads when
    ``asyncio.run`` ends, so one stuck call would hang the end of the run.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not future.done():
            future.set_result(value) if ok else future.set_exception(value)

    def run() -> None:
        value: Any
        try:
            value, ok = fn(*args), True
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting unit
            value, ok = exc, False
        try:
            loop.call_soon_threadsafe(settle, ok, value)
        except RuntimeError:
            pass  # the loop is gone: nobody waits for this call any more

    threading.Thread(target=run, name="evalsnap-user-code", daemon=True).start()
    return future


class CallWatch(Protocol):
    """Keeps the deadlines of the model calls inside one inference (each lane has its own)."""

    expired: DeadlineExceeded | None

    def arm(self, task: asyncio.Task[Any]) -> None:
        """Watch the calls of ``task``: past a call's deadline, set ``expired``, cancel it."""

    def disarm(self) -> None:
        """Stop watching."""


async def within_inference_deadline(work: Awaitable[T], watch: CallWatch, what: str) -> T:
    """Awaits ``work`` (a coroutine) as its own task under the inference's deadline
    (``EVALSNAP_INFERENCE_TIMEOUT``) and its model calls' (``watch``): a deadline hit raises
    :class:`DeadlineExceeded`; cancelling the caller cancels the work."""
    seconds = settings.get().inference_timeout
    task = asyncio.ensure_future(work)
    watch.arm(task)
    whole = asyncio.timeout(seconds)
    try:
        async with whole:
            return await task
    except TimeoutError:
        if not whole.expired():
            raise
        raise exceeded(what, seconds, "EVALSNAP_INFERENCE_TIMEOUT") from None
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if watch.expired is None or (current is not None and current.cancelling()):
            raise
        raise watch.expired from None
    finally:
        watch.disarm()
        if not task.done():
            task.cancel()


def off_the_loop(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` itself if it is a coroutine function; else a function that runs it on a daemon
    thread and returns an awaitable (which ADK's callers await, as they await an async
    metric)."""
    if inspect.iscoroutinefunction(fn):
        return fn

    def threaded(*args: Any) -> Awaitable[Any]:
        return in_daemon_thread(fn, *args)

    return threaded
