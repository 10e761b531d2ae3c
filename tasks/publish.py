"""Publish task: record, manifest last, then Prefect artifacts (a view of the record)."""

from __future__ import annotations

from typing import Any

from prefect import task

from evalsnap.pipeline import publish as publishing
from evalsnap.pipeline.outcomes import InferenceOutcome, UnitOutcome
from evalsnap.records import repo
from evalsnap.reports.artifacts import publish_artifacts
from evalsnap.reports.summary import summary


@task(name="publish", persist_result=False)
def publish_task(store_url: str, run_id: str, kind: str, snapshot_oid: str,
                 inference: list[dict[str, Any]], units: list[dict[str, Any]], reuse: bool,
                 force: bool, source: str | None = None, skipped_cases: list[str] | None = None,
                 uninferred_cases: list[str] | None = None,
                 agent_dir: str | None = None) -> dict[str, Any]:
    """Publishes and returns the run's summary (the ``--json`` object)."""
    from evalsnap.adk.history import history_writer

    record_oid, record = publishing.publish(
        store_url, run_id=run_id, kind=kind, snapshot_oid=snapshot_oid,
        inference=[InferenceOutcome.model_validate(i) for i in inference],
        units=[UnitOutcome.model_validate(u) for u in units], reuse=reuse, force=force,
        source=source, skipped_cases=skipped_cases, uninferred_cases=uninferred_cases,
        history_writer=history_writer(store_url, agent_dir))
    result = summary(repo.open_store(store_url), record_oid, record)
    publish_artifacts(result, store_url)
    return result
