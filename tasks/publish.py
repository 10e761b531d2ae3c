"""Publish task: record, manifest last, then Prefect artifacts (a view of the record)."""

from __future__ import annotations

from typing import Any

from prefect import task

from evalsnap.pipeline.publish import PublishRequest, publish_request
from evalsnap.records import repo
from evalsnap.reports.artifacts import publish_artifacts
from evalsnap.reports.summary import summary


@task(name="publish", persist_result=False)
def publish_task(request: PublishRequest) -> dict[str, Any]:
    """Publishes the run; returns its summary (the ``--json`` object)."""
    record_oid, record = publish_request(request)
    store = repo.open_store(request.store_url)
    result = summary(store, record_oid, record)
    # what a bucket bills this run for, by kind (this process's requests: the flow's)
    result["store_requests"] = store.requests.snapshot()
    publish_artifacts(result, request.store_url)
    return result
