"""Custom function metric of the demo, named in ``test_config.json`` under ``customMetrics``.

``answer_uses_tool_results``: does the final answer repeat every number the turn's tools
returned (temperatures, converted amounts, nights)? Per actual invocation: 1.0 when it
does (or when no tool returned a number), else 0.0; overall the mean. It reads the tool
responses through ADK's ``get_all_tool_responses``, so it scores ADK and LangGraph agents
alike. Pure and deterministic: no model calls.
"""

from __future__ import annotations

import re
from typing import Any

from google.adk.evaluation.conversation_scenarios import ConversationScenario
from google.adk.evaluation.eval_case import Invocation, get_all_tool_responses
from google.adk.evaluation.eval_metrics import EvalMetric, EvalStatus
from google.adk.evaluation.evaluator import EvaluationResult, PerInvocationResult

__all__ = ["answer_uses_tool_results", "numbers_returned"]

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _numbers(value: Any) -> set[float]:
    if isinstance(value, bool):
        return set()
    if isinstance(value, int | float):
        return {float(value)}
    if isinstance(value, dict):
        return {n for v in value.values() for n in _numbers(v)}
    if isinstance(value, list):
        return {n for v in value for n in _numbers(v)}
    return set()


def numbers_returned(invocation: Invocation) -> set[float]:
    """Every number in the invocation's tool responses."""
    return {n for r in get_all_tool_responses(invocation.intermediate_data) for n in _numbers(r.response)}


def _text(content: Any) -> str:
    return " ".join(p.text for p in getattr(content, "parts", None) or [] if getattr(p, "text", None))


def answer_uses_tool_results(metric: EvalMetric, actual: list[Invocation], expected: list[Invocation] | None,
                             scenario: ConversationScenario | None) -> EvaluationResult:
    """One row per actual invocation, in order (the evalsnap custom metric contract)."""
    del scenario
    if metric.criterion is None:
        raise ValueError(f"{metric.metric_name}: a criterion with a threshold is required")
    threshold = float(metric.criterion.threshold)
    rows = []
    for i, invocation in enumerate(actual):
        said = {float(n) for n in _NUMBER.findall(_text(invocation.final_response))}
        score = 1.0 if numbers_returned(invocation) <= said else 0.0
        rows.append(PerInvocationResult(
            actual_invocation=invocation, expected_invocation=expected[i] if expected and i < len(expected) else None,
            score=score, eval_status=EvalStatus.PASSED if score >= threshold else EvalStatus.FAILED))
    if not rows:
        return EvaluationResult()
    overall = sum(r.score or 0.0 for r in rows) / len(rows)
    return EvaluationResult(overall_score=overall, per_invocation_results=rows,
                            overall_eval_status=EvalStatus.PASSED if overall >= threshold else EvalStatus.FAILED)
