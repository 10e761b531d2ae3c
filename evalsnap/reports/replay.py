"""Replay: parse and aggregate a record's recorded judge answers again, with no model call.

Every judge unit of the record is scored again by the *current* evaluator code with its
judge model replaced by the unit's own ledger (strict: a request the ledger does not hold
is a :class:`ReplayMismatchError`). Units that need no judge are taken as recorded.
Replay writes nothing to the store.
"""

from __future__ import annotations

from typing import Any

from evalsnap.adk.config import eval_metric_for, resolve_config
from evalsnap.adk.ledger_model import stand_in_for
from evalsnap.errors import ReplayMismatchError, ReplayUnavailableError
from evalsnap.pipeline import ledger as _ledger
from evalsnap.pipeline.unit import score_unit
from evalsnap.records import MetricRule, ScoreUnit, Snapshot, repo
from evalsnap.reports.summary import EXIT_INCOMPLETE, EXIT_OK, EXIT_QUALITY, summary
from evalsnap.reports.summary_model import RecordResult
from storage import Store

__all__ = ["ReplayMismatchError", "ReplayUnavailableError", "current_aggregation_version",
           "replay"]  # the two errors live in evalsnap.errors


def _replayable(rule: MetricRule) -> bool:
    """Built-in judges only: evalsnap never imports code named in a stored record."""
    return rule.judge and rule.evaluator.kind == "builtin"


async def _replay_unit(store: Store, snapshot: Snapshot, rule: MetricRule, registry: Any,
                       unit: ScoreUnit) -> tuple[ScoreUnit, set[str]]:
    if unit.trace != "complete":
        raise ReplayUnavailableError(
            f"case {unit.eval_id!r} (repetition {unit.repetition}), metric "
            f"{unit.metric_name!r}: judge trace is {unit.trace} ({unit.trace_note}); "
            "nothing to replay from — rescore it instead.")
    frozen = next(c for c in snapshot.cases
                  if (c.eval_id, c.repetition) == (unit.eval_id, unit.repetition))
    inference = repo.get_inference(store, frozen.inference_oid)
    source, entries = _ledger.replay_source(store, unit.ledger)
    new, recorder = await score_unit(rule, eval_metric_for(rule, None), frozen, inference,
                                     registry, run_id=unit.run_id, judge_source=source)
    if recorder is not None and recorder.mismatches:
        raise ReplayMismatchError(
            f"case {unit.eval_id!r} (repetition {unit.repetition}), metric "
            f"{unit.metric_name!r}: {recorder.mismatches[0]}; the ledger was recorded for "
            "other requests — rescore to ask the judge again.")
    if recorder is not None and recorder.live_calls:  # defence in depth: never happens
        raise ReplayMismatchError(f"replay of {unit.metric_name!r} called a judge model")
    new = new.model_copy(update={"ledger": unit.ledger, "created_at": unit.created_at})
    return new, {e.aggregation_version for e in entries}


async def replay(store: Store, ref: str, agent_dir: str | None = None) -> RecordResult:
    """The summary of ``ref`` recomputed from its ledger; ``judge_calls`` is 0.

    ``agent_dir`` (``--agent``) is imported first, as a run imports it: the user names the
    package, the record never does."""
    if agent_dir is not None:
        from evalsnap.pipeline.score import import_agent

        import_agent(agent_dir)
    record_oid, record = repo.resolve_record(store, ref)
    if record.snapshot_oid is None:
        raise ReplayUnavailableError(f"record {record_oid} was imported from ADK history; "
                                     "it has no judge ledger to replay.")
    snapshot = repo.get_snapshot(store, record.snapshot_oid)
    rules = {r.metric_name: r for r in snapshot.rules}
    judge_rules = [r for r in snapshot.rules if _replayable(r)]
    # No live judge needed: a model this process cannot build is stood in for (it is never
    # called; the ledger answers), so a record is auditable where the judge's provider is not.
    stand_in_for(r.criterion for r in judge_rules)
    registry = resolve_config({"criteria": {r.metric_name: r.criterion for r in judge_rules}},
                              where="<rules of the snapshot>").registry if judge_rules else None
    repo.locate_units(store, record)
    units = {ref.unit_oid: repo.get_unit_shared(store, ref.unit_oid) for ref in record.units}
    replayed: dict[str, ScoreUnit] = {}
    changes: list[dict[str, Any]] = []
    for ref_ in record.units:
        unit = units[ref_.unit_oid]
        rule = rules[ref_.metric_name]
        if not _replayable(rule):
            replayed[ref_.unit_oid] = unit
            continue
        new, versions = await _replay_unit(store, snapshot, rule, registry, unit)
        replayed[ref_.unit_oid] = new
        current = current_aggregation_version(registry, rule)
        if (new.score, new.status, new.gate_score) != (unit.score, unit.status, unit.gate_score) \
                or versions - {current}:
            changes.append({
                "eval_id": unit.eval_id, "repetition": unit.repetition,
                "metric_name": unit.metric_name, "recorded": _brief(unit), "replayed": _brief(new),
                "recorded_aggregation_versions": sorted(versions),
                "aggregation_version": current})
    complete = all(u.complete for u in replayed.values()) and all(
        i.status == "success" for i in record.inference)
    passed = complete and all(u.status in ("PASSED", "INFORMATIONAL") for u in replayed.values())
    view = record.model_copy(update={"summary": record.summary.model_copy(update={
        "complete": complete, "passed": passed, "agent_calls": 0, "judge_calls": 0,
        "reused_judge_samples": 0})})
    return summary(store, record_oid, view, units=replayed).model_copy(update={
        "kind": "replay", "replayed_record": record_oid,
        "exit_code": EXIT_INCOMPLETE if not complete else EXIT_OK if passed else EXIT_QUALITY,
        "replay_changes": changes})


def current_aggregation_version(registry: Any, rule: MetricRule) -> str:
    """The aggregation version the current code reports for ``rule``'s evaluator."""
    from evalsnap.adk.judge_adapters import aggregation_version

    return aggregation_version(registry.get_evaluator(eval_metric_for(rule, None)))


def _brief(unit: ScoreUnit) -> dict[str, Any]:
    return {"score": unit.score, "gate_score": unit.gate_score, "status": unit.status,
            "complete": unit.complete}

