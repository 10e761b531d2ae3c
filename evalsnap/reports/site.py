"""A browsable static site of the store's runs (``v1/site/``; ``evalsnap site --out DIR``).

Pages, all linked relatively, so that the same tree works from a bucket's URL, a CDN, or a
folder opened with ``file://``:

* ``index.html`` — the eval sets: runs, the latest run, the pass rate per metric of the
  latest full run;
* ``sets/<set>/index.html`` — an eval set's runs (date, kind, covers, pass rate per metric,
  regressions, duration, cost, links) and the trend of its full runs; subsets are listed
  apart and never drawn in the trend (they measure part of the set);
* ``sets/<set>/cases.html`` — per case × metric, its status in each of the last runs, and
  a *flaky* marker when it flipped (as ``history --flaky`` counts flips) or its
  repetitions disagreed within a run;
* ``runs/<run>/index.html`` — a run's page: the report's page (:mod:`.html`) with the
  cases' invocation rows and judge ledgers on pages of their own, ``CASES_PER_PAGE`` cases
  each (``runs/<run>/cases/<n>.html#case-<case>``), so that the run's page stays small and
  a run writes a handful of objects, not one per case (a bucket bills each PUT).

Same rules as the report: inline CSS, no script, a Content-Security-Policy that forbids
every fetch, every value escaped by jinja2's autoescaping; ids become path segments only
through :func:`~._site_data.page_name`. A publish refreshes the pages its run changes
(:func:`refresh`): the index, its eval set's two pages and the run's own, from the eval
set's stored rows (:mod:`._site_data`); :func:`build` makes the whole tree from the records.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from evalsnap.records import EvaluationRecord, repo
from evalsnap.reports import _site_data as data
from evalsnap.reports._site_data import CASE_RUNS, Current, RunRow, SetData, current, page_name
from evalsnap.reports.history import flips, metric_names, runs_by_set
from evalsnap.reports.html import (
    _dots,
    duration_text,
    page_context,
    render_bytes,
    render_parts,
    template,
)
from evalsnap.reports.summary_model import RecordResult

__all__ = ["CONTENT_TYPE", "Current", "after_gc", "build", "current", "forget", "refresh",
           "run_pages", "set_pages", "write_dir"]

logger = logging.getLogger(__name__)

CONTENT_TYPE = "text/html; charset=utf-8"
#: Full runs the eval set's trend draws.
TREND_RUNS = 120
#: Case × metric lines of an eval set's case history page, flaky ones first (10,000 cases × 4
#: metrics × 30 runs would be a page of 1.2 million cells).
CASE_LINES = 2000
#: Detailed cases per case page of a run (``EVALSNAP_REPORT_DETAIL_CASES`` = 200: 8 pages).
CASES_PER_PAGE = 25


def _run_dir(run_id: str) -> str:
    return f"runs/{page_name(run_id)}"


def _set_dir(eval_set_id: str) -> str:
    return f"sets/{page_name(eval_set_id)}"


def _render(name: str, **values: Any) -> bytes:
    return render_bytes(template(name), **values)


def _row(r: RunRow, up: str) -> dict[str, Any]:
    """A run's values for a table (``up``: the relative way back to the site's root)."""
    return {**data.run_values(r), "when": r.created_at[:16].replace("T", " "),
            "href": f"{up}{_run_dir(r.run_id)}/index.html", "duration_text": duration_text(r.duration),
            "verdict": "passed" if r.passed else "failed" if r.complete else "incomplete",
            "cost_text": f"{r.cost:.6f}" if r.cost is not None else "—",
            "metrics": {n: m.model_dump() for n, m in r.metrics.items()}}


def index_page(sets: list[SetData]) -> bytes:
    """``index.html``: one row per eval set."""
    rows = []
    for s in sets:
        full = [r for r in s.runs if r.full]
        latest = s.runs[-1] if s.runs else None
        rows.append({"eval_set_id": s.eval_set_id, "href": f"{_set_dir(s.eval_set_id)}/index.html",
                     "runs": len(s.runs), "full_runs": len(full),
                     "latest": _row(latest, "") if latest else None,
                     "latest_full": _row(full[-1], "") if full else None})
    return _render("site_index.html", sets=rows)


def set_pages(s: SetData) -> dict[str, bytes]:
    """``sets/<set>/index.html`` (runs, trend of full runs) and ``cases.html``."""
    rows = [_row(r, "../../") for r in reversed(s.runs)]  # newest first
    full = [data.run_values(r) for r in s.runs if r.full][-TREND_RUNS:]
    names = metric_names([{"metrics": r.metrics} for r in s.runs])
    trend = [{"name": n, "dots": _dots(n, full, width=480, height=34)} for n in names]
    nav = [("all eval sets", "../../index.html"), ("case history", "cases.html")]
    base = _set_dir(s.eval_set_id)
    return {
        f"{base}/index.html": _render(
            "site_set.html", eval_set_id=s.eval_set_id, nav=nav, metrics=names, trend=trend,
            full_runs=[r for r in rows if r["full"]], subset_runs=[r for r in rows if not r["full"]],
            trend_count=len(full)),
        f"{base}/cases.html": _render(
            "site_cases.html", eval_set_id=s.eval_set_id,
            nav=[("all eval sets", "../../index.html"), ("runs", "index.html")], **_case_history(s)),
    }


#: A status as one letter in the case history (a repetition disagreement adds ``~``).
_LETTERS = {"PASSED": "P", "FAILED": "F", "NOT_EVALUATED": "?", "INFORMATIONAL": "I"}


def _case_history(s: SetData) -> dict[str, Any]:
    """Per case × metric, its status in each of the newest :data:`CASE_RUNS` runs (oldest
    first), how often it flipped and whether its repetitions disagreed in any of them."""
    runs = [r for r in s.runs if r.statuses][-CASE_RUNS:]
    cases: dict[str, None] = {}  # every case once (its id is the rows' own string)
    for r in runs:
        cases.update(dict.fromkeys(r.statuses))

    def cells(case: str, metric: str) -> tuple[list[str | None], list[bool]]:
        return ([r.statuses.get(case, {}).get(metric) for r in runs],
                [metric in r.flaky.get(case, []) for r in runs])

    counted = {"flaky": 0, "lines": 0}

    def ranked() -> Iterator[tuple[bool, int, str, str]]:
        """Every case × metric as a small tuple, flaky first (most flips first), stable
        after, in (case, metric) order: made one at a time, and only the lines shown are
        kept (30,000 cases × 7 metrics were 210,000 pairs and as many tuples, ~40 MB, at
        the run's peak)."""
        for case in cases:
            metrics: dict[str, None] = {}
            for r in runs:
                metrics.update(dict.fromkeys(r.statuses.get(case, ())))
            for metric in metrics:
                statuses, disagreed = cells(case, metric)
                n = flips([x for x in statuses if x is not None])
                stable = not (n > 0 or any(disagreed))
                counted["lines"] += 1
                counted["flaky"] += not stable
                yield stable, -n, case, metric

    lines: list[dict[str, Any]] = []
    # the key is distinct per line: the first CASE_LINES are those of a sort of them all
    for stable, minus_flips, case, metric in heapq.nsmallest(CASE_LINES, ranked()):
        statuses, disagreed = cells(case, metric)
        lines.append({"eval_id": case, "metric": metric, "flips": -minus_flips,
                      # (status, letter) per run: the page renders each distinct line of
                      # them once (most lines of a stable set are alike)
                      "cells": tuple((x, _LETTERS.get(x or "", "?") + ("~" if d else ""))
                                     for x, d in zip(statuses, disagreed, strict=True)),
                      "flaky": not stable})
    return {"runs": [_row(r, "../../") for r in runs], "lines": lines, "made": {},
            "n_flaky": counted["flaky"], "n_lines": counted["lines"]}


def run_pages(store: Any, record_oid: str, record: EvaluationRecord, *,
              context: dict[str, Any] | None = None,
              earlier: list[dict[str, Any]] | None = None) -> dict[str, bytes]:
    """``runs/<run>/index.html`` and its case pages under ``runs/<run>/cases/``
    (``CASES_PER_PAGE`` detailed cases each, in the page's order), from the report's
    :func:`~.html.page_context` (``context``: made already; ``earlier``: the trend's points
    before the run, when known)."""
    pages: dict[str, bytes] = {}
    for batch in _run_page_batches(store, record_oid, record, context=context, earlier=earlier):
        pages.update((name, page if isinstance(page, bytes) else b"".join(page))
                     for name, page in batch.items())
    return pages


def _run_page_batches(store: Any, record_oid: str, record: EvaluationRecord, *,
                      context: dict[str, Any] | None = None,
                      earlier: list[dict[str, Any]] | None = None
                      ) -> Iterator[dict[str, bytes | Iterator[bytes]]]:
    """:func:`run_pages` in two batches, each made once the one before is let go: the case
    pages, then the run's page (~40 MB at 10,000 cases, made once the case pages, ~11 MB,
    are written), as its parts while it is rendered (:func:`~.html.render_parts`)."""
    ctx = context if context is not None else page_context(store, record_oid, record,
                                                           earlier=earlier)
    base, up = _run_dir(record.run_id), "../../"
    nav = [("all eval sets", f"{up}index.html"),
           (f"eval set {record.eval_set_id}", f"{up}{_set_dir(record.eval_set_id)}/index.html"),
           ("case history", f"{up}{_set_dir(record.eval_set_id)}/cases.html")]
    by_case: dict[str, list[dict[str, Any]]] = {}  # in the page's order
    # the others are a row of scores on the run's page (EVALSNAP_REPORT_DETAIL_CASES)
    for c in ctx["cases"].detailed():
        by_case.setdefault(c["case"]["eval_id"], []).append(c)  # repetitions share a page
    back = [("run " + record.run_id, "../index.html")] + [(label, "../" + href) for label, href in nav]
    pages: dict[str, bytes | Iterator[bytes]] = {}
    ids = list(by_case)
    for start in range(0, len(ids), CASES_PER_PAGE):
        number = start // CASES_PER_PAGE + 1
        cases: list[dict[str, Any]] = []
        for eval_id in ids[start:start + CASES_PER_PAGE]:
            anchor = _case_anchor(eval_id)
            for c in by_case[eval_id]:
                c["href"] = f"cases/{number}.html#{anchor}"  # the run's page links it
            cases.append({"eval_id": eval_id, "anchor": anchor, "repetitions": sorted(
                by_case[eval_id], key=lambda c: c["case"]["repetition"])})
        pages[f"{base}/cases/{number}.html"] = _render(
            "site_case.html", record=record, record_oid=record_oid, cases=cases, nav=back)
    if pages:
        yield pages
    del pages
    # every link of the site is relative (it opens from any base); the flow run's link is
    # on the stored report and the Prefect artifacts
    yield {f"{base}/index.html": render_parts(template("report.html"),
                                              **{**ctx, "nav": nav, "flow_run_url": None})}


def _case_anchor(eval_id: str) -> str:
    """The fragment of a case's section on its case page (safe: :func:`page_name`)."""
    return f"case-{page_name(eval_id)}"


def refresh(store: Any, record_oid: str, record: EvaluationRecord, result: RecordResult,
            context: dict[str, Any] | None = None,
            now: Current | None = None) -> list[str]:
    """After a run's commit: its row into its eval set's data, then the pages it changes
    (the index and its eval set's pages in one batch, its own in two more: its case pages,
    then its page). ``result``: its summary; ``context``: its report's page context, if
    made already (its page and history point are read once per run); ``now``: the site's
    rows as :func:`current` read them for the page's trend, if it did. Returns the names of
    the pages written."""
    row = data.run_row(store, record_oid, record, result,
                       point=context["point"] if context is not None else None)
    found = now.rows if now is not None else data.load(store, record.eval_set_id)
    rows = data.with_row(found, record.eval_set_id, row) if found is not None else \
        data.rebuild(store, record.eval_set_id, known={record_oid: row})
    if row.run_id not in {r.run_id for r in rows.runs}:  # not listed yet: eventual listing
        rows = data.with_row(rows, record.eval_set_id, row)
    data.save(store, rows)
    others = now.others if now is not None else data.load_all(store)
    sets = [s for s in others if s.eval_set_id != rows.eval_set_id] + [rows]
    # in batches, each made once the one before is written: the index and the eval set's
    # pages, the run's case pages, then the run's page (~30 MB at 10,000 cases)
    shared = {"index.html": index_page(sorted(sets, key=lambda s: s.eval_set_id)),
              **set_pages(rows)}
    store.put_site(shared, CONTENT_TYPE)
    written = list(shared)
    del shared
    for batch in _run_page_batches(store, record_oid, record, context=context):
        store.put_site(batch, CONTENT_TYPE)
        written += batch
        del batch
    return written


def forget(store: Any, removed: list[dict[str, Any]]) -> int:
    """After gc removed runs (``removed``: gc's ``runs_removed`` entries): their rows out of
    their eval sets' data, those sets' pages and the index written again, the runs' own
    pages deleted, so that the site lists and links only runs that still exist. Returns
    the number of pages deleted."""
    if not removed:
        return 0
    gone: dict[str, set[str]] = {}
    for run in removed:
        gone.setdefault(run["eval_set_id"], set()).add(run["run_id"])
    pages: dict[str, bytes] = {}
    for eval_set_id, run_ids in gone.items():
        found = data.load(store, eval_set_id)
        rows = SetData(eval_set_id=eval_set_id,
                       runs=[r for r in found.runs if r.run_id not in run_ids]) \
            if found is not None else data.rebuild(store, eval_set_id)
        data.save(store, rows)
        pages.update(set_pages(rows))
    sets = sorted((s for s in data.load_all(store) if s.runs), key=lambda s: s.eval_set_id)
    pages["index.html"] = index_page(sets)
    store.put_site(pages, CONTENT_TYPE)
    return sum(store.delete_site(_run_dir(run["run_id"])) for run in removed)


def after_gc(store: Any, report: Any) -> None:
    """:func:`forget` the runs a (real) gc removed; a failure is one of the gc's warnings
    (the site is a view: ``evalsnap site --store-site`` writes it whole again)."""
    if report.dry_run or not report.runs_removed:
        return
    try:
        forget(store, report.runs_removed)
    except Exception as exc:  # noqa: BLE001 - a view of the store must not fail its gc
        report.warnings.append(f"could not update the store's site (v1/site/) for the "
                               f"removed runs: {exc}; `evalsnap site --store-site` writes it "
                               "again")


def build(store: Any, *, save: bool = False) -> dict[str, bytes]:
    """Every page of the site, from the records (``save``: the eval sets' rows too, as a
    refresh reads them)."""
    sets, pages = [], {}
    for eval_set_id, runs in sorted(runs_by_set(store).items()):
        s = data.rebuild(store, eval_set_id, [n for _, n in runs])
        if save:
            data.save(store, s)
        sets.append(s)
        pages.update(set_pages(s))
        for i, r in enumerate(s.runs):  # the trend from the rows: no history walk per run
            earlier = [data.run_values(x) for x in s.runs[:i] if x.created_at <= r.created_at]
            pages.update(run_pages(store, r.record_id, repo.get(store, EvaluationRecord,
                                                                r.record_id), earlier=earlier))
    pages["index.html"] = index_page(sets)
    return pages


def write_dir(out: str | Path, pages: dict[str, bytes]) -> Path:
    """Writes the pages under ``out`` (created if needed); returns its absolute path."""
    root = Path(out).expanduser().absolute()
    for path, content in pages.items():
        target = root.joinpath(*path.split("/"))
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_bytes(content)
        tmp.replace(target)
    return root
