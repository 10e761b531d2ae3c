"""The judge model of a replay: answers come from the ledger, so no provider is needed.

Replay scores again with the live parsing and aggregation code, answering every judge
request from the unit's ledger (``evalsnap.pipeline.judge`` wraps the evaluator's judge
model and never calls it). ADK's evaluators still *construct* their judge model, which
fails where the judge's provider, credentials or registration are absent. For each judge
model name this process cannot resolve, :func:`stand_in_for` registers
:class:`LedgerOnlyLlm` under exactly that name; a model the process can resolve is left
alone. A stand-in that is called anyway raises: replay never calls a model.
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, Iterable
from typing import Any

from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.models.registry import LLMRegistry

from evalsnap.adk.config import unregistered_judge_model

_names: set[str] = set()


class LedgerOnlyLlm(BaseLlm):
    """Stands in for a judge model that replay answers from the ledger."""

    @classmethod
    def supported_models(cls) -> list[str]:
        return [re.escape(name) for name in sorted(_names)]

    async def generate_content_async(self, llm_request: LlmRequest, stream: bool = False
                                     ) -> AsyncGenerator[LlmResponse, None]:
        raise RuntimeError(f"replay called judge model {self.model!r}; it answers from the "
                           "ledger only")
        yield  # pragma: no cover - makes this an async generator


def stand_in_for(criteria: Iterable[dict[str, Any]]) -> list[str]:
    """Registers the stand-in for every judge model the criteria name that this process
    cannot resolve; returns those names."""
    missing = sorted({m for c in criteria if (m := unregistered_judge_model(c)) is not None})
    new = [m for m in missing if m not in _names]
    if new:
        _names.update(new)
        LLMRegistry.register(LedgerOnlyLlm)
    return missing
