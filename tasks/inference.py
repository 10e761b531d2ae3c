"""Inference task: a thin adapter over ``evalsnap.stages.infer_case``."""

from __future__ import annotations

import asyncio
from typing import Any

from prefect import task
from prefect.runtime import task_run

from evalsnap import progress, runners, stages
from evalsnap.outcomes import InferenceOutcome
from tasks._prefect import infer_cache_key, retries, retry_delays


class InferenceFailed(Exception):
    """Raised so that Prefect retries (and never caches) a failed inference."""

    def __init__(self, message: str, oid: str) -> None:
        super().__init__(message, oid)
        self.oid = oid

    def __str__(self) -> str:
        return str(self.args[0])


@task(name="inference", task_run_name="infer {eval_id} #{repetition}",
      cache_key_fn=infer_cache_key, persist_result=True, retries=retries(),
      retry_delay_seconds=retry_delays(), tags=["evalsnap", "inference"])
def infer_task(store_url: str, agent_dir: str, case_data: dict[str, Any], eval_set_id: str,
               eval_id: str, repetition: int, fingerprint: str, run_id: str,
               reuse: bool) -> dict[str, Any]:
    # A sync task on purpose: Prefect runs each *async* task on a fresh event loop with a
    # fresh API client and events worker (~0.1 s per task run, measured with py-spy);
    # a sync task reuses its worker thread's client.
    attempt = int(task_run.get_run_count() or 1)

    async def infer() -> InferenceOutcome:
        # One slot of the agent-model limit per inference (a case's turns run in sequence).
        async with runners.model_slot("agent"):
            return await stages.infer_case(store_url, agent_dir, case_data, eval_set_id,
                                           repetition, run_id, reuse, attempt=attempt)

    outcome = asyncio.run(infer())
    if outcome.status != "success":
        raise InferenceFailed(f"inference of {eval_id} failed: {outcome.error}", outcome.oid)
    progress.advance("inference")
    return outcome.model_dump(mode="json")


def outcome_of(value: dict[str, Any]) -> InferenceOutcome:
    return InferenceOutcome.model_validate(value)
