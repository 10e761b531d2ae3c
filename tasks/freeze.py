"""Freeze task: a thin adapter over ``evalsnap.pipeline.stages.freeze``."""

from __future__ import annotations

from typing import Any

from google.adk.evaluation.eval_set import EvalSet
from prefect import task

from evalsnap.pipeline import stages
from evalsnap.pipeline.outcomes import InferenceOutcome
from evalsnap.records import MetricRule, repo


@task(name="freeze", persist_result=False)
def freeze_task(store_url: str, eval_set: dict[str, Any], rules: list[dict[str, Any]],
                outcomes: list[dict[str, Any]], app_name: str) -> str:
    oid = stages.freeze(
        store_url, EvalSet.model_validate(eval_set),
        [MetricRule.model_validate(r) for r in rules],
        [InferenceOutcome.model_validate(o) for o in outcomes], app_name)
    repo.open_store(store_url).flush()
    return oid
