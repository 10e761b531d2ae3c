"""The site's data: one row per run of an eval set, what its pages show of that run.

A publish refreshes its eval set's pages from the rows of the eval set's earlier runs. They
are kept per eval set in the store (``v1/refs/site/<set page name>.json``), so that the
refresh reads one small file instead of every manifest, record and unit of every run. That
file is only an acceleration, as a history point is: one that is missing, unusable or of
another eval set is rebuilt from the runs' records (:func:`rebuild`), and ``evalsnap site``
rebuilds every one. It is parsed strictly (plain data, no code).

A row's numbers are the ones ``show --json`` and ``history`` give: the pass rate per metric
is :func:`evalsnap.reports.history.metric_stats`'s, the case statuses are the record's
aggregates by its repetition gate (:mod:`evalsnap.aggregates`, through
:func:`evalsnap.reports.summary.summary`), regressions are the summary's against the run's
own baseline.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from evalsnap.errors import EvalsnapError
from evalsnap.records import EvaluationRecord, repo
from evalsnap.records._base import parse_stored
from evalsnap.records.repo import UNREADABLE_MANIFEST
from evalsnap.reports.history import _saved_point, duration, run_point, runs_by_set
from evalsnap.reports.summary import subset_text, summary
from evalsnap.reports.summary_model import RecordResult

logger = logging.getLogger(__name__)

SITE = "site"
"""Ref namespace of the site's data: ``<set page name>.json`` per eval set."""
_DATA_LIMIT = 64 << 20
#: Runs whose case statuses a row keeps (the per-case history shows this many).
CASE_RUNS = 30


class MetricRate(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    passed: int
    units: int
    pass_rate: float | None
    mean_score: float | None


class RunRow(BaseModel):
    """One run as the site shows it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str
    record_id: str
    kind: str
    created_at: str
    full: bool
    covers: str
    """``full``, or what the subset leaves out."""
    passed: bool
    complete: bool
    cases: int
    metrics: dict[str, MetricRate]
    regressions: int | None
    """Units regressed against the run's baseline; None when it was compared with none."""
    fixes: int | None
    baseline_run: str | None
    duration: float | None
    """Seconds from the start its run id names to its record; None for a run id given by hand."""
    cost: float | None
    cost_note: str | None
    statuses: dict[str, dict[str, str]]
    """Per case, per metric: its status by the run's repetition gate (empty in old rows)."""
    flaky: dict[str, list[str]]
    """Per case, the metrics whose repetitions disagreed within the run."""


#: A row's fields of one value per case × metric (:attr:`RunRow.statuses`, ``flaky``):
#: left out wherever a row is read as a run's values (tables, the trend), which would
#: otherwise copy them for every row (30 runs of 30,000 cases × 7 metrics: ~330 MB).
PER_CASE = frozenset({"statuses", "flaky"})


def run_values(row: RunRow) -> dict[str, Any]:
    """``row`` as a dict, without its per-case fields (:data:`PER_CASE`)."""
    return row.model_dump(exclude=set(PER_CASE))


class SetData(BaseModel):
    """The rows of an eval set's runs, oldest first."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = 1
    eval_set_id: str
    runs: list[RunRow]


def page_name(value: str) -> str:
    """A path segment for an id (eval set, run, case ids come from user files): the id
    itself when it is lower-case letters, digits, ``_`` and ``-`` only, else a readable
    slug and a hash of the id, so that no two ids share a name (on a case-insensitive disk
    too) and no id can leave its folder or break a link."""
    slug = re.sub(r"[^a-z0-9_-]+", "-", value.lower()).strip("-_")[:60] or "id"
    if slug == value:
        return value
    import hashlib

    return f"{slug}-{hashlib.sha256(value.encode()).hexdigest()[:12]}"


def run_row(store: Any, record_oid: str, record: EvaluationRecord,
            result: RecordResult | None = None, point: dict[str, Any] | None = None) -> RunRow:
    """The row of a record; ``result``: its :func:`summary`, ``point``: its history point,
    if made already."""
    result = result if result is not None else summary(store, record_oid, record)
    point = point or _saved_point(store, record_oid, record.run_id) or run_point(store, record_oid,
                                                                          record)
    base = result.baseline
    compared = bool(base is not None and base.record_oid and not base.note)
    statuses: dict[str, dict[str, str]] = {}
    flaky: dict[str, list[str]] = {}
    for a in result.aggregates:
        statuses.setdefault(a.eval_id, {})[a.metric] = a.status
        if a.verdict == "flaky":
            flaky.setdefault(a.eval_id, []).append(a.metric)
    return RunRow(
        run_id=record.run_id, record_id=record_oid, kind=record.kind,
        created_at=record.created_at, full=record.full,
        covers="full" if record.full else subset_text(result).strip(" ()") or "subset",
        passed=result.passed, complete=result.complete, cases=point["cases"],
        metrics={n: MetricRate(**{k: m[k] for k in MetricRate.model_fields})
                 for n, m in point["metrics"].items()},
        regressions=len(result.regressions) if compared else None,
        fixes=len(result.fixes) if compared else None,
        baseline_run=base.run_id if compared and base is not None else None,
        duration=duration(record.run_id, record.created_at),
        cost=result.estimated_cost, cost_note=result.cost_note,
        statuses=statuses, flaky=flaky)


def data_name(eval_set_id: str) -> str:
    return f"{page_name(eval_set_id)}.json"


def load(store: Any, eval_set_id: str) -> SetData | None:
    """The stored rows of ``eval_set_id``, or None (missing, or unusable: with a warning)."""
    data = store.get_ref(SITE, data_name(eval_set_id))
    return None if data is None else _parse(data, data_name(eval_set_id), eval_set_id)


def _parse(data: bytes, name: str, eval_set_id: str | None = None) -> SetData | None:
    try:
        found = SetData.model_validate(parse_stored(data, what=f"{SITE}/{name}",
                                                    limit=_DATA_LIMIT))
    except (EvalsnapError, ValidationError) as exc:
        logger.warning("site data %s unusable (%s); rebuilding it from the runs", name,
                       str(exc).splitlines()[0])
        return None
    if eval_set_id is not None and found.eval_set_id != eval_set_id:
        logger.warning("site data %s is of another eval set; rebuilding it from the runs", name)
        return None
    return found


def load_all(store: Any) -> list[SetData]:
    """Every eval set's stored rows (one listing, one read each), by eval set id."""
    found = []
    for name in store.list_refs(SITE):
        data = store.get_ref(SITE, name) if name.endswith(".json") else None
        parsed = _parse(data, name) if data is not None else None
        if parsed is not None and data_name(parsed.eval_set_id) == name:
            found.append(parsed)
    return sorted(found, key=lambda d: d.eval_set_id)


def save(store: Any, data: SetData) -> None:
    store.put_ref(SITE, data_name(data.eval_set_id), data.model_dump_json().encode())


def with_row(data: SetData | None, eval_set_id: str, row: RunRow) -> SetData:
    """``data`` with ``row`` in (replacing the same run's), oldest first; case statuses kept
    for the newest :data:`CASE_RUNS` runs only (the file stays small over years)."""
    rows = sorted([r for r in (data.runs if data else []) if r.run_id != row.run_id] + [row],
                  key=lambda r: (r.created_at, r.run_id))
    old = len(rows) - CASE_RUNS
    rows = [r.model_copy(update={"statuses": {}, "flaky": {}}) if i < old else r
            for i, r in enumerate(rows)]
    return SetData(eval_set_id=eval_set_id, runs=rows)


@dataclass(frozen=True)
class Current:
    """The site's rows of the store's runs as they are now (:func:`current`): ``rows``, the
    publishing run's eval set's (without that run), ``others``, every other eval set's."""

    rows: SetData
    others: list[SetData]

    def trend(self, created_at: str, last: int) -> list[dict[str, Any]]:
        """The ``last`` newest rows created at or before ``created_at``, oldest first, as
        the trend's points (a row holds what a history point holds for the trend; its case
        statuses, one per case × metric, are left out)."""
        before = [r for r in self.rows.runs if r.created_at <= created_at]
        return [run_values(r) for r in before[max(len(before) - last, 0):]] if last > 0 else []


def current(store: Any, eval_set_id: str, *, publishing: str) -> Current | None:
    """The rows of every eval set, checked against the store's runs: a row whose run is no
    longer listed is left out; a listed run that no eval set's rows name (published by a
    run whose refresh failed, an older evalsnap, or another process just now) has its
    manifest read and, if it is of ``eval_set_id``, its row made from its record. The run
    ``publishing`` is left out (its row is the caller's). None when ``eval_set_id`` has no
    usable data yet (the caller reads the manifests instead, as :func:`rebuild` does).

    What a publish pays for its trend and its site: two listings and one read per eval
    set, not a read of every run's manifest and point (which grew with the runs kept)."""
    listed = set(store.list_refs("runs"))
    sets = load_all(store)
    mine = next((d for d in sets if d.eval_set_id == eval_set_id), None)
    if mine is None:
        return None
    named = {repo.ref_name(r.run_id) for d in sets for r in d.runs}
    unknown = sorted(listed - named - {repo.ref_name(publishing)})
    rows = SetData(eval_set_id=eval_set_id,
                   runs=[r for r in mine.runs if repo.ref_name(r.run_id) in listed
                         and r.run_id != publishing])
    if unknown:
        found = [n for _, n in runs_by_set(store, unknown).get(eval_set_id, [])]
        for row in rebuild(store, eval_set_id, found).runs:
            rows = with_row(rows, eval_set_id, row)
    return Current(rows=rows, others=[d for d in sets if d.eval_set_id != eval_set_id])


def rebuild(store: Any, eval_set_id: str, names: list[str] | None = None, *,
            known: dict[str, RunRow] | None = None) -> SetData:
    """The rows of every readable run of ``eval_set_id`` (``names``: its manifests' names,
    oldest first, if listed already), read from the records; a run that cannot be read is
    skipped with a warning, as ``history`` skips it. ``known``: rows made already, by
    record id (the publishing run's: its record is not summarized twice)."""
    if names is None:
        names = [n for _, n in runs_by_set(store).get(eval_set_id, [])]
    data: SetData | None = None
    for name in names:
        try:
            manifest = repo.read_manifest(store, name)
            row = (known or {}).get(manifest.record_oid)
            if row is None:
                record = repo.get(store, EvaluationRecord, manifest.record_oid)
                row = run_row(store, manifest.record_oid, record)
            data = with_row(data, eval_set_id, row)
        except UNREADABLE_MANIFEST as exc:
            logger.warning("site: skipping run %s: %s", name, exc)
        except EvalsnapError as exc:
            logger.warning("site: skipping run %s: its record or a unit cannot be read (%s)",
                           name, exc)
    return data or SetData(eval_set_id=eval_set_id, runs=[])
