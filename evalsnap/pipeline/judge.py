"""Capturing judge model calls without touching ADK's process-global LLM registry.

ADK's LLM-as-judge evaluators hold their model in ``self._judge_model``; evalsnap
wraps that one attribute of the one evaluator instance that scores a unit, so the
agent's own model (and other evaluators) are never intercepted.

The wrapper (:class:`JudgeRecorder`) answers each request from one of three places:

* the live judge model (under the run's model-call limiter, :mod:`evalsnap.pipeline.limits`;
  transient errors retried with backoff);
* with ``--reuse``, an earlier ledger entry with the same request key and sample index;
* in ``replay``, only the unit's own ledger — anything else is a mismatch, and no
  model is ever called.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections import Counter
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import Any

from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.genai import types

from evalsnap import settings
from evalsnap.adk.judge_adapters import JudgeAdapter, adapter_for
from evalsnap.deadlines import exceeded
from evalsnap.pipeline.limits import ModelLimiter

logger = logging.getLogger(__name__)
_TRANSIENT_CODES = frozenset({408, 429, 500, 502, 503, 504})


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


def sample_ref(key: str, sample_index: int) -> str:
    """Name of the ledger index ref for (request key, sample index)."""
    return hashlib.sha256(f"{key}#{sample_index}".encode()).hexdigest()


def response_text(response: LlmResponse) -> str:
    parts = response.content.parts if response.content and response.content.parts else []
    return "".join(p.text or "" for p in parts)


def response_usage(responses: list[LlmResponse]) -> tuple[dict[str, Any] | None, str | None]:
    """(usage metadata as JSON, model version) of one judge call's responses.

    The last response that carries usage metadata holds the call's usage: a call that
    is not streamed has one response, and a streamed one reports its running total last,
    so summing the chunks would count tokens twice.
    """
    usage = next((r.usage_metadata for r in reversed(responses) if r.usage_metadata), None)
    version = next((r.model_version for r in reversed(responses) if r.model_version), None)
    return (usage.model_dump(mode="json", exclude_none=True) if usage is not None else None,
            version)


def _prompt_text(llm_request: LlmRequest) -> str:
    users = [c for c in llm_request.contents if c.role == "user"]
    return "".join(p.text or "" for p in (users[-1].parts or [])) if users else ""


# ---- answers from a ledger -------------------------------------------------------------------

@dataclass(frozen=True)
class LedgerAnswer:
    """A recorded answer: raw text, or the error the call ended with."""

    oid: str
    raw_response: str | None
    error: str | None
    judge_class: str = ""


class LedgerMismatch(Exception):
    """Replay met a request the ledger does not hold."""


class RecordedJudgeError(Exception):
    """Replay of a judge sample that failed when it was recorded."""


@dataclass
class LedgerSource:
    """Where recorded answers come from: ``lookup(key, sample_index)``.

    ``strict`` (replay): a request without a recorded answer raises
    :class:`LedgerMismatch` and no model is called.
    """

    lookup: Callable[[str, int], LedgerAnswer | None]
    strict: bool = False


def retry_delays(s: settings.Settings | None = None) -> list[float]:
    """Backoff between judge attempts: ``EVALSNAP_RETRY_DELAYS`` (seconds), as for tasks
    (``s``: the run's settings; default: the environment's)."""
    return list((s or settings.get()).retry_delays)


def is_transient(exc: BaseException) -> bool:
    flag = getattr(exc, "retryable", None)
    if flag is not None:
        return bool(flag)
    code = getattr(exc, "code", None) or getattr(exc, "status_code", None)
    if isinstance(code, int):
        return code in _TRANSIENT_CODES
    return isinstance(exc, TimeoutError | ConnectionError)


# ---- the recorder ----------------------------------------------------------------------------

@dataclass
class JudgeCall:
    """One judge request (one sample, one attempt) and what came back."""

    sequence: int
    sample_index: int
    request_key: str
    request: dict[str, Any]
    judge_class: str
    invocation_index: int | None = None
    role: str = "judge"
    attempt: int = 1
    raw_response: str | None = None
    error: str | None = None
    parsed: dict[str, Any] | None = None
    parse_ok: bool = False
    live: bool = True
    """True when the judge model was called; False when answered from a ledger."""
    reused_from: str | None = None
    usage_metadata: dict[str, Any] | None = None
    """The token usage the judge reported (live calls only; see :func:`response_usage`)."""
    model_version: str | None = None
    """The model version the judge's response names."""

    @property
    def failed(self) -> bool:
        return self.error is not None or not self.parse_ok


@dataclass
class JudgeRecorder:
    """Wraps a judge ``BaseLlm``; records every call and where its answer came from."""

    inner: Any
    adapter: JudgeAdapter
    source: LedgerSource | None = None
    limiter: ModelLimiter | None = None
    """The run's model-call limiter; None: live calls are not limited."""
    calls: list[JudgeCall] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)
    _samples: Counter[str] = field(default_factory=Counter)

    @property
    def model(self) -> str:
        return str(getattr(self.inner, "model", ""))

    @property
    def live_calls(self) -> int:
        return sum(1 for c in self.calls if c.live)

    @property
    def reused_samples(self) -> int:
        return sum(1 for c in self.calls if not c.live and c.reused_from)

    def failed_samples(self) -> list[JudgeCall]:
        """Samples whose last attempt errored or did not parse."""
        last: dict[tuple[str, int], JudgeCall] = {}
        for c in self.calls:
            last[(c.request_key, c.sample_index)] = c
        return [c for c in last.values() if c.failed]

    def failed_invocations(self) -> set[int | None]:
        """Invocations with a failed sample; ``None`` stands for unattributed calls."""
        return {c.invocation_index for c in self.failed_samples()}

    def _new_call(self, key: str, sample: int, view: dict[str, Any], prompt: str,
                  judge_class: str, attempt: int = 1) -> JudgeCall:
        index, role = self.adapter.tag(prompt, sample)
        call = JudgeCall(sequence=len(self.calls), sample_index=sample, request_key=key,
                         request=view, judge_class=judge_class, invocation_index=index,
                         role=role, attempt=attempt)
        self.calls.append(call)
        return call

    def _parse(self, call: JudgeCall) -> None:
        try:
            call.parsed, call.parse_ok = self.adapter.parse(call.raw_response or "", call.role)
        except Exception as exc:  # noqa: BLE001 - a parser crash is an unparseable answer
            call.parsed, call.parse_ok = {"parser_error": f"{type(exc).__name__}: {exc}"}, False

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        view = request_view(llm_request)
        key = request_key(view)
        sample = self._samples[key]
        self._samples[key] += 1
        prompt = _prompt_text(llm_request)
        answer = self.source.lookup(key, sample) if self.source is not None else None
        if answer is not None:
            call = self._new_call(key, sample, view, prompt, answer.judge_class)
            call.live, call.reused_from = False, answer.oid
            call.raw_response, call.error = answer.raw_response, answer.error
            if answer.error is not None:
                raise RecordedJudgeError(answer.error)
            self._parse(call)
            yield LlmResponse(content=types.Content(
                role="model", parts=[types.Part(text=answer.raw_response or "")]))
            return
        if self.source is not None and self.source.strict:
            call = self._new_call(key, sample, view, prompt, "")
            call.live = False
            call.error = f"no recorded answer for request {key} sample {sample}"
            self.mismatches.append(
                f"invocation {call.invocation_index} ({call.role}) sample {sample}: the request "
                "does not match the ledger (changed template, reference or judge config?)")
            raise LedgerMismatch(call.error)
        async for response in self._call_model(llm_request, stream, key, sample, view, prompt):
            yield response

    async def _call_model(self, llm_request: LlmRequest, stream: bool, key: str, sample: int,
                          view: dict[str, Any], prompt: str) -> AsyncGenerator[LlmResponse, None]:
        judge_class = f"{type(self.inner).__module__}.{type(self.inner).__qualname__}"
        s = self.limiter.settings if self.limiter is not None else settings.get()  # the run's
        delays = retry_delays(s)
        timeout = s.judge_call_timeout
        for attempt in range(1, len(delays) + 2):
            call = self._new_call(key, sample, view, prompt, judge_class, attempt)
            try:
                async with (self.limiter.slot("judge") if self.limiter is not None
                            else contextlib.nullcontext()):
                    responses = await self._answers(llm_request, stream, timeout)
            except Exception as exc:
                call.error = f"{type(exc).__name__}: {exc}"
                if attempt <= len(delays) and is_transient(exc):
                    logger.info("judge attempt %d failed (%s); retrying", attempt, call.error)
                    await asyncio.sleep(delays[attempt - 1])
                    continue
                raise
            call.raw_response = "".join(response_text(r) for r in responses)
            call.usage_metadata, call.model_version = response_usage(responses)
            self._parse(call)
            for response in responses:
                yield response
            return


    async def _answers(self, llm_request: LlmRequest, stream: bool,
                       timeout: float) -> list[LlmResponse]:
        deadline = asyncio.timeout(timeout)
        try:
            async with deadline:
                return [r async for r in self.inner.generate_content_async(llm_request, stream)]
        except TimeoutError:
            if not deadline.expired():
                raise  # the model's own timeout: its error, retried as transient
            raise exceeded(f"judge call to {self.model or 'the judge model'}", timeout,
                           "EVALSNAP_JUDGE_CALL_TIMEOUT") from None


def attach_recorder(evaluator: Any, source: LedgerSource | None = None,
                    limiter: ModelLimiter | None = None) -> JudgeRecorder | None:
    """Wraps the evaluator's judge model, if it has one."""
    inner = getattr(evaluator, "_judge_model", None)
    if inner is None:
        return None
    recorder = JudgeRecorder(inner=inner, adapter=adapter_for(evaluator), source=source,
                             limiter=limiter)
    evaluator._judge_model = recorder  # noqa: SLF001 (the documented capture point)
    return recorder
