"""Inference task: one per batch of cases, a thin adapter over ``evalsnap.pipeline.infer``.

One Prefect task run per *batch*, not per case: each task run costs Prefect's engine and
API several milliseconds, which dominated a 300-case run. Reuse stays per case
(:mod:`evalsnap.pipeline.reuse`): the batch's cache key is its cases' inference
fingerprints, and a batch that runs anyway finds every unchanged case in the index.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Iterable
from typing import Any

from prefect import task
from prefect.context import TaskRunContext
from prefect.futures import PrefectFuture
from prefect.runtime import task_run

from evalsnap.pipeline import context, infer, leftovers, reuse
from evalsnap.pipeline.infer import InferBatch
from evalsnap.pipeline.outcomes import InferenceOutcome
from evalsnap.rows import Rows
from tasks.support import cached, retry_options, wait_tracked


class InferenceFailed(Exception):
    """Raised so that Prefect retries (and never caches) a batch with failed inferences."""

    def __str__(self) -> str:
        return str(self.args[0])


@task(name="inference", task_run_name="infer {request.label}",
      cache_key_fn=reuse.inference_cache_key, **retry_options())
def infer_task(request: InferBatch) -> list[dict[str, Any]]:
    """Runs (or reuses) each case of the batch; returns their outcomes, in order.

    A failed inference that a retry can fix (a timeout, a rate limit, a lost connection:
    :mod:`evalsnap.agents.failures`) fails the task while Prefect retries remain, and a retry
    runs only the cases that have not succeeded and could; a failure no retry fixes is
    returned at once. On the last attempt the failures are returned as failed outcomes
    (recorded, never cached, never reused), so one bad case never loses its batch.
    Sync on purpose: Prefect gives each *async* task a fresh event loop, API
    client and events worker; a sync task reuses its worker thread's.
    """
    attempt = int(task_run.get_run_count() or 1)
    ctx = TaskRunContext.get()
    last_attempt = ctx is None or attempt > (ctx.task.retries or 0)
    run = context.of(request.store_url)
    outcomes = infer.infer_batch(request, run, attempt)
    failed = infer.worth_retrying(outcomes, run)
    if failed and not last_attempt:
        raise InferenceFailed(f"{len(failed)} of {len(outcomes)} inferences failed, first "
                              f"{failed[0].eval_id}: {failed[0].error}; retrying those")
    return [o.model_dump(mode="json") for o in outcomes]


def run_inference(batches: Iterable[InferBatch], progress: Any = None) -> Rows[InferenceOutcome]:
    """Submits the batches, a window of them at a time (:data:`WINDOW` per worker thread),
    and returns one outcome per case × repetition (as rows), in the batches' order: a
    batch whose task failed as a whole becomes failed inferences of its cases. Each batch's
    outcomes are kept as rows, and the batch and its future let go, as soon as it and those
    before it have run (30,000 cases submitted at once held every batch's cases and
    outcomes until the last had run)."""
    outcomes = Rows(InferenceOutcome)
    pending: deque[tuple[InferBatch, PrefectFuture[Any]]] = deque()
    run: Any = None
    window = 0
    with leftovers.reaped_after():  # processes the tools started end with the inference
        for batch in batches:
            if run is None:
                run = cached(infer_task, batch)
                window = _window(context.of(batch.store_url).settings.max_workers)
            pending.append((batch, run.submit(batch)))
            if len(pending) >= window:
                _collect(*pending.popleft(), outcomes, progress)
        while pending:
            _collect(*pending.popleft(), outcomes, progress)
    return outcomes


#: Inference batches submitted ahead, per worker thread of the task runner (the runner's
#: queue never runs dry while the oldest batch is waited for).
WINDOW = 4


def _window(threads: int) -> int:
    """How many batches are submitted ahead: :data:`WINDOW` per worker thread of the flow's
    thread runner; all of them on another runner (a Dask cluster's workers, however many,
    are kept busy as before)."""
    from prefect.context import FlowRunContext
    from prefect.task_runners import ThreadPoolTaskRunner

    ctx = FlowRunContext.get()
    runner = ctx.task_runner if ctx is not None else None
    return WINDOW * threads if runner is None or isinstance(runner, ThreadPoolTaskRunner) \
        else sys.maxsize


def _collect(batch: InferBatch, future: PrefectFuture[Any], outcomes: Rows[InferenceOutcome],
             progress: Any) -> None:
    """Waits for ``batch``'s task and adds its outcomes (or its cases as failed)."""
    wait_tracked([future], progress, weights=[len(batch.items)])
    if future.state.is_completed():
        outcomes.extend(infer.with_identity(batch.items, future.result()))
        return
    try:
        future.result(raise_on_failure=True)
        message = str(future.state.message)
    except Exception as exc:  # noqa: BLE001 - the task's own error text is the reason
        message = str(exc)
    outcomes.extend(infer.record_failures(
        batch, message, attempts=(infer_task.retries or 0) + 1,
        store=context.of(batch.store_url).store))
