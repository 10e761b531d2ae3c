"""Session state for metrics: ``EvaluationContext`` and ``evaluate_with_context``.

google-adk 2.13.0 does not have this API yet (see the seed change "Session state
for metrics"). evalsnap provides it under the same names and semantics so that
evaluators written against ADK's upcoming API run unchanged:

* ``EvaluationContext`` is importable from ``google.adk.evaluation`` (installed
  here only when ADK does not define it);
* ``Evaluator.evaluate_with_context(actual, expected, scenario, *, context)``
  exists on ADK's ``Evaluator``; its default calls ``evaluate_invocations`` with
  the original arguments, so existing evaluators and custom functions are
  untouched.

When google-adk ships the API, both shims step aside (``hasattr`` checks) and
evalsnap uses ADK's own.
"""

from __future__ import annotations

import copy
import functools
import inspect
from typing import Any

import google.adk.evaluation as adk_evaluation
from google.adk.evaluation import evaluator as adk_evaluator
from google.adk.evaluation.custom_metric_evaluator import _CustomMetricEvaluator
from google.adk.evaluation.evaluator import EvaluationResult, Evaluator
from pydantic import BaseModel, ConfigDict

from evalsnap.deadlines import in_daemon_thread, off_the_loop

SessionState = dict[str, Any]


class EvaluationContext(BaseModel):
    """State for the whole eval case, given to ``evaluate_with_context``.

    Each field is a dict, or None when unavailable; ``{}`` is a valid state.
    """

    model_config = ConfigDict(extra="forbid")

    initial_session_state: SessionState | None = None
    """Actual state before the first turn."""
    final_session_state: SessionState | None = None
    """Actual state after the last turn."""
    expected_final_session_state: SessionState | None = None
    """``EvalCase.final_session_state`` as given (omitted means ``{}``; null means none)."""


def _default_evaluate_with_context(
    self: Evaluator,
    actual_invocations: Any,
    expected_invocations: Any = None,
    conversation_scenario: Any = None,
    *,
    context: Any,
) -> Any:
    del context  # the default keeps the original arguments
    return self.evaluate_invocations(actual_invocations, expected_invocations, conversation_scenario)


if not hasattr(adk_evaluator, "EvaluationContext"):
    adk_evaluator.EvaluationContext = EvaluationContext  # type: ignore[attr-defined]
if not hasattr(adk_evaluation, "EvaluationContext"):
    adk_evaluation.EvaluationContext = adk_evaluator.EvaluationContext  # type: ignore[attr-defined]
if not hasattr(Evaluator, "evaluate_with_context"):
    Evaluator.evaluate_with_context = _default_evaluate_with_context  # type: ignore[attr-defined]

# From here on, use whichever class ADK exposes (ours, or ADK's once released).
Context: Any = adk_evaluator.EvaluationContext  # type: ignore[attr-defined]


def make_context(initial: SessionState | None, final: SessionState | None,
                 expected: SessionState | None) -> Any:
    """A fresh context with deep copies: a metric mutating it cannot affect another."""
    return Context(
        initial_session_state=copy.deepcopy(initial),
        final_session_state=copy.deepcopy(final),
        expected_final_session_state=copy.deepcopy(expected),
    )


async def run_evaluator(evaluator: Evaluator, actual: Any, expected: Any, scenario: Any,
                        context: Any, *, user_code: bool = False) -> EvaluationResult:
    """Calls ``evaluate_with_context`` (sync or async) and awaits if needed.

    ``user_code`` (a custom metric): synchronous code runs on a daemon thread
    (:func:`evalsnap.deadlines.in_daemon_thread`), so it neither blocks the loop the other
    units share nor escapes its deadline.
    """
    call = functools.partial(evaluator.evaluate_with_context,  # type: ignore[attr-defined]
                             actual, expected, scenario, context=context)
    if user_code and isinstance(evaluator, _CustomMetricEvaluator):
        # ADK calls the function on the loop and awaits what it returns
        evaluator._metric_function = off_the_loop(evaluator._metric_function)  # noqa: SLF001
        result = call()
    elif user_code and not _is_async(evaluator):
        result = await in_daemon_thread(call)
    else:
        result = call()
    if inspect.isawaitable(result):
        result = await result
    return result


def _is_async(evaluator: Evaluator) -> bool:
    """Whether the evaluator's entry point is a coroutine function (ADK's default
    ``evaluate_with_context`` hands over to ``evaluate_invocations``)."""
    entry = type(evaluator).evaluate_with_context  # type: ignore[attr-defined]
    if entry is _default_evaluate_with_context:
        entry = type(evaluator).evaluate_invocations
    return inspect.iscoroutinefunction(entry)
