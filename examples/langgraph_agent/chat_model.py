"""An offline stand-in for the graph's chat model: a real LangChain ``BaseChatModel``.

:class:`ScriptedChatModel` answers deterministically from the conversation by the table in
:mod:`langgraph_agent._script`: tool calls (``AIMessage.tool_calls``, several in one message
when the user asks for several things at once), then the answer from the tool results, with
``usage_metadata`` (word counts stand in for tokens) and ``response_metadata["model_name"]``.
It works on any LangChain message list, so LangGraph, its ``ToolNode`` and LangChain's
callbacks run for real without the internet.

A user text containing ``FAIL_MODEL`` makes the model raise :class:`ScriptedModelError`.
``EVALSNAP_DEMO_AGENT_LATENCY_MS`` (else ``EVALSNAP_DEMO_LATENCY_MS``; read on every call, as
the ADK demo's models do) simulates a model's latency.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.utils.function_calling import convert_to_openai_tool

from ._script import answer, plan_turn

__all__ = ["MODEL_NAME", "ScriptedChatModel", "ScriptedModelError", "counters", "reset_counters"]

MODEL_NAME = "scripted-trip-model-v1"
FAIL_KEYWORD = "FAIL_MODEL"
_TRAVELLER = re.compile(r"traveller's name is ([^.]+)\.")

_lock = threading.Lock()
_counts: Counter[str] = Counter()


def counters() -> Counter[str]:
    """A copy of the call counters (``model_calls``) since the last :func:`reset_counters`."""
    with _lock:
        return Counter(_counts)


def reset_counters() -> None:
    with _lock:
        _counts.clear()


def _latency() -> float:
    raw = os.environ.get("EVALSNAP_DEMO_AGENT_LATENCY_MS", "").strip() or \
        os.environ.get("EVALSNAP_DEMO_LATENCY_MS", "").strip()
    return max(0.0, float(raw)) / 1000 if raw else 0.0


class ScriptedModelError(Exception):
    """A simulated permanent model failure (``FAIL_MODEL`` in the user text)."""


def _words(messages: Sequence[BaseMessage]) -> int:
    return sum(len(m.text.split()) for m in messages)


def _turn(messages: Sequence[BaseMessage]) -> tuple[str, str, int, int, list[tuple[str, dict[str, Any]]]]:
    """(user text, traveller name, human turns so far, tool-call steps done, tool results)."""
    humans = [i for i, m in enumerate(messages) if isinstance(m, HumanMessage)]
    start = humans[-1] if humans else -1
    after = messages[start + 1:]
    names = {tc["id"]: tc["name"] for m in after if isinstance(m, AIMessage) for tc in m.tool_calls}
    results = [(m.name or names.get(m.tool_call_id, ""), json.loads(m.text)) for m in after
               if isinstance(m, ToolMessage)]
    system = " ".join(m.text for m in messages if isinstance(m, SystemMessage))
    traveller = _TRAVELLER.search(system)
    steps = sum(1 for m in after if isinstance(m, AIMessage) and m.tool_calls)
    return (messages[start].text if humans else "", traveller.group(1) if traveller else "",
            len(humans), steps, results)


class ScriptedChatModel(BaseChatModel):
    """Deterministic chat model: the keyword table of :mod:`langgraph_agent._script`."""

    model_name: str = MODEL_NAME

    @property
    def _llm_type(self) -> str:
        return "scripted-trip"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_name": self.model_name}

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    def _reply(self, messages: list[BaseMessage], tools: list[dict[str, Any]] | None) -> AIMessage:
        with _lock:
            _counts["model_calls"] += 1
        user_text, traveller, n_human, steps_done, results = _turn(messages)
        if FAIL_KEYWORD in user_text:
            raise ScriptedModelError(f"scripted failure: the user text contains {FAIL_KEYWORD}")
        plan = plan_turn(user_text)
        if isinstance(plan, list) and steps_done < len(plan):
            bound = {t["function"]["name"] for t in tools or []}
            calls = [{"name": name, "args": args, "id": f"call_{n_human}_{steps_done}_{i}",
                      "type": "tool_call"} for i, (name, args) in enumerate(plan[steps_done])]
            missing = sorted({c["name"] for c in calls} - bound)
            if missing:
                raise ScriptedModelError(f"the script calls {missing}, which are not bound tools")
            text, message = "", AIMessage(content="", tool_calls=calls)
        else:
            text = answer(results) if isinstance(plan, list) else plan.format(
                name=f" {traveller}" if traveller else "")
            message = AIMessage(content=text)
        out = len((text or json.dumps(message.tool_calls)).split())
        message.usage_metadata = {"input_tokens": _words(messages), "output_tokens": out,
                                  "total_tokens": _words(messages) + out}
        message.response_metadata = {"model_name": self.model_name}
        return message

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        time.sleep(_latency())
        return ChatResult(generations=[ChatGeneration(message=self._reply(messages, kwargs.get("tools")))])

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None,
                         **kwargs: Any) -> ChatResult:
        await asyncio.sleep(_latency())
        reply = self._reply(messages, kwargs.get("tools"))
        return ChatResult(generations=[ChatGeneration(message=reply)])
