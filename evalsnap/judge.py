"""Capturing judge model calls without touching ADK's process-global LLM registry.

ADK's LLM-as-judge evaluators hold their model in ``self._judge_model``; evalsnap
wraps that one attribute of the one evaluator instance that scores a unit, so the
agent's own model (and other evaluators) are never intercepted.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import Counter
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse


def request_view(llm_request: LlmRequest) -> dict[str, Any]:
    """The parts of a request that define the judge's question (no credentials, no headers)."""
    return {
        "model": llm_request.model,
        "contents": [c.model_dump(mode="json", exclude_none=True) for c in llm_request.contents],
        "config": _config_view(llm_request.config),
    }


def _config_view(config: Any) -> dict[str, Any] | None:
    if config is None:
        return None
    data = config.model_dump(mode="json", exclude_none=True)
    # http_options can carry headers (API keys); it is transport, not the question.
    data.pop("http_options", None)
    return data


def request_key(view: dict[str, Any]) -> str:
    body = json.dumps(view, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(body.encode()).hexdigest()


def response_text(response: LlmResponse) -> str:
    parts = response.content.parts if response.content and response.content.parts else []
    return "".join(p.text or "" for p in parts)


@dataclass
class JudgeCall:
    """One judge request and what came back."""

    sequence: int
    sample_index: int
    request_key: str
    request: dict[str, Any]
    raw_response: str | None = None
    error: str | None = None


@dataclass
class JudgeRecorder:
    """Wraps a judge ``BaseLlm``; counts and records every call."""

    inner: Any
    calls: list[JudgeCall] = field(default_factory=list)
    limiter: asyncio.Semaphore | None = None
    _samples: Counter[str] = field(default_factory=Counter)

    @property
    def model(self) -> str:
        return str(getattr(self.inner, "model", ""))

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        view = request_view(llm_request)
        key = request_key(view)
        call = JudgeCall(sequence=len(self.calls), sample_index=self._samples[key],
                         request_key=key, request=view)
        self._samples[key] += 1
        self.calls.append(call)
        try:
            if self.limiter is not None:
                async with self.limiter:
                    responses = [r async for r in self.inner.generate_content_async(llm_request,
                                                                                   stream)]
            else:
                responses = [r async for r in self.inner.generate_content_async(llm_request,
                                                                               stream)]
        except Exception as exc:
            call.error = f"{type(exc).__name__}: {exc}"
            raise
        call.raw_response = "".join(response_text(r) for r in responses)
        for response in responses:
            yield response


def attach_recorder(evaluator: Any, limiter: asyncio.Semaphore | None = None) -> JudgeRecorder | None:
    """Wraps the evaluator's judge model, if it has one."""
    inner = getattr(evaluator, "_judge_model", None)
    if inner is None:
        return None
    recorder = JudgeRecorder(inner=inner, limiter=limiter)
    evaluator._judge_model = recorder  # noqa: SLF001 (the documented capture point)
    return recorder
