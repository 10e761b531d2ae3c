"""Custom metrics that keep the contract: functions (sync, async) and Evaluator subclasses."""

from __future__ import annotations

import asyncio
from typing import Any

from google.adk.evaluation import EvaluationContext  # evalsnap's shim until ADK ships it
from google.adk.evaluation.eval_metrics import EvalMetric
from google.adk.evaluation.evaluator import (
    EvalStatus,
    EvaluationResult,
    Evaluator,
    PerInvocationResult,
)

#: Every call of a recording function: (name, metric, actual, expected, scenario).
CALLS: list[tuple[str, Any, Any, Any, Any]] = []
#: Contexts seen by the context evaluators, in call order.
CONTEXTS: list[tuple[str, Any]] = []


def _verdict(score: float, threshold: float) -> EvalStatus:
    return EvalStatus.PASSED if score >= threshold else EvalStatus.FAILED


def _all(actual: list[Any], score: float, threshold: float) -> EvaluationResult:
    status = _verdict(score, threshold)
    return EvaluationResult(
        overall_score=score, overall_eval_status=status,
        per_invocation_results=[
            PerInvocationResult(actual_invocation=inv, score=score, eval_status=status)
            for inv in actual],
    )


def sync_ones(metric, actual, expected, scenario):  # noqa: ANN001, ANN201 (plain on purpose)
    """1.0 per invocation; records its positional arguments."""
    CALLS.append(("sync_ones", metric, actual, expected, scenario))
    return _all(actual, 1.0, metric.criterion.threshold)


async def async_ones(metric: EvalMetric, actual: list[Any], expected: Any,
                     scenario: Any) -> EvaluationResult:
    """The async form of :func:`sync_ones`."""
    await asyncio.sleep(0)
    CALLS.append(("async_ones", metric, actual, expected, scenario))
    return _all(actual, 1.0, metric.criterion.threshold)


def final_turn_only(metric: EvalMetric, actual: list[Any], expected: Any,
                    scenario: Any) -> EvaluationResult:
    """Earlier turns unscored (NOT_EVALUATED), the conversation score on the last one."""
    if not actual:
        return EvaluationResult()
    score = 1.0
    status = _verdict(score, metric.criterion.threshold)
    rows = [PerInvocationResult(actual_invocation=inv) for inv in actual[:-1]]
    rows.append(PerInvocationResult(actual_invocation=actual[-1], score=score,
                                    eval_status=status))
    return EvaluationResult(overall_score=score, overall_eval_status=status,
                            per_invocation_results=rows)


def disagreeing(metric: EvalMetric, actual: list[Any], expected: Any,
                scenario: Any) -> EvaluationResult:
    """Rows all 0.0 (FAILED) but an overall 1.0 PASSED: the gate and the metric disagree."""
    rows = [PerInvocationResult(actual_invocation=inv, score=0.0, eval_status=EvalStatus.FAILED)
            for inv in actual]
    return EvaluationResult(overall_score=1.0, overall_eval_status=EvalStatus.PASSED,
                            per_invocation_results=rows)


def no_evidence(metric: EvalMetric, actual: list[Any], expected: Any,
                scenario: Any) -> EvaluationResult:
    """Entirely NOT_EVALUATED, rows omitted: allowed by the contract, but never a pass."""
    return EvaluationResult()


class MutatingEvaluator(Evaluator):
    """Vandalises everything it is given, then scores 1.0."""

    def __init__(self, eval_metric: EvalMetric):
        self._threshold = eval_metric.criterion.threshold

    def evaluate_with_context(self, actual_invocations, expected_invocations=None,
                              conversation_scenario=None, *, context: EvaluationContext):
        CONTEXTS.append(("mutator", context.model_copy(deep=True)))
        for state in (context.initial_session_state, context.final_session_state,
                      context.expected_final_session_state):
            if state is not None:
                state.clear()
                state["vandalised"] = True
        context.final_session_state = {"replaced": True}
        for inv in actual_invocations:
            inv.final_response = None
            inv.invocation_id = "vandalised"
        return _all(actual_invocations, 1.0, self._threshold)


class AsyncContextReader(Evaluator):
    """Async ``evaluate_with_context``: 1.0 when the final state equals the expected one."""

    def __init__(self, eval_metric: EvalMetric):
        self._threshold = eval_metric.criterion.threshold

    async def evaluate_with_context(self, actual_invocations, expected_invocations=None,
                                    conversation_scenario=None, *,
                                    context: EvaluationContext):
        await asyncio.sleep(0)
        CONTEXTS.append(("reader", context.model_copy(deep=True)))
        ok = context.final_session_state == context.expected_final_session_state
        return _all(actual_invocations, 1.0 if ok else 0.0, self._threshold)


class LegacySync(Evaluator):
    """Overrides only ``evaluate_invocations`` (sync): the default context route calls it."""

    def __init__(self, eval_metric: EvalMetric):
        self._threshold = eval_metric.criterion.threshold

    def evaluate_invocations(self, actual_invocations, expected_invocations=None,
                             conversation_scenario=None):
        CALLS.append(("legacy_sync", None, actual_invocations, expected_invocations,
                      conversation_scenario))
        return _all(actual_invocations, 1.0, self._threshold)


class LegacyAsync(LegacySync):
    """The async form of :class:`LegacySync`."""

    async def evaluate_invocations(self, actual_invocations, expected_invocations=None,
                                   conversation_scenario=None):
        await asyncio.sleep(0)
        CALLS.append(("legacy_async", None, actual_invocations, expected_invocations,
                      conversation_scenario))
        return _all(actual_invocations, 1.0, self._threshold)
