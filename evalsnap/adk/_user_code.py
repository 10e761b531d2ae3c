"""The agent's own code (its tools above all) kept inside the inference it runs in.

Two things a tool can do would otherwise reach past its case:

* raise ``SystemExit``, ``KeyboardInterrupt`` or another ``BaseException`` that is not an
  ``Exception``: asyncio re-raises the first two out of the event loop, whatever awaits the
  task, and the others pass every ``except Exception``. Every task of an inference loop is
  created through :func:`contained_task_factory`, which turns them into
  :class:`ToolEscape` (an ``Exception``: the inference fails, its case only);
* block: a synchronous tool runs on the event loop by default in ADK 2.13 (without a
  ``RunConfig.tool_thread_pool_config``), so a tool that never returns holds the loop and
  no deadline can fire. :func:`off_loop_sync_tools` binds ADK's own seam for running
  synchronous callables so each one runs on a daemon thread of its own
  (:func:`evalsnap.deadlines.in_daemon_thread`): the loop stays free, the inference's
  deadline is kept, and a thread that never returns ends with the process.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any

from evalsnap.deadlines import in_daemon_thread

__all__ = ["ToolEscape", "contained_task_factory", "off_loop_sync_tools"]


class ToolEscape(Exception):
    """The agent's code raised a ``BaseException`` that is not an ``Exception``
    (``SystemExit``, ``KeyboardInterrupt``…): it fails the inference, not the run."""

    retryable = False


def _escape(exc: BaseException) -> ToolEscape:
    return ToolEscape(f"the agent's code raised {type(exc).__name__}({exc!s}) during the "
                      "inference; it fails this case only (a tool must raise an Exception "
                      "to report an error, never exit the process)")


def _escaped(exc: BaseException) -> bool:
    return not isinstance(exc, Exception | asyncio.CancelledError | GeneratorExit)


async def _contain(coro: Coroutine[Any, Any, Any]) -> Any:
    try:
        return await coro
    except BaseException as exc:
        if _escaped(exc):
            raise _escape(exc) from exc
        raise


def contained_task_factory(loop: asyncio.AbstractEventLoop, coro: Any,
                           **kwargs: Any) -> asyncio.Task[Any]:
    """``loop.set_task_factory`` for an inference loop: every task's coroutine contained."""
    if asyncio.iscoroutine(coro):
        coro = _contain(coro)
    return asyncio.Task(coro, loop=loop, **kwargs)


async def _run_sync_callable(target: Callable[..., Any], call_args: dict[str, Any]) -> Any:
    from google.adk.utils._sync_runner import _use_sync_callable_runner

    context = contextvars.copy_context()

    def invoke() -> Any:
        with _use_sync_callable_runner(None):  # a nested call runs inline on this thread
            return target(**call_args)

    try:
        return await in_daemon_thread(context.run, invoke)
    except BaseException as exc:
        if _escaped(exc):
            raise _escape(exc) from exc
        raise


@contextmanager
def off_loop_sync_tools() -> Iterator[None]:
    """Synchronous tools (and ADK's other synchronous user callables) off the event loop."""
    from google.adk.utils._sync_runner import _use_sync_callable_runner

    with _use_sync_callable_runner(_run_sync_callable):
        yield
