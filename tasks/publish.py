"""Publish task: record, manifest last (the commit); then the record's views: the HTML page
beside it, the store's browsable site (``v1/site/``) and the Prefect artifacts."""

from __future__ import annotations

import datetime as dt
import logging

from prefect import task

from evalsnap import startup
from evalsnap.pipeline import context
from evalsnap.pipeline.publish import PublishRequest, publish_request
from evalsnap.reports.artifacts import publish_artifacts
from evalsnap.reports.html import TREND_RUNS, report_link, store_report
from evalsnap.reports.site import current as site_rows
from evalsnap.reports.site import refresh as refresh_site
from evalsnap.reports.summary import summary
from evalsnap.reports.summary_model import RecordResult
from tasks.support import current_flow_run_url

logger = logging.getLogger(__name__)


@task(name="publish", persist_result=False)
def publish_task(request: PublishRequest) -> RecordResult:
    """Publishes the run; returns its summary (the ``--json`` object's model)."""
    ctx = context.of(request.store_url)
    record_oid, record = publish_request(request, ctx)
    # The record names every unit and inference now. What scoring and inference returned
    # (70,000 UnitOutcomes at 10,000 cases × 7 metrics, ~100 MB) is let go for the rest of
    # the task, its pages and summary: Prefect holds the request until the task ends (and
    # this task has no retries to need it again).
    request.units.clear()
    request.inference.clear()
    startup.give_back_freed()  # what publish let go before its views
    store = ctx.store
    # Presentation after the commit: a signal waits only for the commit, and a page that
    # could not be written is written again by `evalsnap report RECORD` at any time.
    link: tuple[str | None, int | None] = (None, None)
    page = None
    now = None
    try:  # the site's rows of the eval set's runs: the page's trend and the site's refresh
        now = site_rows(store, record.eval_set_id, publishing=record.run_id)
    except Exception as exc:  # noqa: BLE001 - a view: the page reads the manifests instead
        logger.warning("could not read the store's site data (%s); the trend reads the "
                       "runs' manifests", exc)
    # the summary first: its regressions and fixes are the page's too (made once)
    result = summary(store, record_oid, record)
    try:  # the HTML report beside the record (v1/refs/reports/<record hex>.html)
        page = store_report(store, record_oid, record, flow_run_url=current_flow_run_url(),
                            earlier=None if now is None else now.trend(
                                record.created_at, TREND_RUNS - 1), known=result)
        link = report_link(store, record_oid)
    except Exception as exc:  # noqa: BLE001 - a view of the record must not lose the run
        logger.warning("could not write the HTML report of record %s: %s", record_oid, exc)
    url, expires = link
    result = result.model_copy(update={
        # a link a browser opens (artifacts, events, --json): public, signed or local
        "report_url": url,
        "report_url_expires": None if expires is None else (
            dt.datetime.now(dt.UTC) + dt.timedelta(seconds=expires)).isoformat(timespec="seconds")})
    try:  # the site's pages this run changes (v1/site/); `evalsnap site` rebuilds them all
        refresh_site(store, record_oid, record, result, context=page, now=now)
    except Exception as exc:  # noqa: BLE001 - a view of the record must not lose the run
        logger.warning("could not refresh the store's site (v1/site/) for record %s: %s; "
                       "`evalsnap site --store-site` writes it again", record_oid, exc)
    # what a bucket bills this run for, by kind (this process's requests: the flow's), its
    # report and site included
    result = result.model_copy(update={"store_requests": store.requests.snapshot()})
    publish_artifacts(result, request.store_url)
    return result
