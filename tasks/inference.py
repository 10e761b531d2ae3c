"""Inference task: a thin adapter over ``evalsnap.pipeline.stages.infer_case``, one task per batch.

One Prefect task run per *batch* of cases, not per case: each task run costs Prefect's
engine and API several milliseconds (state changes, events, tag-concurrency lease), and
its API server shares the machine, which dominated a 300-case run. Within a batch the
cases run concurrently on one event loop (``concurrency``), each holding a slot of the
agent-model limit. Reuse stays per case: the batch's cache key is the list of its cases'
inference fingerprints, and a batch that runs anyway (a changed case, a new partition)
finds every other case in evalsnap's inference index.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any

from prefect import task
from prefect.context import TaskRunContext
from prefect.runtime import task_run

from evalsnap.pipeline import progress, runners, stages
from evalsnap.pipeline.outcomes import InferenceOutcome
from evalsnap.records import repo
from tasks._prefect import retries, retry_delays


class InferenceFailed(Exception):
    """Raised so that Prefect retries (and never caches) a batch with failed inferences."""

    def __str__(self) -> str:
        return str(self.args[0])


def batch_cache_key(context: Any, parameters: dict[str, Any]) -> str:
    """``infer/<sha256 of the batch's inference fingerprints, in order>``."""
    fps = "\n".join(item["fingerprint"] for item in json.loads(parameters["items_json"]))
    return f"infer/{hashlib.sha256(fps.encode()).hexdigest()}"


def _earlier_success(store_url: str, fingerprint: str, run_id: str) -> tuple[str, Any] | None:
    """An inference of this fingerprint that an earlier attempt of this run stored."""
    found = repo.find_inference(repo.open_store(store_url), fingerprint)
    if found is None or found[1].run_id != run_id:
        return None
    return found


@task(name="inference", task_run_name="infer {label}", cache_key_fn=batch_cache_key,
      persist_result=True, retries=retries(), retry_delay_seconds=retry_delays())
def infer_task(store_url: str, agent_dir: str, eval_set_id: str, items_json: str,
               run_id: str, reuse: bool, concurrency: int = 8,
               label: str = "") -> list[dict[str, Any]]:
    """Runs (or, with reuse, finds) each item's inference; returns their outcomes in order.

    ``items_json``: a JSON list of ``{"case": EvalCase JSON, "eval_id", "repetition",
    "fingerprint"}``. A string, because Prefect walks every nested value of a structured
    argument looking for futures (seconds per run at scale), and an annotation that stops
    it (``quote``) does not survive every task runner. A
    failed inference fails the task while Prefect retries remain, and a retry runs only
    the items that have not succeeded; on the last attempt the failures are returned as
    failed outcomes (recorded, never reused), so one bad case never loses its batch.
    """
    # A sync task on purpose: Prefect runs each *async* task on a fresh event loop with a
    # fresh API client and events worker; a sync task reuses its worker thread's client.
    items: list[dict[str, Any]] = json.loads(items_json)
    attempt = int(task_run.get_run_count() or 1)
    ctx = TaskRunContext.get()
    last_attempt = ctx is None or attempt > (ctx.task.retries or 0)

    async def one(item: dict[str, Any], limiter: asyncio.Semaphore) -> InferenceOutcome:
        async with limiter:
            if attempt > 1:
                earlier = _earlier_success(store_url, item["fingerprint"], run_id)
                if earlier is not None:
                    return InferenceOutcome(
                        eval_id=item["eval_id"], repetition=item["repetition"], oid=earlier[0],
                        fingerprint=item["fingerprint"], status="success", run_id=run_id,
                        model_calls=earlier[1].model_calls)
            # One slot of the agent-model limit per inference (a case's turns run in order).
            async with runners.model_slot("agent"):
                outcome = await stages.infer_case(store_url, agent_dir, item["case"],
                                                  eval_set_id, item["repetition"], run_id,
                                                  reuse, attempt=attempt)
        if outcome.status == "success":
            progress.advance("inference")
        return outcome.model_copy(update={"eval_id": item["eval_id"]})

    async def run_all() -> list[InferenceOutcome]:
        limiter = asyncio.Semaphore(max(1, concurrency))
        return list(await asyncio.gather(*(one(item, limiter) for item in items)))

    with runners.cpu_slot():
        outcomes = asyncio.run(run_all())
    repo.open_store(store_url).flush()  # what this task wrote is durable before it returns
    failed = [o for o in outcomes if o.status != "success"]
    if failed and not last_attempt:
        raise InferenceFailed(f"{len(failed)} of {len(items)} inferences failed, first "
                              f"{failed[0].eval_id}: {failed[0].error}; retrying those")
    for _ in failed:
        progress.advance("inference")
    return [o.model_dump(mode="json") for o in outcomes]


def batches(n_items: int, workers: int, size: int | None = None) -> list[range]:
    """Deterministic partition of ``n_items`` into consecutive batches.

    ``size`` (``EVALSNAP_INFER_BATCH``) fixes the batch size; by default there is about
    one batch per worker, at most 50 items each, so a retry, a cache entry or a progress
    step is never coarse (how many run at once is :func:`evalsnap.pipeline.runners.cpu_slot`'s
    business). The same eval set gives the same batches, which is what lets Prefect's
    cache answer a rerun.
    """
    if n_items <= 0:
        return []
    if not size:
        size = max(1, min(50, -(-n_items // max(1, workers))))
    return [range(start, min(start + size, n_items)) for start in range(0, n_items, size)]
