"""Custom metrics that break the contract, each in one way."""

from __future__ import annotations

from typing import Any

from google.adk.evaluation.eval_metrics import EvalMetric
from google.adk.evaluation.evaluator import EvalStatus, EvaluationResult, PerInvocationResult

not_callable = 42


def too_few_rows(metric: EvalMetric, actual: list[Any], expected: Any,
                 scenario: Any) -> EvaluationResult:
    """A scored result with one row fewer than there are invocations."""
    rows = [PerInvocationResult(actual_invocation=inv, score=1.0, eval_status=EvalStatus.PASSED)
            for inv in actual[:-1]]
    return EvaluationResult(overall_score=1.0, overall_eval_status=EvalStatus.PASSED,
                            per_invocation_results=rows)


def raises(metric: EvalMetric, actual: list[Any], expected: Any,
           scenario: Any) -> EvaluationResult:
    raise RuntimeError("boom from the metric")


def out_of_interval(metric: EvalMetric, actual: list[Any], expected: Any,
                    scenario: Any) -> EvaluationResult:
    """1.5 on a metric whose declared interval is [0, 1]."""
    rows = [PerInvocationResult(actual_invocation=inv, score=1.5, eval_status=EvalStatus.PASSED)
            for inv in actual]
    return EvaluationResult(overall_score=1.5, overall_eval_status=EvalStatus.PASSED,
                            per_invocation_results=rows)


def three_args(metric: EvalMetric, actual: list[Any], expected: Any) -> EvaluationResult:
    return EvaluationResult()


def returns_dict(metric: EvalMetric, actual: list[Any], expected: Any,
                 scenario: Any) -> dict[str, float]:
    return {"score": 1.0}
