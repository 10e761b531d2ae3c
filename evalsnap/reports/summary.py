"""Summaries of records: the ``--json`` object, built as its model
(:class:`~evalsnap.reports.summary_model.RecordResult`), and the score table (its
``exit_code`` is :mod:`evalsnap.exitcodes`'s)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from evalsnap import exitcodes, startup
from evalsnap.aggregates import aggregates, gate_passed, iter_aggregates, record_gate
from evalsnap.records import EvaluationRecord, InferenceRef, ScoreUnit, UnitRef, UnitVerdict, repo
from evalsnap.records.record import TokenCounts
from evalsnap.reports.summary_model import Aggregate, CaseResult, MetricResult, RecordResult, Rows, as_record

# The codes by their old names, for the modules that still import them from here.
EXIT_OK, EXIT_QUALITY, EXIT_USAGE, EXIT_INCOMPLETE = (int(c) for c in (
    exitcodes.ExitCode.OK, exitcodes.ExitCode.QUALITY, exitcodes.ExitCode.USAGE,
    exitcodes.ExitCode.INCOMPLETE))


def exit_code(record: EvaluationRecord, passed: bool | None = None) -> int:
    """The record's own exit code (``--fail-on quality``); ``passed`` by the repetition gate
    (:func:`gated`), else the record's own."""
    return exitcodes.exit_code(exitcodes.Verdict(
        complete=record.summary.complete,
        passed=record.summary.passed if passed is None else passed))


def gated(record: EvaluationRecord, units: Mapping[str, ScoreUnit | UnitVerdict]) -> tuple[list[dict[str, Any]], bool]:
    """The record's aggregates over repetitions and whether the run passed by them: complete,
    and every case × metric passed its repetition gate."""
    entries = aggregates(record, units)
    return entries, record.summary.complete and gate_passed(entries)


def load_units(store: Any, record: EvaluationRecord) -> Mapping[str, UnitVerdict]:
    """The verdicts of the record's units by unit oid (what a summary, its aggregates and a
    report page read; :func:`evalsnap.records.repo.get_unit_verdict`)."""
    return repo.unit_verdicts(store, record)


def summary(store: Any, record_oid: str, record: EvaluationRecord,
            units: Mapping[str, ScoreUnit | UnitVerdict] | None = None, *, compare: bool = True) -> RecordResult:
    """The one result ``run``/``rescore``/``replay`` print as ``--json`` (with ``compare``,
    the regressions and fixes against the record's baseline, if it has one)."""
    units = units if units is not None else load_units(store, record)
    refs = record.units_by_case()  # each case's units read as its row is made

    def metrics(key: tuple[str, int]) -> dict[str, MetricResult]:
        return {ref.metric_name: metric_result(ref, units[ref.unit_oid])
                for ref in refs.get(key, ())}

    def case_rows() -> Iterator[CaseResult]:
        """Each case's row, in the record's order (then those with units but no inference:
        imported records), made from its inference entry as it is read."""
        inferred: set[tuple[str, int]] = set()
        for inf in record.inference:
            startup.give_back_now_and_then()  # the rows made before (their units read)
            key = (inf.eval_id, inf.repetition)
            inferred.add(key)
            yield CaseResult(eval_id=inf.eval_id, repetition=inf.repetition,
                             inference=inf.status, inference_reused=inf.reused,
                             efficiency=dict(inf.efficiency), tokens=inf.tokens,
                             tokens_by_model=dict(inf.tokens_by_model), metrics=metrics(key))
        for key in refs:
            if key not in inferred:
                yield CaseResult(eval_id=key[0], repetition=key[1], metrics=metrics(key))

    # each case's row made and kept as its JSON before the next is made (Rows): a summary
    # of 10,000 cases never holds its rows as models, nor the data of every case first
    rows = Rows(CaseResult, case_rows())
    s = record.summary
    # the aggregates made, kept as rows and let go one at a time (as a list of dicts, ~175 MB
    # at 10,000 cases × 7 metrics); what the summary needs of them counted on the way
    seen = {"all_passed": True, "repetitions": 1}

    def counted(entries: Iterable[dict[str, Any]]) -> Iterator[Aggregate]:
        for e in entries:
            seen["all_passed"] = seen["all_passed"] and e["status"] == "PASSED"
            seen["repetitions"] = max(seen["repetitions"], e["n"])
            yield Aggregate(**e)

    aggregate_rows = Rows(Aggregate, counted(iter_aggregates(record, units)))
    passed = s.complete and bool(seen["all_passed"])
    fields: dict[str, Any] = {
        "run_id": record.run_id, "kind": record.kind, "snapshot_id": record.snapshot_oid,
        "record_id": record_oid, "parent_record": record.parent_record,
        "eval_set_id": record.eval_set_id, "agent_calls": s.agent_calls,
        "judge_calls": s.judge_calls, "reused_judge_samples": s.reused_judge_samples,
        "reused_units": s.reused_units, "scored_units": s.scored_units,
        "complete": s.complete, "passed": passed, "exit_code": exit_code(record, passed),
        "repetition_gate": record_gate(record),
        "repetitions": seen["repetitions"],
        "skipped_cases": record.skipped_cases, "uninferred_cases": record.uninferred_cases,
        "unscored": s.unscored,
        "adk_history_path": record.adk_history_path,
        "full": record.full, "coverage": record.coverage,
        "agent_tokens": s.agent_tokens, "judge_tokens": s.judge_tokens,
        "inference_tokens": s.inference_tokens, "model_tokens": s.model_tokens,
        "estimated_cost": s.estimated_cost, "cost_note": s.cost_note, "prices": s.prices,
        "cases": rows,
        "aggregates": aggregate_rows,
    }
    if compare and record.baseline is not None:
        fields |= baseline_comparison(store, record, [json.loads(b) for b in rows.json_items()],
                                      [json.loads(b) for b in aggregate_rows.json_items()])
    return RecordResult(**fields)


def metric_result(ref: UnitRef, unit: ScoreUnit | UnitVerdict) -> MetricResult:
    """A unit's row in its record: the stored unit, and how this record came by it."""
    return MetricResult(
        score=unit.score, status=unit.status, metric_status=unit.metric_status,
        gate_score=unit.gate_score, threshold=unit.threshold,
        reused=ref.reused, reused_from_record=ref.reused_from_record,
        reused_from_run=ref.reused_from_run, why=ref.why, reason=unit.reason,
        complete=unit.complete, judge_calls=unit.judge_calls if not ref.reused else 0)


def baseline_comparison(store: Any, record: EvaluationRecord, cases: list[dict[str, Any]],
                        entries: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """``baseline``, ``regressions`` and ``fixes`` of a record compared with a baseline."""
    from evalsnap.errors import EvalsnapError
    from evalsnap.reports.regressions import compare

    b = record.baseline
    if b is None:
        return {}
    baseline: dict[str, Any] = b.model_dump()
    head: dict[str, Any] = {"baseline": baseline, "regressions": [], "fixes": [], "not_compared": 0,
                            "metric_deltas": []}
    if b.record_oid is None:
        baseline["note"] = "no earlier full run of this eval set to compare with"
        return head
    try:
        base = repo.get(store, EvaluationRecord, b.record_oid)
        before = summary(store, b.record_oid, base, compare=False)
    except EvalsnapError as exc:
        baseline["note"] = f"the baseline cannot be read: {exc}"
        return head
    baseline["created_at"] = base.created_at
    return head | compare({"cases": cases, "aggregates": entries or []}, before, b.tolerance,
                          b.alpha)


def _counts(counts: TokenCounts | None) -> dict[str, int | None] | None:
    return counts.model_dump() if counts is not None else None


def case_efficiency(inf: InferenceRef) -> dict[str, Any]:
    """A case's ADK efficiency metrics (informational) and its agent tokens."""
    return {
        "efficiency": {name: v.model_dump() for name, v in inf.efficiency.items()},
        "tokens": _counts(inf.tokens),
        "tokens_by_model": {m: c.model_dump() for m, c in inf.tokens_by_model.items()},
    }


def run_tokens(record: EvaluationRecord) -> dict[str, Any]:
    """Tokens this run spent (agent, judge, by model), the record's inference tokens, and
    the estimated cost (None without a price table or with a model it does not price)."""
    s = record.summary
    return {
        "agent_tokens": _counts(s.agent_tokens), "judge_tokens": _counts(s.judge_tokens),
        "inference_tokens": _counts(s.inference_tokens),
        "model_tokens": {m: c.model_dump() for m, c in s.model_tokens.items()},
        "estimated_cost": s.estimated_cost, "cost_note": s.cost_note,
        "prices": {m: p.model_dump() for m, p in s.prices.items()},
    }


def tokens_text(counts: TokenCounts | None) -> str:
    """A token count's total for people: ``1,234``, or ``—`` when none was reported."""
    total = counts.total_tokens if counts is not None else None
    return "—" if total is None else f"{total:,}"


def cost_text(result: RecordResult) -> str:
    """``0.001234``, or why there is no estimate."""
    if result.estimated_cost is not None:
        return f"{result.estimated_cost:.6f}"
    return f"— ({result.cost_note})" if result.cost_note else "—"


def tokens_caption(result: RecordResult) -> str:
    """This run's tokens and cost, one line (the table's caption, the artifact)."""
    return (f"tokens this run: agent {tokens_text(result.agent_tokens)}"
            f" · judge {tokens_text(result.judge_tokens)}"
            f" · estimated cost {cost_text(result)}")


def _caption(result: RecordResult) -> str:
    return (f"agent calls {result.agent_calls} · judge calls {result.judge_calls}"
            f" · scored {result.scored_units} · reused {result.reused_units} (↺)"
            f" · {'complete' if result.complete else 'INCOMPLETE'}"
            f" · {'PASSED' if result.passed else 'NOT PASSED'}\n"
            f"{tokens_caption(result)}" + "".join(f"\n{line}" for line in comparison_lines(result)))


def ci_text(ci: list[float] | None) -> str:
    """``[0.23, 0.88]``, or ``—`` without scored repetitions."""
    return "—" if ci is None else f"[{ci[0]:.2f}, {ci[1]:.2f}]"


def stability_text(result: RecordResult) -> str:
    """`` · until stable (≤ MAX): 2 stable, 1 at max`` for an ``--until-stable`` run."""
    c = result.coverage
    if c is None or not c.until_stable:
        return ""
    counts: dict[str, int] = {}
    for case in (c.stability or {}).values():
        counts[case.stopped] = counts.get(case.stopped, 0) + 1
    said = ", ".join(f"{n} {'at max' if why == 'max' else why}" for why, n in sorted(counts.items()))
    return f" · until stable (≤ {c.until_stable}): {said}"


def aggregate_table(result: RecordResult) -> Any:
    """A rich Table: one row per case × metric over its repetitions (k/n passed, the Wilson
    interval, mean ± stdev, verdict, the gate's status)."""
    from rich.table import Table

    table = Table(title=f"{result.eval_set_id} — run {result.run_id}{subset_text(result)}"
                        f" · {result.repetitions} repetitions · gate {result.repetition_gate}"
                        f"{stability_text(result)}")
    table.add_column("case")
    table.add_column("metric")
    for name in ("passed k/n [95% Wilson]", "mean±sd", "verdict", "status"):
        table.add_column(name, justify="center", no_wrap=True)
    colors = {"PASSED": "green", "FAILED": "red", "NOT_EVALUATED": "yellow"}
    verdicts = {"passing": "green", "failing": "red", "flaky": "magenta", "incomplete": "yellow"}
    for a in result.aggregates:
        mean = "—" if a.mean_score is None else f"{a.mean_score:.2f}"
        if a.score_stdev is not None:
            mean += f"±{a.score_stdev:.2f}"
        table.add_row(a.eval_id, a.metric, f"{a.passed}/{a.n} {ci_text(a.pass_rate_ci95)}"
                      + (f" ({a.incomplete} incomplete)" if a.incomplete else ""), mean,
                      f"[{verdicts[a.verdict]}]{a.verdict}[/]",
                      f"[{colors.get(a.status, 'white')}]{a.status}[/]")
    table.caption = _caption(result) + "\nper repetition: evalsnap show RUN --all"
    return table


def score_table(result: RecordResult | dict[str, Any], detail: bool = False) -> Any:
    """A rich Table: with repetitions, one row per case × metric (:func:`aggregate_table`)
    unless ``detail``; else cases × metrics, reused marked, disagreements shown."""
    from rich.table import Table

    result = as_record(result)
    if not detail and result.repetitions > 1 and result.aggregates:
        return aggregate_table(result)
    metrics: list[str] = []
    for case in result.cases:
        for name in case.metrics:
            if name not in metrics:
                metrics.append(name)
    table = Table(title=f"{result.eval_set_id} — run {result.run_id}{subset_text(result)}")
    table.add_column("case")
    for name in metrics:
        table.add_column(name, justify="center")
    table.add_column("agent tokens", justify="right")
    colors = {"PASSED": "green", "FAILED": "red", "NOT_EVALUATED": "yellow",
              "INFORMATIONAL": "blue"}
    for case in result.cases:
        label = case.eval_id + (f" #{case.repetition}" if case.repetition else "")
        if case.inference == "failure":
            label += " [red](inference failed)[/]"
        cells = []
        for name in metrics:
            m = case.metrics.get(name)
            if m is None:
                cells.append("")
                continue
            score = "—" if m.score is None else f"{m.score:.2f}"
            cell = f"[{colors.get(m.status, 'white')}]{m.status}[/] {score}"
            if m.metric_status != m.status and m.status != "NOT_EVALUATED":
                cell += f" (metric: {m.metric_status})"
            if m.reused:
                cell += " ↺"
            cells.append(cell)
        table.add_row(label, *cells, tokens_text(case.tokens))
    table.caption = _caption(result)
    return table


def subset_text(result: RecordResult) -> str:
    """`` (subset: 10 of 13 cases, 2 of 7 metrics left out)`` for a record that is not full."""
    c = result.coverage
    if result.full or c is None:
        return ""
    left = [f"{len(found)} {what} left out" for found, what in
            ((c.missing_cases, "case(s)"), (c.missing_metrics, "metric(s)")) if found]
    return f" (subset: {', '.join(left) or c.note or 'part of the eval set'})"


def comparison_lines(result: RecordResult) -> list[str]:
    """The baseline comparison for people: one line per regression and fix."""
    b = result.baseline
    if b is None:
        return []
    if b.note:
        return [f"baseline {b.requested}: {b.note}"]
    regressions, fixes = result.regressions, result.fixes
    lines = [f"vs baseline {b.run_id}: {len(regressions)} regression(s), {len(fixes)} fix(es)"]
    for kind, entries in (("REGRESSED", regressions), ("fixed", fixes)):
        for e in entries:
            rep = f" #{e.repetition}" if e.repetition else ""
            what = kind if e.significant else f"{kind.lower()} (within noise)"
            lines.append(f"  {what} {e.eval_id}{rep} · {e.metric}: {e.change}")
    for d in result.metric_deltas:
        lines.append(f"  Δ {d.metric}: mean score {d.mean_delta:+.3f} over {d.cases} "
                     f"case(s), 95% bootstrap {ci_text(d.ci95)}"
                     + (" (excludes 0)" if d.excludes_zero else ""))
    return lines
