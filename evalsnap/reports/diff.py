"""``diff RECORD_A RECORD_B``: per case × metric, what changed and which input moved.

An input "moved" when the part of the unit key it feeds differs between the two
records: ``inference`` (what the agent produced), ``reference`` (the frozen eval
case), ``rule`` (criterion, threshold, judge options or evaluator identity). The
answer comes from the stored fingerprints and the snapshots' frozen cases, never
from the eval set files, which may have changed or gone since.
"""

from __future__ import annotations

from typing import Any

from evalsnap.errors import EvalsnapError
from evalsnap.fingerprint import short
from evalsnap.records import EvaluationRecord, FrozenCase, MetricRule, ScoreUnit, Snapshot, UnitRef, repo
from evalsnap.records.snapshot import cases_by_key
from evalsnap.reports._agent_changes import AgentChanges

__all__ = ["diff", "diff_table", "moved", "nothing_moved"]

Key = tuple[str, int, str]


class _Side:
    """One record with its units, frozen cases and rules loaded."""

    def __init__(self, store: Any, oid: str, record: EvaluationRecord) -> None:
        self.store, self.oid, self.record = store, oid, record
        snapshot: Snapshot | None = (repo.get_snapshot(store, record.snapshot_oid)
                                     if record.snapshot_oid else None)
        self.cases = cases_by_key(snapshot)
        self.rules: dict[str, MetricRule] = (
            {r.metric_name: r for r in snapshot.rules} if snapshot else {})
        self.refs: dict[Key, UnitRef] = {
            (u.eval_id, u.repetition, u.metric_name): u for u in record.units}
        self._units: dict[str, ScoreUnit | None] = {}

    def unit(self, ref: UnitRef) -> ScoreUnit | None:
        if ref.unit_oid not in self._units:
            try:
                self._units[ref.unit_oid] = repo.get(self.store, ScoreUnit, ref.unit_oid)
            except EvalsnapError:
                self._units[ref.unit_oid] = None
        return self._units[ref.unit_oid]

    def inference_content(self, case: FrozenCase) -> Any:
        try:
            return repo.get_inference(self.store, case.inference_oid).content()
        except EvalsnapError:
            return None


def _moved(a: _Side, b: _Side, key: Key, ra: UnitRef, rb: UnitRef) -> list[str]:
    moved = []
    ca, cb = a.cases.first(key[:2]), b.cases.first(key[:2])
    if ca is not None and cb is not None:
        if ca.inference_oid != cb.inference_oid and (
                ca.inference_fingerprint != cb.inference_fingerprint
                or a.inference_content(ca) != b.inference_content(cb)):
            moved.append("inference")
        if ca.reference != cb.reference:
            moved.append("reference")
    elif ra.case_fingerprint != rb.case_fingerprint:
        moved.append("case")  # imported records carry no snapshot to tell which part
    if ra.rule_fingerprint != rb.rule_fingerprint:
        moved.append("rule")
    return moved


def _rule_changes(a: _Side, b: _Side, metric: str) -> list[str]:
    ra, rb = a.rules.get(metric), b.rules.get(metric)
    if ra is None or rb is None or ra.rule_fingerprint == rb.rule_fingerprint:
        return []
    out = []
    if ra.threshold != rb.threshold:
        out.append(f"threshold {ra.threshold} → {rb.threshold}")
    if ra.evaluator != rb.evaluator:
        out.append("evaluator identity")
    if {k: v for k, v in ra.criterion.items() if k != "threshold"} != {
            k: v for k, v in rb.criterion.items() if k != "threshold"}:
        out.append("criterion")
    return out


def _entry(a: _Side, b: _Side, key: Key) -> dict[str, Any]:
    ra, rb = a.refs.get(key), b.refs.get(key)
    ua = a.unit(ra) if ra else None
    ub = b.unit(rb) if rb else None
    entry: dict[str, Any] = {
        "eval_id": key[0], "repetition": key[1], "metric": key[2],
        "score_a": ua.score if ua else None, "score_b": ub.score if ub else None,
        "status_a": ua.status if ua else None, "status_b": ub.status if ub else None,
    }
    if ra is None or rb is None:
        entry.update(change="added" if ra is None else "removed", moved=[], same_unit=False)
        return entry
    entry["same_unit"] = ra.unit_fingerprint == rb.unit_fingerprint
    entry["moved"] = [] if entry["same_unit"] else _moved(a, b, key, ra, rb)
    if "rule" in entry["moved"]:
        entry["rule_changes"] = _rule_changes(a, b, key[2])
    score_changed = entry["score_a"] != entry["score_b"]
    status_changed = entry["status_a"] != entry["status_b"]
    entry["change"] = ("status" if status_changed else "score" if score_changed
                       else "inputs" if entry["moved"] else "none")
    return entry


def diff(store: Any, a_oid: str, a: EvaluationRecord, b_oid: str,
         b: EvaluationRecord) -> dict[str, Any]:
    """One JSON-ready object: both records and one entry per case × metric of either."""
    side_a, side_b = _Side(store, a_oid, a), _Side(store, b_oid, b)
    keys = list(side_a.refs)
    keys += [k for k in side_b.refs if k not in side_a.refs]
    entries = [_entry(side_a, side_b, k) for k in keys]
    inferences, agent_changes = AgentChanges(store).of_records(a, b)
    why = {(i["eval_id"], i["repetition"]): i["changes"] for i in inferences}
    for e in entries:
        if "inference" in e["moved"]:
            e["agent_changes"] = why.get((e["eval_id"], e["repetition"]), [])
    counts: dict[str, int] = {}
    for e in entries:
        counts[e["change"]] = counts.get(e["change"], 0) + 1
    return {
        "record_a": a_oid, "record_b": b_oid, "run_a": a.run_id, "run_b": b.run_id,
        "eval_set_a": a.eval_set_id, "eval_set_b": b.eval_set_id,
        "snapshot_a": a.snapshot_oid, "snapshot_b": b.snapshot_oid,
        "passed_a": a.summary.passed, "passed_b": b.summary.passed,
        "full_a": a.full, "full_b": b.full,
        "changes": counts, "changed": sum(n for k, n in counts.items() if k != "none"),
        "agent_changes": agent_changes,
        "inference_changes": [i for i in inferences if not i["same_key_as_parent"]],
        "units": entries,
    }


def moved(result: dict[str, Any]) -> bool:
    """Whether any unit changed (score, status, inputs) or was added or removed."""
    return any(e["change"] != "none" for e in result["units"])


def nothing_moved(result: dict[str, Any]) -> str:
    """The message for two records with no change in any unit."""
    n = result["changes"].get("none", 0)
    same = "the same record" if result["record_a"] == result["record_b"] else "the two records"
    agent = result.get("agent_changes") or []
    return (f"nothing moved: all {n} unit(s) have the same status, score and inputs in "
            f"{same} ({short(result['record_a'])} → {short(result['record_b'])})."
            + (f" The agent changed ({'; '.join(agent)}) and answered the same." if agent else ""))


def diff_table(result: dict[str, Any], *, all_rows: bool = False) -> Any:
    """A rich Table of the units that changed (every unit with ``all_rows``)."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"diff {short(result['record_a'])} ({result['run_a']}) → "
                        f"{short(result['record_b'])} ({result['run_b']})")
    for column in ("case", "metric", "status", "score", "moved"):
        table.add_column(column)

    def fmt(x: float | None) -> str:
        return "—" if x is None else f"{x:.2f}"

    for e in result["units"]:
        if e["change"] == "none" and not all_rows:
            continue
        case = e["eval_id"] + (f" #{e['repetition']}" if e["repetition"] else "")
        status = (str(e["status_a"]) if e["status_a"] == e["status_b"]
                  else f"{e['status_a']} → {e['status_b']}")
        score = (fmt(e["score_a"]) if e["score_a"] == e["score_b"]
                 else f"{fmt(e['score_a'])} → {fmt(e['score_b'])}")
        moved = ", ".join(e["moved"]) or ("added" if e["change"] == "added" else
                                          "removed" if e["change"] == "removed" else "")
        table.add_row(case, e["metric"], status, score, moved)
    table.caption = " · ".join(f"{'unchanged' if k == 'none' else k} {v}"
                               for k, v in sorted(result["changes"].items()))
    if result.get("agent_changes"):
        table.caption += f"\nagent changed: {escape('; '.join(result['agent_changes']))}"
    return table
