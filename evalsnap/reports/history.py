"""``history EVALSET``: per metric, the pass rate and mean score of each run of an eval set.

Runs are found through their manifests (the only pointers to a run; a manifest that
cannot be read is skipped with a warning, as ``ls`` skips it) and measured from their
records and score units. A unit passes when its gate status is ``PASSED`` or
``INFORMATIONAL`` (as a run's verdict counts it); a ``NOT_EVALUATED`` unit counts as not
passed. The mean score is the mean of the metrics' own overall scores that are not None.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, StringConstraints, ValidationError

from evalsnap import startup
from evalsnap.errors import EvalsnapError
from evalsnap.records import EvaluationRecord, repo
from evalsnap.records._base import parse_stored
from evalsnap.records.repo import UNREADABLE_MANIFEST

logger = logging.getLogger(__name__)

#: Unit reads in flight (a remote store answers each read in milliseconds).
_READERS = 8
_BATCH = 512
PASSING = ("PASSED", "INFORMATIONAL")
REPORTS = "reports"
"""Ref namespace of what a run publishes for people, per record: the page
``<record hex>.html`` and its history point ``<record hex>.json``."""
_POINT_LIMIT = 1 << 20


class _MetricPoint(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    units: int
    passed: int
    failed: int
    not_evaluated: int
    incomplete: int
    pass_rate: float | None
    mean_score: float | None


class _RunPoint(BaseModel):
    """A stored history point, as :func:`run_point` makes it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str
    record_id: str
    kind: str
    created_at: str
    passed: bool
    complete: bool
    full: bool
    cases: int
    units: int
    metrics: dict[str, _MetricPoint]
    # the Prefect UI's page of the flow run that published it: a web link, nothing else (a
    # page links it; a crafted point must not put a javascript: or data: URL there)
    flow_run_url: Annotated[str, StringConstraints(pattern=r"^https?://[^\s\"<>]+$",
                                                   max_length=2048)] | None = None


def point_name(record_oid: str) -> str:
    return f"{repo.hexof(record_oid)}.json"


_STARTED = re.compile(r"^(\d{8}T\d{6})Z-")


def duration(run_id: str, created_at: str) -> float | None:
    """Seconds from the start evalsnap's run ids begin with (``20261202T031500Z-…``) to the
    record's creation; None for another id."""
    found = _STARTED.match(run_id)
    try:
        start = dt.datetime.strptime(found.group(1), "%Y%m%dT%H%M%S").replace(tzinfo=dt.UTC) \
            if found else None
        end = dt.datetime.fromisoformat(created_at) if created_at else None
    except ValueError:
        return None
    if start is None or end is None:
        return None
    seconds = (end if end.tzinfo else end.replace(tzinfo=dt.UTC)) - start
    return max(seconds.total_seconds(), 0.0)


def save_point(store: Any, point: dict[str, Any]) -> None:
    """Stores a run's history point beside its page, so that later trends read one small
    file instead of every unit of the run."""
    store.put_ref(REPORTS, point_name(point["record_id"]), json.dumps(point).encode())


def _saved_point(store: Any, record_oid: str, run_id: str) -> dict[str, Any] | None:
    """The stored point of a record if it is one and names this record and run; otherwise
    None (it is only a shortcut: the point is then computed from the units)."""
    data = store.get_ref(REPORTS, point_name(record_oid))
    if data is None:
        return None
    try:
        point = _RunPoint.model_validate(parse_stored(data, what=f"{REPORTS}/{point_name(record_oid)}",
                                                      limit=_POINT_LIMIT)).model_dump()
    except (EvalsnapError, ValidationError) as exc:
        logger.warning("history point of record %s unusable (%s); reading its units", record_oid,
                       str(exc).splitlines()[0])
        return None
    if (point["record_id"], point["run_id"]) != (record_oid, run_id):
        logger.warning("history point of record %s names another record; reading its units",
                       record_oid)
        return None
    return point


def metric_stats(store: Any, record: EvaluationRecord) -> dict[str, dict[str, Any]]:
    """Per metric of ``record``, in the record's order: units, passed, failed,
    not evaluated, pass rate (0-1, None without units) and mean score (None if unscored)."""
    repo.locate_units(store, record)
    stats: dict[str, dict[str, Any]] = {}
    sums: dict[str, list[float]] = {}  # per metric: the scores' sum and count

    def count(refs: list[Any], pool: ThreadPoolExecutor) -> None:
        for ref, unit in zip(refs, pool.map(lambda r: repo.get_unit_verdict(store, r.unit_oid),
                                            refs), strict=True):
            s = stats.setdefault(ref.metric_name, {"units": 0, "passed": 0, "failed": 0,
                                                   "not_evaluated": 0, "incomplete": 0})
            s["units"] += 1
            s["passed"] += unit.status in PASSING
            s["failed"] += unit.status == "FAILED"
            s["not_evaluated"] += unit.status == "NOT_EVALUATED"
            s["incomplete"] += not unit.complete
            if unit.score is not None:
                total = sums.setdefault(ref.metric_name, [0.0, 0])
                total[0] += unit.score
                total[1] += 1

    with ThreadPoolExecutor(max_workers=_READERS) as pool:
        # a batch of units at a time, counted and let go: ``map`` of every unit submitted a
        # future per unit (~100 MB at 10,000 cases × 7 metrics), and the verdicts of every
        # unit held until counted were ~100 MB more at 30,000 cases
        batch: list[Any] = []
        for ref in record.units:
            batch.append(ref)
            if len(batch) == _BATCH:
                count(batch, pool)
                batch = []
                startup.give_back_now_and_then()  # the refs parsed and counted before
        count(batch, pool)
    for name, s in stats.items():
        s["pass_rate"] = s["passed"] / s["units"] if s["units"] else None
        found = sums.get(name)
        s["mean_score"] = found[0] / found[1] if found else None
    return stats


def _cases(record: EvaluationRecord) -> int:
    """How many (eval id, repetition) pairs the record has, inferred or scored: one set of
    the inferred pairs and the scored ones it lacks (a set of each and their union held
    three sets of 30,000 pairs, made from 210,000 units parsed, at once)."""
    inferred = {(i.eval_id, i.repetition) for i in record.inference}
    scored_only = {key for u in record.units if (key := (u.eval_id, u.repetition)) not in inferred}
    return len(inferred) + len(scored_only)


def run_point(store: Any, record_oid: str, record: EvaluationRecord) -> dict[str, Any]:
    """One run of the history: its ids, verdict, size and :func:`metric_stats`."""
    return {
        "run_id": record.run_id, "record_id": record_oid, "kind": record.kind,
        "created_at": record.created_at, "passed": record.summary.passed,
        "complete": record.summary.complete, "full": record.full,
        "cases": _cases(record),
        "units": len(record.units),
        "metrics": metric_stats(store, record),
    }


def runs_by_set(store: Any, names: list[str] | None = None) -> dict[str, list[tuple[str, str]]]:
    """Per eval set, (created_at, run name) of its manifests (``names``: of these runs
    only), oldest first: one listing and one read per manifest, each only parsed
    (validating a manifest costs ~20 ms at 300 cases; only the runs shown are)."""
    found: dict[str, list[tuple[str, str]]] = {}
    for name in store.list_refs("runs") if names is None else names:
        data = store.get_ref("runs", name)
        try:
            raw = parse_stored(data, what=f"manifest runs/{name}") if data is not None else None
        except EvalsnapError as exc:
            logger.warning("skipping run %s: %s", name, exc)
            continue
        if not isinstance(raw, dict) or not isinstance(raw.get("eval_set_id"), str):
            continue
        created = raw.get("created_at")
        found.setdefault(raw["eval_set_id"], []).append(
            (created if isinstance(created, str) else "", name))
    return {eval_set: sorted(runs) for eval_set, runs in found.items()}


def _runs_of(store: Any, eval_set_id: str) -> list[tuple[str, str]]:
    """(created_at, run name) of the manifests of ``eval_set_id``, oldest first."""
    return runs_by_set(store).get(eval_set_id, [])


def history(store: Any, eval_set_id: str, last: int | None = None, *,
            until: str | None = None, exclude_run: str | None = None) -> list[dict[str, Any]]:
    """The :func:`run_point` of each readable run of ``eval_set_id``, newest last: the
    ``last`` newest (all when None), created at or before ``until`` if given, without
    ``exclude_run``. An unreadable manifest or record is skipped with a warning."""
    names = [(c, n) for c, n in _runs_of(store, eval_set_id)
             if (until is None or c <= until) and n != exclude_run]
    points: list[dict[str, Any]] = []
    for _, name in reversed(names):  # newest first, so that `last` stops early
        if last is not None and len(points) >= last:
            break
        try:
            manifest = repo.read_manifest(store, name)
            # the stored point the manifest names (its record and run), else computed from
            # the record: a trend of 120 runs of 10,000 cases reads 120 small files, not
            # 120 records of 40,000 units
            point = _saved_point(store, manifest.record_oid, manifest.run_id)
            if point is None:
                record = repo.get(store, EvaluationRecord, manifest.record_oid)
                point = run_point(store, manifest.record_oid, record)
            points.append(point)
        except UNREADABLE_MANIFEST as exc:
            logger.warning("skipping run %s: %s", name, exc)
        except EvalsnapError as exc:
            logger.warning("skipping run %s: its record or a unit cannot be read (%s)", name,
                           exc)
    return list(reversed(points))


def metric_names(points: list[dict[str, Any]]) -> list[str]:
    """Every metric of the points, in order of first appearance from the newest run back."""
    names: list[str] = []
    for point in reversed(points):
        names += [n for n in point["metrics"] if n not in names]
    return names


def history_table(eval_set_id: str, points: list[dict[str, Any]]) -> Any:
    """A rich Table: per run (newest last), one row per metric: pass rate, units passed,
    mean score."""
    from rich.table import Table

    table = Table(title=f"{eval_set_id} — {len(points)} run(s), newest last")
    table.add_column("run", min_width=23)
    table.add_column("metric", overflow="fold")
    for column in ("pass rate", "passed", "mean"):
        table.add_column(column, justify="right", no_wrap=True)
    for p in points:
        verdict = ("[green]passed[/]" if p["passed"] else
                   "[red]failed[/]" if p["complete"] else "[yellow]incomplete[/]")
        run = (f"{p['created_at'][:16].replace('T', ' ')}\n{p['run_id']}\n{p['kind']}"
               f"{'' if p['full'] else ' (subset)'}, {p['cases']} case(s), {verdict}")
        for i, (name, st) in enumerate(p["metrics"].items()):
            rate = "—" if st["pass_rate"] is None else f"{100 * st['pass_rate']:.1f}%"
            mean = "—" if st["mean_score"] is None else f"{st['mean_score']:.3f}"
            table.add_row(run if i == 0 else "", name, rate, f"{st['passed']}/{st['units']}", mean,
                          end_section=i == len(p["metrics"]) - 1)
    table.caption = "pass rate: units PASSED (or INFORMATIONAL) of all; mean: the metric's score"
    return table


def flaky_cases(store: Any, eval_set_id: str, last: int = 10) -> list[dict[str, Any]]:
    """The case × metric pairs whose status (by each run's repetition gate, see
    :mod:`evalsnap.aggregates`) flipped within the ``last`` newest runs of
    ``eval_set_id``, most flips first: how often it flipped, in how many of the runs it
    passed, and its status per run (oldest first). A run that cannot be read is skipped."""
    from evalsnap.aggregates import aggregates

    names = [n for _, n in _runs_of(store, eval_set_id)][-last:]
    seen: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for name in names:
        try:
            manifest = repo.read_manifest(store, name)
            record = repo.get(store, EvaluationRecord, manifest.record_oid)
            entries = aggregates(record, repo.unit_verdicts(store, record))  # reads each unit
        except UNREADABLE_MANIFEST as exc:
            logger.warning("skipping run %s: %s", name, exc)
            continue
        except EvalsnapError as exc:
            logger.warning("skipping run %s: its record or a unit cannot be read (%s)", name, exc)
            continue
        for a in entries:
            seen.setdefault((a["eval_id"], a["metric"]), []).append(
                {"run_id": record.run_id, "status": a["status"], "verdict": a["verdict"],
                 "passed": a["passed"], "n": a["n"]})
    out = []
    for (eval_id, metric), runs in seen.items():
        statuses = [r["status"] for r in runs]
        if n := flips(statuses):
            out.append({"eval_id": eval_id, "metric": metric, "runs": len(runs), "flips": n,
                        "passed_runs": statuses.count("PASSED"), "history": runs})
    return sorted(out, key=lambda e: (-e["flips"], e["eval_id"], e["metric"]))


def flips(statuses: list[str]) -> int:
    """How often a case × metric's status changed from one run to the next (oldest first;
    the runs it was not in left out): more than 0 is *flaky* in ``history --flaky`` and on
    the site."""
    return sum(a != b for a, b in zip(statuses, statuses[1:], strict=False))


def flaky_table(eval_set_id: str, entries: list[dict[str, Any]], last: int) -> Any:
    """A rich Table of :func:`flaky_cases`."""
    from rich.table import Table

    table = Table(title=f"{eval_set_id} — cases whose status flipped in the last {last} run(s)")
    for column in ("case", "metric", "flips", "passed runs", "statuses, oldest first"):
        table.add_column(column)
    marks = {"PASSED": "[green]P[/]", "FAILED": "[red]F[/]", "NOT_EVALUATED": "[yellow]?[/]"}
    for e in entries:
        table.add_row(e["eval_id"], e["metric"], str(e["flips"]),
                      f"{e['passed_runs']}/{e['runs']}",
                      " ".join(marks.get(r["status"], "?") for r in e["history"]))
    table.caption = "P passed · F failed · ? incomplete (each run by its own repetition gate)"
    return table
