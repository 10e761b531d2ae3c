"""Scoring one metric on one frozen case (a *score unit*), on copies only."""

from __future__ import annotations

import asyncio
import copy
import math
from typing import Any

from google.adk.evaluation.eval_case import EvalCase, Invocation
from google.adk.evaluation.eval_metrics import EvalMetric
from google.adk.evaluation.evaluator import EvalStatus, EvaluationResult
from google.adk.evaluation.metric_evaluator_registry import MetricEvaluatorRegistry

from evalsnap.adk.context import make_context, run_evaluator
from evalsnap.adk.rubrics import copy_rubrics
from evalsnap.agents.base import now_iso
from evalsnap.deadlines import DeadlineExceeded, exceeded, metric_timeout
from evalsnap.fingerprint import unit_fingerprint
from evalsnap.pipeline.judge import JudgeRecorder, LedgerSource, attach_recorder
from evalsnap.pipeline.limits import ModelLimiter
from evalsnap.records import FrozenCase, InferenceRecord, MetricRule, ScoreUnit, UnitRow


def _status(value: EvalStatus | str | None) -> str:
    if isinstance(value, EvalStatus):
        return value.name
    return str(value or "NOT_EVALUATED")


def gate(rows: list[UnitRow], threshold: float, metric_status: str) -> tuple[float | None, str]:
    """Mean of the non-None per-invocation scores against the threshold."""
    scored = [r.score for r in rows if r.score is not None]
    mean = sum(scored) / len(scored) if scored else None
    if metric_status == "INFORMATIONAL":
        return mean, "INFORMATIONAL"
    if mean is None:
        return None, "NOT_EVALUATED"
    return mean, "PASSED" if mean >= threshold else "FAILED"


def _interval(rule: MetricRule) -> dict[str, Any]:
    info = (rule.metric_info or {}).get("metricValueInfo") or {}
    return info.get("interval") or {}


def _outside(score: float, interval: dict[str, Any]) -> bool:
    lo, hi = interval.get("minValue"), interval.get("maxValue")
    if lo is not None and (score < lo or (interval.get("openAtMin") and score == lo)):
        return True
    return hi is not None and (score > hi or bool(interval.get("openAtMax") and score == hi))


def _interval_text(interval: dict[str, Any]) -> str:
    return (f"{'(' if interval.get('openAtMin') else '['}{interval.get('minValue')}, "
            f"{interval.get('maxValue')}{')' if interval.get('openAtMax') else ']'}")


def _contract_violation(rule: MetricRule, result: Any, n_actual: int) -> str | None:
    if not isinstance(result, EvaluationResult):
        return f"returned {type(result).__name__}, not an ADK EvaluationResult"
    status = _status(result.overall_eval_status)
    rows = result.per_invocation_results
    # Only an entirely NOT_EVALUATED result may omit its rows (all of them); INFORMATIONAL
    # metrics (ADK's efficiency evaluators) are not gated.
    omitted = status == "NOT_EVALUATED" and not rows
    if status != "INFORMATIONAL" and not omitted and len(rows) != n_actual:
        return (f"returned {len(rows)} per-invocation results for {n_actual} actual invocations "
                "(result row count is rejected: a scored metric returns exactly one row per "
                "actual invocation, in order)")
    interval = _interval(rule)
    scores = [result.overall_score] + [r.score for r in rows]
    for s in scores:
        if s is None:
            continue
        if isinstance(s, bool) or not isinstance(s, int | float) or math.isnan(s):
            return f"returned a non-numeric score {s!r}"
        if _outside(s, interval):
            return f"returned score {s} outside its declared interval {_interval_text(interval)}"
    return None


def _base(rule: MetricRule, frozen: FrozenCase, run_id: str) -> dict[str, Any]:
    return dict(
        unit_fingerprint=unit_fingerprint(frozen.case_fingerprint, rule.rule_fingerprint),
        case_fingerprint=frozen.case_fingerprint, rule_fingerprint=rule.rule_fingerprint,
        eval_id=frozen.eval_id, repetition=frozen.repetition, metric_name=rule.metric_name,
        threshold=rule.threshold, run_id=run_id, created_at=now_iso(),
        trace="complete" if rule.judge else "not_needed",
    )


def not_evaluated(rule: MetricRule, frozen: FrozenCase, run_id: str, reason: str,
                  n_rows: int = 0, **extra: Any) -> ScoreUnit:
    rows = [UnitRow(invocation_index=i) for i in range(n_rows)]
    return ScoreUnit(rows=rows, complete=False, reason=reason, status="NOT_EVALUATED",
                     metric_status="NOT_EVALUATED", **{**_base(rule, frozen, run_id), **extra})


async def score_unit(
    rule: MetricRule,
    eval_metric: EvalMetric,
    frozen: FrozenCase,
    inference: InferenceRecord,
    registry: MetricEvaluatorRegistry,
    *,
    run_id: str = "",
    judge_source: LedgerSource | None = None,
    limiter: ModelLimiter | None = None,
    inference_is_private: bool = False,
    timeout: tuple[float, str] | None = None,
) -> tuple[ScoreUnit, JudgeRecorder | None]:
    """Scores ``rule`` on ``frozen``; never raises for a metric's own failure.

    ``judge_source`` answers judge requests from a ledger (``--reuse``, or ``replay``
    where it is strict); live judge calls go through the run's ``limiter``
    (:mod:`evalsnap.pipeline.limits`; None: not limited, as in ``replay``, which calls none).
    Evaluators get copies, so nothing they do reaches a persisted input; a caller whose
    ``inference`` was parsed for this call alone says ``inference_is_private=True`` and
    saves the deep copy (it was the largest cost of scoring). ``timeout`` (seconds, and the
    setting it comes from; default :func:`evalsnap.deadlines.metric_timeout`) bounds the
    evaluation: past it the unit is NOT_EVALUATED.
    """
    if not inference.ok:
        return not_evaluated(rule, frozen, run_id, f"inference failed: {inference.error}"), None
    reference = EvalCase.model_validate(copy.deepcopy(frozen.reference))
    actual: list[Invocation] = (list(inference.invocations) if inference_is_private
                                else copy.deepcopy(inference.invocations))
    expected = reference.conversation
    if reference.conversation_scenario is None and expected is not None and len(expected) != len(
            actual):
        return not_evaluated(rule, frozen, run_id,
                             f"agent produced {len(actual)} invocations for {len(expected)} "
                             "expected turns", len(actual)), None
    try:
        copy_rubrics(reference, expected, actual)
    except ValueError as exc:
        return not_evaluated(rule, frozen, run_id, f"rubrics: {exc}", len(actual)), None
    recorder = None
    try:
        evaluator = registry.get_evaluator(eval_metric)
        recorder = attach_recorder(evaluator, judge_source, limiter)
        context = make_context(inference.initial_session_state, inference.final_session_state,
                               reference.final_session_state)
        seconds, setting = timeout or metric_timeout({}, rule.metric_name)
        deadline = asyncio.timeout(seconds)
        try:
            async with deadline:
                result = await run_evaluator(evaluator, actual, expected,
                                             reference.conversation_scenario, context,
                                             user_code=rule.evaluator.kind != "builtin")
        except TimeoutError:
            if not deadline.expired():
                raise  # the metric's own TimeoutError: its error, not our deadline
            raise exceeded(f"metric {rule.metric_name!r}", seconds, setting) from None
    except DeadlineExceeded as exc:
        return _judge_trace(not_evaluated(rule, frozen, run_id, str(exc), len(actual)),
                            rule, recorder), recorder
    except asyncio.CancelledError:
        raise  # cancelling the run cancels the unit
    except BaseException as exc:  # noqa: BLE001 - user code; see USER_CODE_ERRORS
        return _judge_trace(not_evaluated(
            rule, frozen, run_id, f"metric raised {type(exc).__name__}: {exc}", len(actual)),
            rule, recorder), recorder
    violation = _contract_violation(rule, result, len(actual))
    if violation:
        return _judge_trace(not_evaluated(
            rule, frozen, run_id, f"result contract: {violation}", len(actual)),
            rule, recorder), recorder
    unit = _unit_from_result(rule, frozen, run_id, result, len(actual), recorder)
    return _judge_trace(unit, rule, recorder), recorder


#: What user code (a metric, a judge model) may raise, and that ends only its unit: any
#: ``BaseException`` — ``SystemExit``, ``KeyboardInterrupt``, ``GeneratorExit`` and a
#: metric's own ``BaseException`` subclasses (issue 29 item 4) — raised *by the metric*. In
#: the CLI's process scoring runs on task-runner threads, where a real Ctrl-C never lands (it
#: interrupts the main thread, which ends the run). ``asyncio.CancelledError`` is not
#: caught: cancelling the run must cancel the unit.
USER_CODE_ERRORS = (BaseException,)


def _calls(recorder: JudgeRecorder | None) -> int:
    """Judge requests that reached a model (answers from a ledger are not calls)."""
    return recorder.live_calls if recorder else 0


def _judge_trace(unit: ScoreUnit, rule: MetricRule, recorder: JudgeRecorder | None) -> ScoreUnit:
    """Trace coverage and judge calls; an invocation with a failed judge sample (error or
    unparseable answer) is NOT_EVALUATED and the unit incomplete, whatever ADK's vote."""
    if not rule.judge:
        return unit
    if recorder is None:
        return unit.model_copy(update={
            "trace": "unavailable", "judge_calls": 0,
            "trace_note": "the evaluator holds no `_judge_model` to capture judge calls from"})
    update: dict[str, Any] = {"trace": "complete", "judge_calls": recorder.live_calls}
    if not recorder.adapter.known:
        update["trace_note"] = (f"{recorder.adapter.evaluator_path} is not a known ADK judge: "
                                "calls are recorded and replayable, not attributed or parsed")
    failed = recorder.failed_invocations()
    if failed:
        update["complete"] = False
        rows = [UnitRow(invocation_index=r.invocation_index)
                if r.invocation_index in failed else r for r in unit.rows]
        if rows != unit.rows:
            gate_score, status = gate(rows, rule.threshold, unit.metric_status)
            update.update(rows=rows, gate_score=gate_score, status=status)
    return unit.model_copy(update=update)


def _unit_from_result(rule: MetricRule, frozen: FrozenCase, run_id: str, result: EvaluationResult,
                      n_actual: int, recorder: JudgeRecorder | None) -> ScoreUnit:
    per = result.per_invocation_results
    rows = [
        UnitRow(invocation_index=i, score=r.score, status=_status(r.eval_status),  # type: ignore[arg-type]
                rubric_scores=[s.model_dump(mode="json") for s in r.rubric_scores]
                if r.rubric_scores else None)
        for i, r in enumerate(per)
    ] if len(per) == n_actual else [UnitRow(invocation_index=i) for i in range(n_actual)]
    metric_status = _status(result.overall_eval_status)
    gate_score, status = gate(rows, rule.threshold, metric_status)
    judge_errors = recorder.failed_samples() if recorder else []
    reasons = []
    if judge_errors:
        first = judge_errors[0]
        why = first.error or f"unparseable answer {(first.raw_response or '')[:120]!r}"
        reasons.append(f"{len(judge_errors)} judge sample(s) failed (invocation "
                       f"{first.invocation_index}): {why}")
    if status == "NOT_EVALUATED":
        reasons.append("the metric scored no invocation")
    disagree = metric_status != status or (
        result.overall_score is not None and gate_score is not None
        and abs(result.overall_score - gate_score) > 1e-9)
    if disagree and status != "NOT_EVALUATED":
        reasons.append(f"metric reports {metric_status} (score {result.overall_score}); gate "
                       f"(mean of per-invocation scores) gives {status} ({gate_score}): the "
                       "overall score/status and the mean of scored rows use different policies")
    return ScoreUnit(
        score=result.overall_score, metric_status=metric_status,  # type: ignore[arg-type]
        gate_score=gate_score, status=status, rows=rows,  # type: ignore[arg-type]
        complete=status != "NOT_EVALUATED" and not judge_errors,
        reason="; ".join(reasons) or None, judge_calls=_calls(recorder),
        rubric_scores=[s.model_dump(mode="json") for s in result.overall_rubric_scores]
        if result.overall_rubric_scores else None,
        **_base(rule, frozen, run_id),
    )
