# ruff: noqa  (copied verbatim from the seed: its import order and 2-space indent stay)
"""The seed's ``FinalStateMatchEvaluator`` example and registration, copied verbatim.

Source: ../shared/seeds/000_238a405426a54cff.txt (ADK docs, "Write an Evaluator subclass").
Only this docstring is added. Named in a config under ``evalsnapPlugins``, it registers on
import — evalsnap's registration route for Evaluator subclasses. It replaces evalsnap's
built-in ``final_state_match`` in the process's default registry (same name), which is what
the tests check: the seed's own code, unchanged, runs through evalsnap.
"""

from google.adk.evaluation import EvaluationContext
from google.adk.evaluation.eval_metrics import BaseCriterion
from google.adk.evaluation.eval_metrics import EvalMetric
from google.adk.evaluation.evaluator import EvaluationResult
from google.adk.evaluation.evaluator import Evaluator
from google.adk.evaluation.evaluator import EvalStatus
from google.adk.evaluation.evaluator import PerInvocationResult


class FinalStateMatchEvaluator(Evaluator):
  """Scores 1.0 when the final state matches the expected state."""

  criterion_type = BaseCriterion

  def __init__(self, eval_metric: EvalMetric):
    if eval_metric.criterion is not None:
      self._threshold = eval_metric.criterion.threshold
    elif eval_metric.threshold is not None:
      self._threshold = eval_metric.threshold
    else:
      raise ValueError("final_state_match requires a threshold.")

  def evaluate_with_context(
      self,
      actual_invocations,
      expected_invocations=None,
      conversation_scenario=None,
      *,
      context: EvaluationContext,
  ) -> EvaluationResult:
    actual = context.final_session_state
    expected = context.expected_final_session_state
    if actual is None or expected is None or not actual_invocations:
      return EvaluationResult()

    score = 1.0 if actual == expected else 0.0
    status = (
        EvalStatus.PASSED if score >= self._threshold else EvalStatus.FAILED
    )
    return EvaluationResult(
        overall_score=score,
        overall_eval_status=status,
        per_invocation_results=[
            PerInvocationResult(
                actual_invocation=invocation, score=score, eval_status=status
            )
            for invocation in actual_invocations
        ],
    )


from google.adk.evaluation.eval_metrics import Interval
from google.adk.evaluation.eval_metrics import MetricInfo
from google.adk.evaluation.eval_metrics import MetricValueInfo
from google.adk.evaluation.metric_evaluator_registry import DEFAULT_METRIC_EVALUATOR_REGISTRY

DEFAULT_METRIC_EVALUATOR_REGISTRY.register_evaluator(
    metric_info=MetricInfo(
        metric_name="final_state_match",
        description="Checks the expected final session state.",
        metric_value_info=MetricValueInfo(
            interval=Interval(min_value=0.0, max_value=1.0)
        ),
    ),
    evaluator=FinalStateMatchEvaluator,
)
