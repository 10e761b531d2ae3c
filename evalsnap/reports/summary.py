"""Summaries of records: the ``--json`` object, the score table, exit codes."""

from __future__ import annotations

from typing import Any

from evalsnap.records import EvaluationRecord, ScoreUnit, repo

EXIT_OK, EXIT_QUALITY, EXIT_USAGE, EXIT_INCOMPLETE = 0, 1, 2, 3


def exit_code(record: EvaluationRecord) -> int:
    if not record.summary.complete:
        return EXIT_INCOMPLETE
    return EXIT_OK if record.summary.passed else EXIT_QUALITY


def load_units(store: Any, record: EvaluationRecord) -> dict[str, ScoreUnit]:
    return {ref.unit_oid: repo.get_unit_shared(store, ref.unit_oid) for ref in record.units}


def summary(store: Any, record_oid: str, record: EvaluationRecord,
            units: dict[str, ScoreUnit] | None = None) -> dict[str, Any]:
    """The one JSON object ``run``/``rescore``/``replay`` print."""
    units = units if units is not None else load_units(store, record)
    cases: dict[tuple[str, int], dict[str, Any]] = {}
    for inf in record.inference:
        cases[(inf.eval_id, inf.repetition)] = {
            "eval_id": inf.eval_id, "repetition": inf.repetition,
            "inference": inf.status, "inference_reused": inf.reused, "metrics": {}}
    for ref in record.units:
        unit = units[ref.unit_oid]
        entry = cases.setdefault((ref.eval_id, ref.repetition), {
            "eval_id": ref.eval_id, "repetition": ref.repetition, "metrics": {}})
        entry["metrics"][ref.metric_name] = {
            "score": unit.score, "status": unit.status, "metric_status": unit.metric_status,
            "gate_score": unit.gate_score, "threshold": unit.threshold,
            "reused": ref.reused, "reused_from_record": ref.reused_from_record,
            "reused_from_run": ref.reused_from_run, "why": ref.why, "reason": unit.reason,
            "complete": unit.complete, "judge_calls": unit.judge_calls if not ref.reused else 0,
        }
    s = record.summary
    return {
        "run_id": record.run_id, "kind": record.kind, "snapshot_id": record.snapshot_oid,
        "record_id": record_oid, "parent_record": record.parent_record,
        "eval_set_id": record.eval_set_id, "agent_calls": s.agent_calls,
        "judge_calls": s.judge_calls, "reused_judge_samples": s.reused_judge_samples,
        "reused_units": s.reused_units, "scored_units": s.scored_units,
        "complete": s.complete, "passed": s.passed, "exit_code": exit_code(record),
        "skipped_cases": record.skipped_cases, "uninferred_cases": record.uninferred_cases,
        "adk_history_path": record.adk_history_path,
        "cases": list(cases.values()),
    }


def score_table(result: dict[str, Any]) -> Any:
    """A rich Table: cases × metrics, reused marked, disagreements shown."""
    from rich.table import Table

    metrics: list[str] = []
    for case in result["cases"]:
        for name in case["metrics"]:
            if name not in metrics:
                metrics.append(name)
    table = Table(title=f"{result['eval_set_id']} — run {result['run_id']}")
    table.add_column("case")
    for name in metrics:
        table.add_column(name, justify="center")
    colors = {"PASSED": "green", "FAILED": "red", "NOT_EVALUATED": "yellow",
              "INFORMATIONAL": "blue"}
    for case in result["cases"]:
        label = case["eval_id"] + (f" #{case['repetition']}" if case.get("repetition") else "")
        if case.get("inference") == "failure":
            label += " [red](inference failed)[/]"
        cells = []
        for name in metrics:
            m = case["metrics"].get(name)
            if m is None:
                cells.append("")
                continue
            score = "—" if m["score"] is None else f"{m['score']:.2f}"
            cell = f"[{colors.get(m['status'], 'white')}]{m['status']}[/] {score}"
            if m["metric_status"] != m["status"] and m["status"] != "NOT_EVALUATED":
                cell += f" (metric: {m['metric_status']})"
            if m["reused"]:
                cell += " ↺"
            cells.append(cell)
        table.add_row(label, *cells)
    table.caption = (f"agent calls {result['agent_calls']} · judge calls {result['judge_calls']}"
                     f" · scored {result['scored_units']} · reused {result['reused_units']} (↺)"
                     f" · {'complete' if result['complete'] else 'INCOMPLETE'}"
                     f" · {'PASSED' if result['passed'] else 'NOT PASSED'}")
    return table
