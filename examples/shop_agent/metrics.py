"""Custom function metric of the demo, named in ``test_config.json`` under ``customMetrics``.

``response_mentions_city``: does the agent's final answer mention the place the user asked
about? Per actual invocation, the *place names* are the capitalised words of the user text
that do not start a sentence (so "What", "Add", "Hello" are not places) other than "I":

* no place name in the user text: score 1.0 (nothing to mention, the check holds);
* otherwise 1.0 if the final response contains any of them as a word (case-insensitive),
  else 0.0.

The overall score is the mean over invocations; it passes when it reaches
``metric.criterion.threshold``. Pure and deterministic: no model calls.
"""

from __future__ import annotations

import re

from google.adk.evaluation.conversation_scenarios import ConversationScenario
from google.adk.evaluation.eval_case import Invocation
from google.adk.evaluation.eval_metrics import EvalMetric, EvalStatus
from google.adk.evaluation.evaluator import EvaluationResult, PerInvocationResult

__all__ = ["place_names", "response_mentions_city"]

_CAPITALISED = re.compile(r"\b[A-Z][a-zA-Z]+\b")
_SENTENCE_START = re.compile(r"(?:^|[.!?]\s+)\W*([A-Z][a-zA-Z]*)")


def _text(content: object) -> str:
    parts = getattr(content, "parts", None) or []
    return "\n".join(p.text for p in parts if getattr(p, "text", None))


def place_names(user_text: str) -> list[str]:
    """Capitalised words of ``user_text`` that do not start a sentence, in order."""
    starts = {m.start(1) for m in _SENTENCE_START.finditer(user_text)}
    return [
        m.group(0)
        for m in _CAPITALISED.finditer(user_text)
        if m.start() not in starts and m.group(0) != "I"
    ]


def _status(score: float, threshold: float) -> EvalStatus:
    return EvalStatus.PASSED if score >= threshold else EvalStatus.FAILED


def response_mentions_city(
    metric: EvalMetric,
    actual: list[Invocation],
    expected: list[Invocation] | None,
    scenario: ConversationScenario | None,
) -> EvaluationResult:
    """One row per actual invocation, in order (the evalsnap custom metric contract)."""
    del scenario  # The check needs only what the user asked and what the agent said.
    if metric.criterion is None:
        raise ValueError(f"{metric.metric_name}: a criterion with a threshold is required")
    threshold = float(metric.criterion.threshold)
    rows: list[PerInvocationResult] = []
    for i, invocation in enumerate(actual):
        places = place_names(_text(invocation.user_content))
        response_words = set(re.findall(r"[a-z]+", _text(invocation.final_response).lower()))
        score = 1.0 if not places or any(p.lower() in response_words for p in places) else 0.0
        rows.append(
            PerInvocationResult(
                actual_invocation=invocation,
                expected_invocation=expected[i] if expected and i < len(expected) else None,
                score=score,
                eval_status=_status(score, threshold),
            )
        )
    if not rows:
        return EvaluationResult()
    overall = sum(r.score or 0.0 for r in rows) / len(rows)
    return EvaluationResult(
        overall_score=overall,
        overall_eval_status=_status(overall, threshold),
        per_invocation_results=rows,
    )
