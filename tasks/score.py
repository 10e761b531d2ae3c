"""Scoring task, one per metric: a thin adapter over ``evalsnap.pipeline.stages.score_metric``."""

from __future__ import annotations

import asyncio
from typing import Any

from prefect import task

from evalsnap import score_worker
from evalsnap.pipeline import progress, stages
from evalsnap.records import repo
from tasks._prefect import score_cache_key


@task(name="score", task_run_name="score {metric_name}", cache_key_fn=score_cache_key,
      persist_result=True)
def score_task(store_url: str, snapshot_oid: str, metric_name: str, units_digest: str,
               config_json: str, config_where: str, sys_paths: list[str], run_id: str,
               reuse: bool, force: bool, case_ids: list[str] | None = None,
               concurrency: int = 8) -> list[dict[str, Any]]:
    args: dict[str, Any] = dict(
        store_url=store_url, snapshot_oid=snapshot_oid, metric_name=metric_name,
        config_json=config_json, config_where=config_where, sys_paths=sys_paths,
        run_id=run_id, reuse=reuse, force=force, case_ids=case_ids, concurrency=concurrency)

    def on_unit() -> None:
        progress.advance("scoring")

    worker = score_worker.current()
    if worker is not None and metric_name in worker.metrics:
        # a code metric: the flow's worker process scores it on another core
        rows = score_worker.score_in_worker(on_unit, **args)
        if rows is not None:
            return rows
    # Sync on purpose (see tasks/inference.py): the event loop lives inside the task.
    outcomes = asyncio.run(stages.score_metric(**args, on_unit=on_unit))
    repo.open_store(store_url).flush()  # what this task wrote is durable before it returns
    return [o.model_dump(mode="json") for o in outcomes]

