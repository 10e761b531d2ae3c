"""Rubrics onto actual invocations, exactly as ADK's ``LocalEvalService`` puts them there.

ADK does this with two private helpers of ``local_eval_service``; this is the one place that
imports them, so an ADK release that moves them breaks here and nowhere else.
"""

from __future__ import annotations

from google.adk.evaluation.eval_case import EvalCase, Invocation
from google.adk.evaluation.local_eval_service import (
    _copy_eval_case_rubrics_to_actual_invocations,
    _copy_invocation_rubrics_to_actual_invocations,
)


def copy_rubrics(reference: EvalCase, expected: list[Invocation] | None,
                 actual: list[Invocation]) -> None:
    """Copies the case's and the expected invocations' rubrics onto ``actual`` (in place);
    ``ValueError`` when they do not fit."""
    _copy_eval_case_rubrics_to_actual_invocations(reference, actual)
    _copy_invocation_rubrics_to_actual_invocations(expected, actual)
