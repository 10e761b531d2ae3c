"""Efficiency metrics, token counts and the estimated cost of a run, computed at publish.

ADK 2.13 reports informational efficiency metrics on every ``adk eval``
(``append_default_efficiency_metrics``: tool calls, model calls, tokens and duration per
turn). They are reference-free, never pass or fail, and are a deterministic function of
the inference, so evalsnap does not make them scoring units (nothing to gate, nothing to
reuse): publish computes them with ADK's own evaluators, from ADK's registry, on each
stored inference and keeps the values in the record.

Tokens come from the usage metadata the models reported: the agent's from what the
model-boundary plugin that counts the agent's model calls saw (``InferenceRecord.model_usage``:
AgentTool inner runs and sub-agents included; records written before it was kept: the
invocation events of the inference), the judge's from the ledger entries of the judge calls a
run made. ADK's own ``token_usage_v1`` stays ADK's: it reads the invocation events.
A model is named by the model version its response reports (the model that served the
call, whichever agent of the tree asked); that name is the key of the price table.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from google.adk.evaluation.eval_case import Invocation, InvocationEvents
from google.adk.evaluation.eval_config import append_default_efficiency_metrics
from google.adk.evaluation.eval_metrics import EvalMetric
from google.adk.evaluation.evaluator import EvaluationResult, Evaluator
from google.adk.evaluation.metric_evaluator_registry import DEFAULT_METRIC_EVALUATOR_REGISTRY
from google.genai.types import GenerateContentResponseUsageMetadata as UsageMetadata

from evalsnap.records import InferenceRecord, LedgerEntry
from evalsnap.records.record import EfficiencyValue, ModelPrice, TokenCounts

logger = logging.getLogger(__name__)

UNREPORTED_MODEL = "<unreported>"
"""The model name of a response that names no model version (it can have no price)."""
ZERO = TokenCounts(input_tokens=0, output_tokens=0, total_tokens=0, cached_tokens=0,
                   thoughts_tokens=0)
"""What a run that called no model of a kind spent."""
_FIELDS = tuple(TokenCounts.model_fields)


# ---- ADK's efficiency metrics ----------------------------------------------------------------

@functools.cache
def efficiency_evaluators() -> tuple[tuple[str, Evaluator], ...]:
    """ADK's default efficiency metrics and their evaluators, from ADK's own registry."""
    metrics: list[EvalMetric] = append_default_efficiency_metrics([])
    return tuple((m.metric_name, DEFAULT_METRIC_EVALUATOR_REGISTRY.get_evaluator(m))
                 for m in metrics)


def _details(result: EvaluationResult) -> dict[str, float | None] | None:
    breakdown = result.overall_token_usage_details or result.overall_duration_details
    return breakdown.model_dump() if breakdown is not None else None


def _evaluate(name: str, evaluator: Evaluator, invocations: list[Invocation]) -> EfficiencyValue:
    """One metric as ``LocalEvalService`` evaluates it: the evaluator on the actual
    invocations (reference-free: it reads no expected ones), NOT_EVALUATED if it raises."""
    try:
        result: Any = evaluator.evaluate_invocations(actual_invocations=invocations,
                                                     expected_invocations=None)
        if inspect.iscoroutine(result):
            result = asyncio.run(result)  # publish runs outside any event loop
    except Exception as exc:  # noqa: BLE001 - as ADK: a metric that fails reports nothing
        logger.warning("efficiency metric %s failed (%s: %s); it is NOT_EVALUATED", name,
                       type(exc).__name__, exc)
        return EfficiencyValue(status="NOT_EVALUATED")
    return EfficiencyValue(value=result.overall_score, status=result.overall_eval_status.name,
                           details=_details(result))


def efficiency_of(inference: InferenceRecord) -> dict[str, EfficiencyValue]:
    """ADK's efficiency metrics of one inference; none for a failed one (as ADK)."""
    if not inference.ok:
        return {}
    return {name: _evaluate(name, evaluator, inference.invocations)
            for name, evaluator in efficiency_evaluators()}


# ---- token counts ----------------------------------------------------------------------------

def _plus(a: int | None, b: int | None) -> int | None:
    """A sum that keeps "not reported" apart from zero."""
    return None if a is None and b is None else (a or 0) + (b or 0)


def counts_of(usage: UsageMetadata) -> TokenCounts:
    """One response's usage metadata as counts (input and output as ADK's ``token_usage_v1``)."""
    input_tokens = _plus(usage.prompt_token_count, usage.tool_use_prompt_token_count)
    output_tokens = _plus(usage.candidates_token_count, usage.thoughts_token_count)
    total = (usage.total_token_count if input_tokens is None and output_tokens is None
             else _plus(input_tokens, output_tokens))
    return TokenCounts(input_tokens=input_tokens, output_tokens=output_tokens,
                       total_tokens=total, cached_tokens=usage.cached_content_token_count,
                       thoughts_tokens=usage.thoughts_token_count)


def add(a: TokenCounts | None, b: TokenCounts | None) -> TokenCounts | None:
    if a is None or b is None:
        return a if b is None else b
    return TokenCounts(**{f: _plus(getattr(a, f), getattr(b, f)) for f in _FIELDS})


def total(counts: Iterable[TokenCounts | None]) -> TokenCounts | None:
    """The sum; None when nothing was reported."""
    out: TokenCounts | None = None
    for c in counts:
        out = add(out, c)
    return out


def merge_by_model(into: dict[str, TokenCounts], more: Mapping[str, TokenCounts]) -> None:
    for model, counts in more.items():
        into[model] = add(into.get(model), counts) or counts


def agent_tokens_by_model(inference: InferenceRecord) -> tuple[dict[str, TokenCounts], int]:
    """The agent's tokens in one inference, by the model version each response names; and
    how many responses reported usage."""
    by_model: dict[str, TokenCounts] = {}
    reported = 0
    if inference.model_usage is not None:
        for seen in inference.model_usage:
            reported += 1
            merge_by_model(by_model, {seen.model or UNREPORTED_MODEL:
                                      counts_of(UsageMetadata.model_validate(seen.usage))})
        return by_model, reported
    for invocation in inference.invocations:
        data = invocation.intermediate_data
        if not isinstance(data, InvocationEvents):
            continue
        for event in data.invocation_events:
            if event.usage_metadata is not None:
                reported += 1
                merge_by_model(by_model, {event.model_version or UNREPORTED_MODEL:
                                          counts_of(event.usage_metadata)})
    return by_model, reported


def judge_tokens_by_model(entries: Iterable[LedgerEntry]) -> tuple[dict[str, TokenCounts], int]:
    """Tokens of the judge calls that reached the model, by model; and how many of those
    calls reported no usage. The model is the version the response names, else the one
    requested."""
    by_model: dict[str, TokenCounts] = {}
    unreported = 0
    for entry in entries:
        if entry.source != "model" or entry.raw_response is None:
            continue  # a ledger answer or a call that raised: no tokens known to be spent
        if entry.usage_metadata is None:
            unreported += 1
            continue
        model = entry.model_version or str(entry.judge_model.get("model") or UNREPORTED_MODEL)
        merge_by_model(by_model, {model: counts_of(UsageMetadata.model_validate(
            entry.usage_metadata))})
    return by_model, unreported


# ---- the estimated cost ----------------------------------------------------------------------

def _spent(counts: TokenCounts) -> bool:
    return bool(counts.input_tokens or counts.output_tokens or counts.total_tokens)


def estimate_cost(model_tokens: Mapping[str, TokenCounts], prices: Mapping[str, ModelPrice] | None,
                  unreported_calls: int) -> tuple[float | None, dict[str, ModelPrice], str | None]:
    """(cost, prices used, why there is no cost) of a run's tokens, by model.

    Input tokens (cached ones included) at the input price, output tokens (thoughts
    included) at the output price. No estimate without a table, with a model that spent
    tokens and has no price or reported only a total, or when model calls reported no usage.
    """
    if prices is None:
        return None, {}, "no price table (`evalsnapPrices` in test_config.json)"
    used = {m: c for m, c in model_tokens.items() if _spent(c)}
    missing = sorted(m for m in used if m not in prices)
    if missing:
        return None, {}, f"no price for model(s) {', '.join(missing)} in `evalsnapPrices`"
    unsplit = sorted(m for m, c in used.items()
                     if c.input_tokens is None and c.output_tokens is None)
    if unsplit:
        return None, {}, f"model(s) {', '.join(unsplit)} reported no input/output token split"
    if unreported_calls:
        return None, {}, (f"{unreported_calls} model call(s) of this run have no recorded "
                          "token usage (the model reported none, or the inference failed)")
    cost = sum((c.input_tokens or 0) * prices[m].input_per_million
               + (c.output_tokens or 0) * prices[m].output_per_million
               for m, c in used.items()) / 1_000_000
    return cost, {m: prices[m] for m in sorted(used)}, None
