"""``final_state_match``: the seed's example metric, registered as a built-in.

Exact equality of the final session state with ``EvalCase.final_session_state``;
NOT_EVALUATED when either is absent; the case-level score repeated on each
invocation; threshold from the criterion.
"""

from __future__ import annotations

from typing import Any, ClassVar

from google.adk.evaluation.eval_metrics import (
    BaseCriterion,
    EvalMetric,
    Interval,
    MetricInfo,
    MetricValueInfo,
)
from google.adk.evaluation.evaluator import (
    EvalStatus,
    EvaluationResult,
    Evaluator,
    PerInvocationResult,
)
from google.adk.evaluation.metric_evaluator_registry import DEFAULT_METRIC_EVALUATOR_REGISTRY

import evalsnap.adk.context  # noqa: F401  (EvaluationContext shim)

METRIC_NAME = "final_state_match"


class FinalStateMatchEvaluator(Evaluator):
    """Scores 1.0 when the final state matches the expected state."""

    criterion_type: ClassVar[type[BaseCriterion]] = BaseCriterion
    version: ClassVar[str] = "1"

    def __init__(self, eval_metric: EvalMetric):
        if eval_metric.criterion is not None:
            self._threshold = eval_metric.criterion.threshold
        elif eval_metric.threshold is not None:
            self._threshold = eval_metric.threshold
        else:
            raise ValueError("final_state_match requires a threshold.")

    def evaluate_with_context(self, actual_invocations: Any, expected_invocations: Any = None,
                              conversation_scenario: Any = None, *,
                              context: Any) -> EvaluationResult:
        actual = context.final_session_state
        expected = context.expected_final_session_state
        if actual is None or expected is None or not actual_invocations:
            return EvaluationResult()
        score = 1.0 if actual == expected else 0.0
        status = EvalStatus.PASSED if score >= self._threshold else EvalStatus.FAILED
        return EvaluationResult(
            overall_score=score,
            overall_eval_status=status,
            per_invocation_results=[
                PerInvocationResult(actual_invocation=inv, score=score, eval_status=status)
                for inv in actual_invocations
            ],
        )


def register() -> None:
    """Registers ``final_state_match`` in ADK's default registry (idempotent)."""
    DEFAULT_METRIC_EVALUATOR_REGISTRY.register_evaluator(
        metric_info=MetricInfo(
            metric_name=METRIC_NAME,
            description="Checks the expected final session state.",
            metric_value_info=MetricValueInfo(interval=Interval(min_value=0.0, max_value=1.0)),
        ),
        evaluator=FinalStateMatchEvaluator,
    )
