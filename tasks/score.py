"""Scoring task, one per metric: a thin adapter over ``evalsnap.pipeline.score``."""

from __future__ import annotations

from typing import Any

from prefect import task

from evalsnap.pipeline import reuse
from evalsnap.pipeline.outcomes import UnitOutcome
from evalsnap.pipeline.score import ScoreRequest, score_metric
from tasks.support import cached, wait_tracked


@task(name="score", task_run_name="score {request.metric_name}",
      cache_key_fn=reuse.score_cache_key)
def score_task(request: ScoreRequest) -> list[dict[str, Any]]:
    """Scores (or reuses) one metric on every frozen case. Sync on purpose (see
    ``tasks.inference``): the event loop lives inside the task."""
    return [o.model_dump(mode="json") for o in score_metric(request)]


def run_scoring(requests: list[ScoreRequest], progress: Any = None) -> list[UnitOutcome]:
    """Submits one task per metric, waits, and returns every unit outcome."""
    if not requests:
        return []
    run = cached(score_task, requests[0])
    futures = [run.submit(r) for r in requests]
    wait_tracked(futures, progress)
    return [UnitOutcome.model_validate(u) for f in futures for u in f.result()]
