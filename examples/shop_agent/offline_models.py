"""Offline stand-ins for the agent's model and the judge model.

Both are real ADK ``BaseLlm`` subclasses registered with ``LLMRegistry``, so the whole ADK
path — runner, tools, session state, judge prompt rendering, sampling, parsing,
aggregation — runs for real without the internet:

* :class:`ScriptedAgentLlm` (``offline-agent*``) follows the keyword table in
  :mod:`shop_agent._agent_script`: one model call per tool call, then one for the answer.
* :class:`OfflineJudgeLlm` (``offline-judge*``) answers ADK's judge prompts by the rules in
  :mod:`shop_agent._judge_answers`.

Importing this module registers both models (:func:`register`). It is the demo's own
plugin, not the product's: ``test_config.json`` names it under ``"evalsnapPlugins"``, so every
process that resolves the demo's config (the CLI, a deployment's flow run, a Dask worker)
imports it from the agent's parent directory, and ``agent.py`` imports it relatively for
the agent's model. Installing evalsnap registers nothing of it.

Always import it as ``shop_agent.offline_models`` (the config's plugin name, and what the
relative import in ``agent.py`` resolves to): a second import under another name (say
``examples.shop_agent.offline_models``) would get its own classes and counters.

Environment knobs, read on every call so tests can ``monkeypatch.setenv``:

=================================  ==========================================================
``EVALSNAP_DEMO_AGENT_LATENCY_MS``  simulated latency per agent call (fallback below)
``EVALSNAP_DEMO_JUDGE_LATENCY_MS``  simulated latency per judge call (fallback below)
``EVALSNAP_DEMO_LATENCY_MS``        fallback latency for both (default 0)
``EVALSNAP_DEMO_AGENT_FAIL_FIRST``  the first N agent calls since the last reset raise
                                    :class:`TransientModelError` (default 0)
``EVALSNAP_DEMO_JUDGE_FAIL_FIRST``  the same for judge calls (default 0)
``EVALSNAP_DEMO_JUDGE_GARBLE``      ``1``: the judge answers text no ADK parser accepts
=================================  ==========================================================

A user text containing ``FAIL_MODEL`` makes the agent model raise
:class:`ScriptedModelError` (a permanent failure, never worth retrying).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections import Counter
from collections.abc import AsyncGenerator
from typing import Any

from google.adk.models import LlmCapabilities
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.models.registry import LLMRegistry
from google.genai import types

from ._agent_script import answer_from_tool_results, plan_turn
from ._judge_answers import GARBLED_ANSWER, answer_prompt

__all__ = [
    "AGENT_MODEL",
    "JUDGE_MODEL",
    "OfflineJudgeLlm",
    "ScriptedAgentLlm",
    "ScriptedModelError",
    "TransientModelError",
    "counters",
    "register",
    "reset_counters",
]

AGENT_MODEL = "offline-agent-v1"
JUDGE_MODEL = "offline-judge-v1"
FAIL_KEYWORD = "FAIL_MODEL"


class TransientModelError(Exception):
    """A simulated temporary outage (think HTTP 503): retrying the call can succeed."""

    retryable = True


class ScriptedModelError(Exception):
    """A simulated permanent model failure, triggered by ``FAIL_MODEL`` in the user text."""

    retryable = False


# Process-global so that tests (and benchmarks) can count real model calls made through
# any Runner or evaluator instance; a lock because Prefect/Dask may call from threads.
_lock = threading.Lock()
_counts: dict[str, int] = {}


def _bump(key: str) -> int:
    with _lock:
        _counts[key] = _counts.get(key, 0) + 1
        return _counts[key]


def counters() -> Counter[str]:
    """A copy of the call counters since the last :func:`reset_counters`.

    Keys: ``agent_calls`` (every call, failed ones included), ``agent_errors``
    (``FAIL_MODEL``), ``agent_transient_errors``, ``judge_calls`` (every call),
    ``judge_transient_errors``, ``judge_garbled``, and ``judge_calls.<kind>`` per
    recognised judge template (``judge_calls.unrecognised`` otherwise). A ``Counter``,
    so a key that never counted reads as 0.
    """
    with _lock:
        return Counter(_counts)


def reset_counters() -> None:
    """Zero every counter; this also restarts the ``*_FAIL_FIRST`` budgets."""
    with _lock:
        _counts.clear()


def _env_int(name: str, default: int = 0) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return max(0, int(float(raw)))
    except ValueError:
        # Fail loudly: a benchmark silently running without latency would mislead.
        raise ValueError(f"{name} must be a number, got {raw!r}") from None


async def _simulate_latency(role: str) -> None:
    specific = f"EVALSNAP_DEMO_{role}_LATENCY_MS"
    ms = (
        _env_int(specific)
        if os.environ.get(specific, "").strip()
        else _env_int("EVALSNAP_DEMO_LATENCY_MS")
    )
    if ms:
        await asyncio.sleep(ms / 1000)


def _text_of(content: types.Content) -> str:
    return "\n".join(p.text for p in content.parts or [] if p.text)


def _usage(request_text: str, answer_text: str) -> types.GenerateContentResponseUsageMetadata:
    # Word counts stand in for tokens: deterministic, so token metrics are reproducible.
    prompt, answer = len(request_text.split()), len(answer_text.split())
    return types.GenerateContentResponseUsageMetadata(
        prompt_token_count=prompt, candidates_token_count=answer, total_token_count=prompt + answer
    )


class _OfflineLlm(BaseLlm):
    """Shared bits: explicit capabilities (avoids ADK's name-based fallback)."""

    @property
    def capabilities(self) -> LlmCapabilities:
        return LlmCapabilities(output_schema_and_tools=False)


def _read_turn(llm_request: LlmRequest) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    """(latest user text, this turn's tool results in order) from the request history.

    The latest user text is the last user-role content carrying text and no function
    response; every function response after it belongs to the current turn.
    """
    contents = llm_request.contents
    start = -1
    for i, content in enumerate(contents):
        parts = content.parts or []
        if content.role == "user" and any(p.text for p in parts):
            if not any(p.function_response for p in parts):
                start = i
    if start < 0:
        return "", []
    results = [
        (p.function_response.name or "", dict(p.function_response.response or {}))
        for content in contents[start + 1 :]
        for p in content.parts or []
        if p.function_response
    ]
    return _text_of(contents[start]), results


class ScriptedAgentLlm(_OfflineLlm):
    """Deterministic agent model: the keyword table of :mod:`shop_agent._agent_script`."""

    model: str = AGENT_MODEL

    @classmethod
    def supported_models(cls) -> list[str]:
        return [r"offline-agent.*"]

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        call_no = _bump("agent_calls")
        await _simulate_latency("AGENT")
        if call_no <= _env_int("EVALSNAP_DEMO_AGENT_FAIL_FIRST"):
            _bump("agent_transient_errors")
            raise TransientModelError(f"simulated transient agent model error (call {call_no})")
        user_text, results = _read_turn(llm_request)
        if FAIL_KEYWORD in user_text:
            _bump("agent_errors")
            raise ScriptedModelError(f"scripted failure: the user text contains {FAIL_KEYWORD}")
        request_text = "\n".join(_text_of(c) for c in llm_request.contents)
        plan = plan_turn(user_text)
        if not isinstance(plan, str) and len(results) < len(plan):
            # One call per model turn, in plan order, so trajectories are predictable.
            call = plan[len(results)]
            yield LlmResponse(
                content=types.Content(
                    role="model",
                    parts=[
                        types.Part(function_call=types.FunctionCall(name=call.name, args=call.args))
                    ],
                ),
                model_version=self.model,
                usage_metadata=_usage(request_text, f"{call.name} {call.args}"),
            )
            return
        text = plan if isinstance(plan, str) else answer_from_tool_results(results)
        yield LlmResponse(
            content=types.Content(role="model", parts=[types.Part(text=text)]),
            model_version=self.model,
            usage_metadata=_usage(request_text, text),
        )


class OfflineJudgeLlm(_OfflineLlm):
    """Deterministic judge: answers ADK judge prompts by :mod:`shop_agent._judge_answers`."""

    model: str = JUDGE_MODEL

    @classmethod
    def supported_models(cls) -> list[str]:
        return [r"offline-judge.*"]

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        call_no = _bump("judge_calls")
        await _simulate_latency("JUDGE")
        if call_no <= _env_int("EVALSNAP_DEMO_JUDGE_FAIL_FIRST"):
            _bump("judge_transient_errors")
            raise TransientModelError(f"simulated transient judge model error (call {call_no})")
        user_contents = [c for c in llm_request.contents if c.role == "user"]
        prompt = _text_of(user_contents[-1]) if user_contents else ""
        if os.environ.get("EVALSNAP_DEMO_JUDGE_GARBLE", "").strip() == "1":
            _bump("judge_garbled")
            text = GARBLED_ANSWER
        else:
            kind, text = answer_prompt(prompt)
            _bump(f"judge_calls.{kind or 'unrecognised'}")
        yield LlmResponse(
            content=types.Content(role="model", parts=[types.Part(text=text)]),
            model_version=self.model,
            usage_metadata=_usage(prompt, text),
        )


def register() -> None:
    """Register both models with ADK's ``LLMRegistry``; calling it again is a no-op."""
    for cls, probe in ((ScriptedAgentLlm, AGENT_MODEL), (OfflineJudgeLlm, JUDGE_MODEL)):
        try:
            if LLMRegistry.resolve(probe) is cls:
                continue
        except ValueError:  # Not registered yet.
            pass
        LLMRegistry.register(cls)


# Imported as a plugin (``evalsnapPlugins``) or by agent.py: registering is the import's job.
register()
