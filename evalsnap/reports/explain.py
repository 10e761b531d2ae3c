"""``explain RECORD``: for every unit, reused (from where) or scored, and why.

The reason of each unit is decided when the record is published (``UnitRef.why``,
see :func:`evalsnap.pipeline.publish.explain_change`); this module adds the evidence: which
fingerprint of the unit key differs from the parent record, so a reader can check
the reason against the stored keys instead of trusting it; and, per inference, whether the
agent ran or was reused and why its key changed: *what* changed in the agent (from the
identities stored with the inferences, :mod:`evalsnap.reports._agent_changes`), never a
bare hash.
"""

from __future__ import annotations

from typing import Any

from evalsnap.errors import EvalsnapError
from evalsnap.fingerprint import short
from evalsnap.records import EvaluationRecord, ScoreUnit, UnitRef, repo
from evalsnap.reports._agent_changes import AgentChanges

__all__ = ["explain", "explain_table"]

#: Every reason a record can give, in the order the table groups them.
REASONS = (
    "reused", "new", "reuse not requested", "forced", "reference changed", "rule changed",
    "evaluator version changed", "inference changed", "incomplete before", "no trusted version",
)


def _parent(store: Any, parent_oid: str | None) -> EvaluationRecord | None:
    if parent_oid is None:
        return None
    try:
        return repo.get(store, EvaluationRecord, parent_oid)
    except EvalsnapError:
        return None


def _moved(ref: UnitRef, before: UnitRef | None) -> list[str]:
    """Which parts of the unit key differ from the parent record's unit."""
    if before is None:
        return []
    moved = []
    if before.case_fingerprint != ref.case_fingerprint:
        moved.append("case")
    if before.rule_fingerprint != ref.rule_fingerprint:
        moved.append("rule")
    return moved


def explain(store: Any, record_oid: str, record: EvaluationRecord) -> dict[str, Any]:
    """One JSON-ready object: the record, its parent, one entry per inference (ran or
    reused, and what changed since the parent) and one entry per unit."""
    parent_record = _parent(store, record.parent_record)
    parent = ({(u.eval_id, u.repetition, u.metric_name): u for u in parent_record.units}
              if parent_record else {})
    inferences, agent_changes = AgentChanges(store).of_records(parent_record, record)
    units: list[dict[str, Any]] = []
    for ref in record.units:
        try:
            unit: ScoreUnit | None = repo.get(store, ScoreUnit, ref.unit_oid)
        except EvalsnapError:
            unit = None
        before = parent.get((ref.eval_id, ref.repetition, ref.metric_name))
        units.append({
            "eval_id": ref.eval_id, "repetition": ref.repetition, "metric": ref.metric_name,
            "action": "reused" if ref.reused else "scored", "why": ref.why,
            "reused_from_record": ref.reused_from_record, "reused_from_run": ref.reused_from_run,
            "status": unit.status if unit else None, "score": unit.score if unit else None,
            "complete": unit.complete if unit else None,
            "reason": unit.reason if unit else "unit object missing; run `evalsnap verify`",
            "unit_fingerprint": ref.unit_fingerprint,
            "case_fingerprint": ref.case_fingerprint, "rule_fingerprint": ref.rule_fingerprint,
            "in_parent": before is not None, "moved_vs_parent": _moved(ref, before),
        })
    counts: dict[str, int] = {}
    for u in units:
        counts[u["why"]] = counts.get(u["why"], 0) + 1
    return {
        "record_id": record_oid, "run_id": record.run_id, "kind": record.kind,
        "eval_set_id": record.eval_set_id, "snapshot_id": record.snapshot_oid,
        "parent_record": record.parent_record, "source": record.source,
        "reuse": record.reuse, "force": record.force,
        "reused_units": sum(1 for u in units if u["action"] == "reused"),
        "scored_units": sum(1 for u in units if u["action"] == "scored"),
        "why_counts": dict(sorted(counts.items(), key=lambda kv: _order(kv[0]))),
        "skipped_cases": record.skipped_cases, "uninferred_cases": record.uninferred_cases,
        "agent_changes": agent_changes,
        "ran_inferences": sum(1 for i in inferences if i["action"] == "ran"),
        "inferences": inferences,
        "units": units,
    }


def _order(why: str) -> int:
    return REASONS.index(why) if why in REASONS else len(REASONS)


def explain_table(result: dict[str, Any]) -> Any:
    """A rich Table, one row per unit."""
    from rich.markup import escape
    from rich.table import Table

    parent = short(result["parent_record"]) if result["parent_record"] else "none"
    table = Table(title=f"{result['eval_set_id']} — {result['kind']} {result['run_id']} "
                        f"(compared with record {parent})")
    for column in ("case", "metric", "action", "why", "from record / run", "status"):
        table.add_column(column)
    for u in result["units"]:
        case = u["eval_id"] + (f" #{u['repetition']}" if u["repetition"] else "")
        origin = (f"{short(u['reused_from_record'])} / {u['reused_from_run']}"
                  if u["action"] == "reused" and u["reused_from_record"]
                  else (u["reused_from_run"] or ""))
        action = "[cyan]reused[/]" if u["action"] == "reused" else "scored"
        table.add_row(case, u["metric"], action, u["why"], origin, str(u["status"]))
    counts = " · ".join(f"{k} {v}" for k, v in result["why_counts"].items())
    table.caption = (f"scored {result['scored_units']} · reused {result['reused_units']}"
                     + (f" · {counts}" if counts else "")
                     + f"\ninference: ran {result.get('ran_inferences', 0)} of "
                     f"{len(result.get('inferences', []))}"
                     + (f" · agent changed: {escape('; '.join(result['agent_changes']))}"
                        if result.get("agent_changes") else ""))
    return table
