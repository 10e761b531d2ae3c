"""Shared flow wiring: freeze → score (one task per metric) → publish."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

from prefect import get_run_logger

from evalsnap import score_worker
from evalsnap.pipeline import runners
from evalsnap.pipeline.outcomes import InferenceOutcome
from evalsnap.pipeline.plan import Plan
from evalsnap.pipeline.unit import unit_fingerprint
from evalsnap.records import repo
from tasks import freeze_task, publish_task, score_task
from tasks._prefect import as_data, result_storage_for, wait_tracked


def units_digest(snapshot_oid: str, store_url: str, rule_fp: str,
                 case_ids: list[str] | None) -> str:
    snapshot = repo.get_snapshot(repo.open_store(store_url), snapshot_oid)
    keys = [unit_fingerprint(c.case_fingerprint, rule_fp) for c in snapshot.cases
            if case_ids is None or c.eval_id in case_ids]
    return "sha256:" + hashlib.sha256("\n".join(keys).encode()).hexdigest()


@contextmanager
def scoring_worker(plan: Plan, runner: str, units_per_metric: int, *, reuse: bool,
                   force: bool) -> Iterator[None]:
    """The flow's scoring worker process for this block, if the run should have one
    (:func:`evalsnap.score_worker.metrics_for_worker`)."""
    rules = plan.selected_rules()
    judges = {r.metric_name for r in rules if r.judge}
    metrics = score_worker.metrics_for_worker(rules, plan.store_url, runner, units_per_metric,
                                              reuse=reuse, force=force)
    if judges.intersection(metrics) and runners.limit_exists("judge"):
        metrics = score_worker.metrics_for_worker(rules, plan.store_url, runner,
                                                  units_per_metric, reuse=reuse, force=force,
                                                  prefect_judge_limit=True)
    with score_worker.running(metrics):
        yield


def freeze_score_publish(plan: Plan, *, run_id: str, kind: str,
                         outcomes: list[InferenceOutcome], reuse: bool, force: bool,
                         concurrency: int, progress: Any = None) -> dict[str, Any]:
    """The second half of every flow. Returns the run's summary (the ``--json`` object).

    ``progress`` (an ``evalsnap.reports.artifacts.RunProgress``) advances as each metric's task ends.
    """
    logger = get_run_logger()
    storage = result_storage_for(plan.store_url)
    eval_set = plan.selected_eval_set()
    rules = plan.selected_rules()
    snapshot_oid = freeze_task(plan.store_url, as_data(eval_set.model_dump(mode="json")),
                               as_data([r.model_dump(mode="json") for r in rules]),
                               as_data([o.model_dump(mode="json") for o in outcomes]),
                               plan.agent.name if plan.agent else _app_of(plan, outcomes))
    logger.info("snapshot %s frozen (%d cases, %d metrics)", snapshot_oid,
                len(outcomes), len(rules))
    score = score_task.with_options(result_storage=storage, refresh_cache=force or not reuse)
    futures = {}
    digests = {rule.metric_name: units_digest(snapshot_oid, plan.store_url,
                                              rule.rule_fingerprint, None) for rule in rules}
    for rule in rules:
        futures[rule.metric_name] = score.submit(
            plan.store_url, snapshot_oid, rule.metric_name, digests[rule.metric_name],
            plan.config_json, plan.config.where, plan.sys_paths, run_id, reuse, force,
            None, concurrency)
    wait_tracked(list(futures.values()), progress)
    units: list[dict[str, Any]] = []
    for name, future in futures.items():
        result = cast(list[dict[str, Any]], future.result())
        stale = [u for u in result if u["run_id"] != run_id and not u["complete"]]
        if stale:  # a cached result may hold incomplete units, which are never reused
            result = cast(list[dict[str, Any]], score.with_options(refresh_cache=True).submit(
                plan.store_url, snapshot_oid, name, digests[name], plan.config_json,
                plan.config.where,
                plan.sys_paths, run_id, reuse, force, None, concurrency).result())
        units.extend(result)
    return publish_task(plan.store_url, run_id, kind, snapshot_oid,
                        as_data([o.model_dump(mode="json") for o in outcomes]), as_data(units),
                        reuse, force,
                        plan.source, plan.skipped_cases, plan.uninferred_cases,
                        str(plan.agent.path) if plan.agent else None)


def _app_of(plan: Plan, outcomes: list[InferenceOutcome]) -> str:
    if not outcomes:
        return plan.eval_set.eval_set_id
    record = repo.get_inference(repo.open_store(plan.store_url), outcomes[0].oid)
    return record.app_name
