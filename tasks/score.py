"""Scoring task, one per metric: a thin adapter over ``evalsnap.stages.score_metric``."""

from __future__ import annotations

import asyncio
from typing import Any

from prefect import task

from evalsnap import progress, repo, stages
from tasks._prefect import score_cache_key


@task(name="score", task_run_name="score {metric_name}", cache_key_fn=score_cache_key,
      persist_result=True)
def score_task(store_url: str, snapshot_oid: str, metric_name: str, units_digest: str,
               config_json: str, config_where: str, sys_paths: list[str], run_id: str,
               reuse: bool, force: bool, case_ids: list[str] | None = None,
               concurrency: int = 8) -> list[dict[str, Any]]:
    # Sync on purpose (see tasks/inference.py): the event loop lives inside the task.
    outcomes = asyncio.run(stages.score_metric(
        store_url, snapshot_oid, metric_name, config_json, config_where, sys_paths, run_id,
        reuse, force, case_ids, concurrency, on_unit=lambda: progress.advance("scoring")))
    repo.open_store(store_url).flush()  # what this task wrote is durable before it returns
    return [o.model_dump(mode="json") for o in outcomes]
