"""Running a LangGraph graph on one eval case, turn by turn, as ADK invocations.

Per turn the user's text goes in as a ``HumanMessage``: with the graph's checkpointer on a
fresh thread (one per case × repetition × attempt), else with the previous turn's state and
messages carried in. The turn's messages after that ``HumanMessage`` map onto one
``Invocation`` shaped as ADK's ``EvaluationGenerator`` shapes an ADK agent's (events in
``InvocationEvents``): each ``AIMessage`` is a model event (its tool calls as function
calls, its usage and model name), each ``ToolMessage`` a function response, and the last AI
text is the final response. Chat-model calls are counted by a LangChain callback.
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
import time
import uuid
from typing import Any

from google.adk.evaluation.eval_case import EvalCase, Invocation, InvocationEvent, InvocationEvents
from google.genai import types
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from evalsnap import settings
from evalsnap.agents.base import LoadedAgent, clean_state
from evalsnap.deadlines import DeadlineExceeded, exceeded, within_inference_deadline

__all__ = ["GraphCaseRun", "ModelCallCounter", "to_invocation"]


class UnsupportedCase(Exception):
    """A case or a graph behaviour this lane cannot map (the message says which)."""


class ModelCallCounter(BaseCallbackHandler):
    """Counts model calls (``on_chat_model_start``, ``on_llm_start``) and times models and tools."""

    run_inline = True

    def __init__(self) -> None:
        self.calls = 0
        self._lock = threading.Lock()
        self._open: dict[Any, tuple[str, float]] = {}
        self.intervals: dict[str, list[tuple[float, float]]] = {"model": [], "tool": []}

    def _start(self, kind: str, run_id: Any) -> None:
        with self._lock:
            self.calls += kind == "model"
            self._open[run_id] = (kind, time.monotonic())

    def _end(self, run_id: Any) -> None:
        with self._lock:
            kind, started = self._open.pop(run_id, ("", 0.0))
            if kind:
                self.intervals[kind].append((started, time.monotonic()))

    def on_chat_model_start(self, serialized: Any, messages: Any, *, run_id: Any, **kw: Any) -> None:
        self._start("model", run_id)

    def on_llm_start(self, serialized: Any, prompts: Any, *, run_id: Any, **kw: Any) -> None:
        self._start("model", run_id)

    def on_llm_end(self, response: Any, *, run_id: Any, **kw: Any) -> None:
        self._end(run_id)

    def on_llm_error(self, error: BaseException, *, run_id: Any, **kw: Any) -> None:
        self._end(run_id)

    def on_tool_start(self, serialized: Any, input_str: Any, *, run_id: Any, **kw: Any) -> None:
        self._start("tool", run_id)

    def on_tool_end(self, output: Any, *, run_id: Any, **kw: Any) -> None:
        self._end(run_id)

    def on_tool_error(self, error: BaseException, *, run_id: Any, **kw: Any) -> None:
        self._end(run_id)

    def oldest_model_call(self) -> float | None:
        """When the longest-running model call still in flight started (monotonic)."""
        with self._lock:
            return min((t for kind, t in self._open.values() if kind == "model"), default=None)

    def busy(self, kind: str, since: float) -> float:
        """Seconds since ``since`` with at least one call of ``kind`` in flight (tools: not
        counting time a model call overlaps, as ADK splits a turn)."""
        spans = _union([(max(a, since), b) for a, b in self.intervals[kind] if b > since])
        if kind == "tool":
            models = _union([(max(a, since), b) for a, b in self.intervals["model"] if b > since])
            return round(sum(b - a for a, b in spans) - _overlap(spans, models), 3)
        return round(sum(b - a for a, b in spans), 3)


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _overlap(xs: list[tuple[float, float]], ys: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(b, d) - max(a, c)) for a, b in xs for c, d in ys)


# ---- messages → an ADK invocation ------------------------------------------------------------

def _usage(message: AIMessage) -> types.GenerateContentResponseUsageMetadata | None:
    """LangChain's ``usage_metadata`` in genai's terms (thoughts out of the candidates, as genai)."""
    usage = message.usage_metadata
    if not usage:
        return None
    output, reasoning = usage.get("output_tokens"), (usage.get("output_token_details") or {}).get("reasoning")
    return types.GenerateContentResponseUsageMetadata(
        prompt_token_count=usage.get("input_tokens"),
        candidates_token_count=None if output is None else output - (reasoning or 0),
        thoughts_token_count=reasoning, total_token_count=usage.get("total_tokens"),
        cached_content_token_count=(usage.get("input_token_details") or {}).get("cache_read"))


def _model_version(message: AIMessage) -> str | None:
    meta = message.response_metadata or {}
    name = meta.get("model_name") or meta.get("model")
    return str(name) if name else None


def _response(message: ToolMessage) -> dict[str, Any]:
    """A tool's result as ADK records one: a dict as is, anything else as ``{"result": …}``."""
    value: Any = message.content
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            pass
    if message.status == "error":
        return {"error": value}
    return value if isinstance(value, dict) else {"result": value}


def to_invocation(user_content: types.Content, messages: list[BaseMessage], *,
                  authors: dict[str, str], default_author: str, invocation_id: str) -> Invocation:
    """One turn's messages (after the user's) as ADK's ``EvaluationGenerator`` shapes a turn."""
    texts = [i for i, m in enumerate(messages) if isinstance(m, AIMessage) and m.text.strip()]
    final = messages[texts[-1]] if texts else None
    calls: dict[str, str] = {}
    events: list[InvocationEvent] = []
    for m in messages:
        if isinstance(m, AIMessage):
            parts = [types.Part(text=m.text)] if m.text.strip() else []
            for tc in m.tool_calls:
                calls[tc.get("id") or ""] = tc["name"]
                parts.append(types.Part(function_call=types.FunctionCall(
                    id=tc.get("id"), name=tc["name"], args=dict(tc.get("args") or {}))))
            if not parts:
                continue  # as ADK: an event with nothing to grade is not kept
            content = None if m is final and not m.tool_calls else types.Content(role="model", parts=parts)
            events.append(InvocationEvent(author=authors.get(m.id or "", default_author), content=content,
                                          usage_metadata=_usage(m), model_version=_model_version(m)))
        elif isinstance(m, ToolMessage):
            response = types.FunctionResponse(id=m.tool_call_id, name=m.name or calls.get(m.tool_call_id, ""),
                                              response=_response(m))
            events.append(InvocationEvent(author=authors.get(f"tool:{m.tool_call_id}", default_author),
                                          content=types.Content(role="user",
                                                                parts=[types.Part(function_response=response)])))
    return Invocation(
        invocation_id=invocation_id, user_content=user_content,
        final_response=types.Content(role="model", parts=[types.Part(text=final.text)]) if final else None,
        intermediate_data=InvocationEvents(invocation_events=events), creation_timestamp=time.time())


# ---- running the turns -----------------------------------------------------------------------

def _user_text(content: types.Content, eval_id: str, turn: int) -> str:
    parts = content.parts or []
    other = [p for p in parts if not p.text]
    if other:
        raise UnsupportedCase(f"turn {turn + 1} of case {eval_id} has non-text parts; the LangGraph "
                              "lane sends text only (multimodal input is not mapped).")
    return "\n".join(p.text or "" for p in parts)


def _json_values(values: dict[str, Any]) -> dict[str, Any]:
    """The state channels other than ``messages`` whose values are JSON (others are left out)."""
    out = {}
    for key, value in values.items():
        if key == "messages":
            continue
        try:
            out[key] = json.loads(json.dumps(value, allow_nan=False))
        except (TypeError, ValueError):
            continue
    return clean_state(out) or {}


def _seed(graph: Any, case: EvalCase) -> dict[str, Any]:
    state = copy.deepcopy(case.session_input.state) if case.session_input else {}
    channels = set(graph.stream_channels_list)
    unknown = sorted(k for k in state if k == "messages" or k not in channels)
    if unknown:
        raise UnsupportedCase(f"session_input.state of case {case.eval_id} names {unknown}, which the "
                              f"graph cannot be seeded with (its state channels other than messages: "
                              f"{sorted(channels - {'messages'})}).")
    return state


def _has_checkpointer(graph: Any) -> bool:
    from langgraph.checkpoint.base import BaseCheckpointSaver

    return isinstance(graph.checkpointer, BaseCheckpointSaver)


def _messages_of(update: Any) -> list[BaseMessage]:
    """The messages a node's update writes (a dict, or a list of them from ``Command``s)."""
    if isinstance(update, list | tuple):
        return [m for u in update for m in _messages_of(u)]
    found = update.get("messages") if isinstance(update, dict) else None
    found = [found] if isinstance(found, BaseMessage) else found
    return [m for m in found or [] if isinstance(m, BaseMessage)]


async def _turn(graph: Any, graph_input: dict[str, Any],
                config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Runs one turn; (the state values after it, the node that wrote each message)."""
    values: Any = None
    authors: dict[str, str] = {}
    async for mode, chunk in graph.astream(graph_input, config, stream_mode=["updates", "values"]):
        if mode == "values":
            values = chunk
            continue
        for node, update in (chunk or {}).items():
            if node == "__interrupt__":
                raise UnsupportedCase(f"the graph interrupted ({update!r}); interrupts (human in the "
                                      "loop) are not supported by the LangGraph lane.")
            for m in _messages_of(update):
                authors.setdefault(f"tool:{m.tool_call_id}" if isinstance(m, ToolMessage) else m.id or "", node)
    if _has_checkpointer(graph):
        snapshot = await graph.aget_state(config)
        if snapshot.next:
            raise UnsupportedCase(f"the graph stopped before nodes {list(snapshot.next)} (an interrupt); "
                                  "interrupts are not supported by the LangGraph lane.")
        values = snapshot.values
    if not isinstance(values, dict):
        raise UnsupportedCase(f"the graph returned {type(values).__name__}, not a state with `messages`.")
    return values, authors


def _after(messages: list[BaseMessage], human_id: str) -> list[BaseMessage]:
    for i, m in enumerate(messages):
        if m.id == human_id:
            return list(messages[i + 1:])
    raise UnsupportedCase("the user's message is not in the graph's `messages` after the turn (a graph "
                          "that drops it cannot be mapped turn by turn).")


async def _run_turns(agent: LoadedAgent, case: EvalCase, seed: dict[str, Any],
                     counter: ModelCallCounter) -> tuple[list[Invocation], dict[str, Any]]:
    if case.conversation is None:
        raise UnsupportedCase(f"case {case.eval_id} is a conversation_scenario; the LangGraph lane runs "
                              "written-out conversations only.")
    graph, checkpointed = agent.graph, _has_checkpointer(agent.graph)
    config: dict[str, Any] = {"callbacks": [counter]}
    if checkpointed:
        config["configurable"] = {"thread_id": f"evalsnap-{case.eval_id}-{uuid.uuid4().hex}"}
    values: dict[str, Any] = dict(seed)
    invocations = []
    for i, turn in enumerate(case.conversation):
        human_id = f"evalsnap-user-{uuid.uuid4().hex}"
        human = HumanMessage(content=_user_text(turn.user_content, case.eval_id, i), id=human_id)
        if checkpointed:
            graph_input = {**(seed if i == 0 else {}), "messages": [human]}
        else:
            graph_input = {**values, "messages": [*values.get("messages", []), human]}
        started = time.monotonic()
        values, authors = await _turn(graph, graph_input, config)
        invocation = to_invocation(copy.deepcopy(turn.user_content), _after(values.get("messages") or [], human_id),
                                   authors=authors, default_author=agent.root_agent.name,
                                   invocation_id=f"lg-{uuid.uuid4().hex[:12]}")
        invocations.append(invocation.model_copy(update={
            "duration": round(time.monotonic() - started, 3),
            "model_duration": counter.busy("model", started), "tool_duration": counter.busy("tool", started)}))
    return invocations, _json_values(values)


class _CallWatch:
    """Each model call's deadline (``EVALSNAP_AGENT_CALL_TIMEOUT``), watched from the loop
    through the callback counter: a sync node's thread is left to finish, its inference fails."""

    def __init__(self, counter: ModelCallCounter, eval_id: str) -> None:
        self.counter, self.eval_id = counter, eval_id
        self.expired: DeadlineExceeded | None = None
        self._watcher: asyncio.Task[None] | None = None

    def arm(self, task: asyncio.Task[Any]) -> None:
        self._watcher = asyncio.ensure_future(self._watch(task))

    async def _watch(self, task: asyncio.Task[Any]) -> None:
        limit = settings.get().agent_call_timeout
        while not task.done():
            await asyncio.sleep(min(1.0, limit / 4))
            started = self.counter.oldest_model_call()
            if started is not None and time.monotonic() - started > limit and not self.expired:
                self.expired = exceeded(f"agent model call of case {self.eval_id!r}", limit,
                                        "EVALSNAP_AGENT_CALL_TIMEOUT")
                task.cancel()

    def disarm(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()


class GraphCaseRun:
    """The graph over one case (:class:`~evalsnap.agents.base.CaseRun`): a failure's tokens
    come from the turns' messages, so ``model_usage`` stays None; the ADK lane's options
    (``user_simulator_config``, ``session_service``) do not apply."""

    model_usage = None

    def __init__(self, agent: LoadedAgent, case: EvalCase, **_options: Any) -> None:
        self.agent, self.case = agent, case
        self.counter = ModelCallCounter()
        self.initial_state: dict[str, Any] | None = None
        self._final: dict[str, Any] | None = None

    @property
    def model_calls(self) -> int:
        return self.counter.calls

    async def run(self) -> list[Invocation]:
        seed = _seed(self.agent.graph, self.case)
        self.initial_state = _json_values(seed)
        invocations, self._final = await within_inference_deadline(
            _run_turns(self.agent, self.case, seed, self.counter), _CallWatch(self.counter, self.case.eval_id),
            f"the inference of case {self.case.eval_id!r}")
        return invocations

    async def final_state(self) -> dict[str, Any] | None:
        return self._final
