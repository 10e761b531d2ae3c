"""Issue 20: the LangGraph lane, through the real CLI, LangGraph, ADK's evaluators and Prefect.

The offline example (examples/langgraph_agent) runs on a real compiled graph with a scripted
LangChain chat model and real tools. Its scores are checked against ADK's own
``LocalEvalService`` on ``InferenceResult``s that this file builds from the graph's messages
by its own mapping (``IntermediateData``, as the issue states it), not the lane's code.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from google.adk.evaluation.eval_case import (
    EvalCase,
    IntermediateData,
    Invocation,
    get_all_tool_calls,
    get_all_tool_responses,
)
from google.adk.evaluation.eval_config import EvalConfig, get_eval_metrics_from_config
from google.adk.evaluation.eval_set import EvalSet
from google.adk.evaluation.metric_evaluator_registry import (
    DEFAULT_METRIC_EVALUATOR_REGISTRY,
    register_custom_metrics_from_config,
)
from google.genai import types

from evalsnap.errors import AgentLoadError, UsageError
from tests._adk_parity import local_eval_service, scores
from tests._cli import run_inproc
from tests.conftest import ROOT, copy_agent

EXAMPLE = ROOT / "examples" / "langgraph_agent"
MEMO = ROOT / "tests" / "fixtures" / "langgraph_projects" / "memo_graph"
EVALSET = "trip.evalset.json"
METRICS = ("tool_trajectory_avg_score", "response_match_score", "final_state_match",
           "answer_uses_tool_results")
DESIGNED_FAILURES = {("trip_wrong_trajectory", "tool_trajectory_avg_score"),
                     ("trip_state_mismatch", "final_state_match")}


def _copy(src: Path, base: Path) -> Path:
    return copy_agent(src, base / "agents" / src.name)


def _scores(result: dict[str, Any]) -> dict[tuple[str, str], tuple[Any, str]]:
    return {(c["eval_id"], m): (v["score"], v["status"]) for c in result["cases"]
            for m, v in c["metrics"].items()}


@pytest.fixture(scope="module")
def lane(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A cold run and a --reuse run of a copy of the example, and the cold record shown."""
    base = tmp_path_factory.mktemp("lane")
    agent = _copy(EXAMPLE, base)
    store = str(base / "store")
    evalset = str(agent / EVALSET)
    cold = run_inproc("run", str(agent), evalset, "--store", store, "--json")
    assert cold.code == 1, cold.stderr[-3000:]  # the designed failures
    warm = run_inproc("run", str(agent), evalset, "--store", store, "--json", "--reuse")
    shown = run_inproc("show", cold.json["record_id"], "--store", store, "--json")
    return {"agent": agent, "store": store, "cold": cold.json, "warm": warm, "shown": shown.json}


# ---- the independent mapping: the graph's messages → ADK invocations -----------------------

def _import_example(agent: Path) -> Any:
    if str(agent.parent) not in sys.path:
        sys.path.insert(0, str(agent.parent))
    import langgraph_agent

    assert Path(langgraph_agent.__file__).parent == agent, "another copy of the example was imported"
    return langgraph_agent


def _independent(agent: Path, eval_set: EvalSet) -> tuple[dict[str, list[Invocation]], dict[str, dict], int]:
    """Runs the graph on every case turn by turn with history carried as messages: the
    invocations the issue's mapping gives, the final states and the model's call count."""
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    package = _import_example(agent)
    from langgraph_agent import chat_model

    chat_model.reset_counters()
    invocations: dict[str, list[Invocation]] = {}
    finals: dict[str, dict] = {}
    for case in eval_set.eval_cases:
        state: dict[str, Any] = dict(case.session_input.state) if case.session_input else {}
        history: list[Any] = []
        for turn in case.conversation or []:
            text = "".join(p.text or "" for p in turn.user_content.parts or [])
            out = package.graph.invoke({**state, "messages": [*history, HumanMessage(text)]})
            new = out["messages"][len(history) + 1:]
            history, state = out["messages"], {k: v for k, v in out.items() if k != "messages"}
            answers = [m for m in new if isinstance(m, AIMessage) and m.text]
            invocations.setdefault(case.eval_id, []).append(Invocation(
                user_content=turn.user_content,
                final_response=types.Content(role="model", parts=[types.Part(text=answers[-1].text)]),
                intermediate_data=IntermediateData(
                    tool_uses=[types.FunctionCall(id=c["id"], name=c["name"], args=c["args"])
                               for m in new if isinstance(m, AIMessage) for c in m.tool_calls],
                    tool_responses=[types.FunctionResponse(id=m.tool_call_id, name=m.name,
                                                           response=json.loads(m.text))
                                    for m in new if isinstance(m, ToolMessage)])))
        finals[case.eval_id] = state
    return invocations, finals, chat_model.counters()["model_calls"]


@pytest.fixture(scope="module")
def independent(lane: dict[str, Any]) -> dict[str, Any]:
    eval_set = EvalSet.model_validate_json((lane["agent"] / EVALSET).read_text("utf-8"))
    invocations, finals, calls = _independent(lane["agent"], eval_set)
    return {"eval_set": eval_set, "invocations": invocations, "finals": finals, "calls": calls}


def test_every_unit_equals_adk_local_eval_service_on_the_independent_mapping(lane, independent) -> None:
    raw = json.loads((lane["agent"] / "test_config.json").read_text("utf-8"))
    for entry in raw["customMetrics"].values():
        entry.pop("version", None)
    config = EvalConfig.model_validate(raw)
    registry = register_custom_metrics_from_config(config, DEFAULT_METRIC_EVALUATOR_REGISTRY.fork())
    # final_state_match is evalsnap's: ADK 2.13's LocalEvalService cannot pass it state.
    metrics = [m for m in get_eval_metrics_from_config(config)
               if m.metric_name in config.criteria and m.metric_name != "final_state_match"]
    shown_like = [{"eval_id": eval_id, "inference": {"status": "success", "invocations": [
        i.model_dump(mode="json") for i in invs]}} for eval_id, invs in independent["invocations"].items()]
    adk = scores(local_eval_service("langgraph_agent", independent["eval_set"], shown_like, metrics, registry))
    cases = {c.eval_id: c for c in independent["eval_set"].eval_cases}
    for eval_id, final in independent["finals"].items():  # final_state_match by its definition
        passed = final == cases[eval_id].final_session_state
        adk[(eval_id, "final_state_match")] = (1.0 if passed else 0.0, "PASSED" if passed else "FAILED")
    ours = {(c["eval_id"], n): (m["score"], m["metric_status"])
            for c in lane["shown"]["cases"] for n, m in c["metrics"].items()}
    assert len(adk) == len(cases) * len(METRICS)
    assert ours == adk
    assert {k for k, (_, status) in ours.items() if status != "PASSED"} == DESIGNED_FAILURES


def test_the_lane_records_what_the_mapping_gives(lane, independent) -> None:
    """Same tool calls (id, name, args), tool responses and final texts, turn by turn; the
    lane's invocations are ADK's own event shape (what ADK's token and call metrics read)."""
    for case in lane["shown"]["cases"]:
        recorded = [Invocation.model_validate(i) for i in case["inference"]["invocations"]]
        mapped = independent["invocations"][case["eval_id"]]
        assert len(recorded) == len(mapped)
        for got, want in zip(recorded, mapped, strict=True):
            assert type(got.intermediate_data).__name__ == "InvocationEvents"
            assert got.user_content == want.user_content and got.final_response == want.final_response
            assert get_all_tool_calls(got.intermediate_data) == get_all_tool_calls(want.intermediate_data)
            assert get_all_tool_responses(got.intermediate_data) == get_all_tool_responses(want.intermediate_data)


def test_multi_turn_multi_tool_turns_and_state(lane) -> None:
    cases = {c["eval_id"]: c for c in lane["shown"]["cases"]}

    def model_events(eval_id: str, turn: int) -> list[list[str]]:
        events = cases[eval_id]["inference"]["invocations"][turn]["intermediate_data"]["invocation_events"]
        return [[p["function_call"]["name"] for p in (e.get("content") or {}).get("parts") or []
                 if p.get("function_call")] for e in events if e.get("model_version")]

    assert len(cases["book_then_show"]["inference"]["invocations"]) == 2
    # three parallel calls in one AIMessage, then the answer
    assert model_events("weather_three_cities", 0) == [["get_weather"] * 3, []]
    # two sequential tool steps in one turn, then the answer
    assert model_events("returning_traveller", 1) == [["add_to_trip"], ["get_trip"], []]
    seeded = cases["returning_traveller"]
    assert seeded["initial_session_state"] == {"traveller": "Ada", "trip": [{"city": "Paris", "nights": 2}]}
    assert seeded["final_session_state"] == {"traveller": "Ada", "trip": [
        {"city": "Paris", "nights": 2}, {"city": "Rome", "nights": 3}]}
    assert cases["weather_rome"]["initial_session_state"] == {} == cases["weather_rome"]["final_session_state"]
    assert seeded["metrics"]["final_state_match"]["status"] == "PASSED"
    assert seeded["metrics"]["answer_uses_tool_results"]["status"] == "PASSED"


def test_agent_calls_are_the_chat_model_calls_and_tokens_are_recorded(lane, independent) -> None:
    cold = lane["cold"]
    events = [e for c in lane["shown"]["cases"] for i in c["inference"]["invocations"]
              for e in i["intermediate_data"]["invocation_events"] if e.get("model_version")]
    assert cold["agent_calls"] == independent["calls"] == len(events) > len(lane["shown"]["cases"])
    assert cold["model_tokens"]["scripted-trip-model-v1"]["total_tokens"] == sum(
        e["usage_metadata"]["total_token_count"] for e in events) > 0


def test_reuse_rerun_spends_no_agent_call(lane) -> None:
    warm = lane["warm"]
    assert warm.code == 1, warm.stderr[-3000:]
    assert (warm.json["agent_calls"], warm.json["judge_calls"]) == (0, 0)
    assert warm.json["reused_units"] == lane["cold"]["scored_units"] == 10 * len(METRICS)
    assert _scores(warm.json) == _scores(lane["cold"])


def test_a_tool_edit_reruns_inference_and_a_reference_edit_does_not(lane, tmp_path: Path) -> None:
    # the lane's cold run (and its --reuse run), on private copies of its agent and store
    agent = _copy(lane["agent"], tmp_path)
    store, evalset = str(tmp_path / "store"), agent / EVALSET
    shutil.copytree(lane["store"], store)
    cold = lane["cold"]
    data = json.loads(evalset.read_text("utf-8"))
    data["eval_cases"][0]["conversation"][0]["final_response"]["parts"][0]["text"] = "Rome is sunny."
    evalset.write_text(json.dumps(data), "utf-8")
    reference = run_inproc("run", str(agent), str(evalset), "--store", store, "--json", "--reuse").json
    assert reference["agent_calls"] == 0
    # the edited case's scores are stale (its case key holds the reference), no other's
    assert {c["eval_id"] for c in reference["cases"] for m in c["metrics"].values()
            if not m["reused"]} == {"weather_rome"}
    tools = agent / "tools.py"
    tools.write_text(tools.read_text("utf-8").replace(
        "Returns the current weather for a city.", "Returns today's weather for a city."), "utf-8")
    edited = run_inproc("run", str(agent), str(evalset), "--store", store, "--json", "--reuse").json
    assert edited["agent_calls"] == cold["agent_calls"]  # every case ran again
    # the agent answers as before, so the case keys and the scores are the same ones
    assert _scores(edited) == _scores(reference)


def test_graph_structure_is_in_the_identity(tmp_path: Path) -> None:
    """A tool schema or node change that no package file shows (say, a tool from an installed
    library) still changes the identity."""
    from evalsnap.agents.lanes import load_agent
    from evalsnap.langgraph.identity import graph_identity, graph_structure

    agent = load_agent(_copy(EXAMPLE, tmp_path))
    structure = graph_structure(agent.graph)
    assert [n["id"] for n in structure["nodes"]] == ["__start__", "agent", "tools", "__end__"]
    assert {t["name"] for t in structure["tools"]} == {"get_weather", "convert_currency", "add_to_trip", "get_trip"}
    assert structure["models"][0]["params"] == {"model_name": "scripted-trip-model-v1"}
    assert graph_identity(agent.path, agent.graph, None) == agent.identity
    tool = agent.graph.nodes["tools"].bound.tools_by_name["get_weather"]
    description, tool.description = tool.description, "Returns the weather."
    try:
        assert graph_identity(agent.path, agent.graph, None) != agent.identity
    finally:
        tool.description = description


def test_langgraph_json_project_with_a_checkpointer(tmp_path: Path) -> None:
    """A LangGraph CLI project (langgraph.json naming a factory, no package): turns go
    through the graph's checkpointer (turn 2 remembers turn 1 only through the thread);
    non-JSON state values are left out of the final state."""
    project = _copy(MEMO, tmp_path)
    result = run_inproc("run", str(project), str(project / "memo.evalset.json"), "--store",
                     str(tmp_path / "store"), "--json")
    assert result.code == 0, result.stderr[-3000:]
    assert result.json["agent_calls"] == 2
    shown = run_inproc("show", result.json["record_id"], "--store", str(tmp_path / "store"), "--json").json
    case = shown["cases"][0]
    assert case["final_session_state"] == {"notes": ["seeded", "turn 1: you said apples",
                                                     "turn 2: you said apples | pears"]}
    assert [e["author"] for i in case["inference"]["invocations"]
            for e in i["intermediate_data"]["invocation_events"]] == ["respond", "respond"]  # the nodes


def test_framework_choice_and_its_errors(tmp_path: Path) -> None:
    from evalsnap.agents.lanes import load_agent

    agent = _copy(EXAMPLE, tmp_path)
    assert load_agent(agent).framework == "langgraph"
    assert load_agent(agent, framework="langgraph").framework == "langgraph"
    with pytest.raises(AgentLoadError, match="root_agent"):
        load_agent(agent, framework="adk")
    with pytest.raises(AgentLoadError, match="exposes no `graph`"):
        load_agent(ROOT / "examples" / "shop_agent", framework="langgraph")
    with pytest.raises(UsageError, match="adk, langgraph"):
        load_agent(agent, framework="crewai")
    assert load_agent(ROOT / "examples" / "shop_agent").framework == "adk"


def test_unmappable_cases_fail_the_inference_clearly(tmp_path: Path) -> None:
    from evalsnap.agents.lanes import load_agent, run_inference

    agent = load_agent(_copy(EXAMPLE, tmp_path))

    def run(**case: Any) -> Any:
        eval_case = EvalCase.model_validate({"eval_id": "c", **case})
        return asyncio.run(run_inference(agent, eval_case, eval_set_id="t"))

    def turn(*parts: dict[str, Any]) -> dict[str, Any]:
        return {"user_content": {"role": "user", "parts": list(parts)}}

    failed = run(conversation=[turn({"text": "Hello"}), turn({"text": "weather in Rome FAIL_MODEL"})])
    assert (failed.status, failed.model_calls) == ("failure", 2)
    assert "ScriptedModelError" in failed.error
    image = run(conversation=[turn({"inline_data": {"mime_type": "image/png", "data": "AAAA"}})])
    assert image.status == "failure" and "multimodal input is not mapped" in image.error
    unknown = run(conversation=[turn({"text": "Hello"})], session_input={
        "app_name": "a", "user_id": "u", "state": {"budget": 3}})
    assert unknown.status == "failure" and "['budget']" in unknown.error


@pytest.mark.parametrize(("setting", "seconds"), [("EVALSNAP_AGENT_CALL_TIMEOUT", "0.2"),
                                                  ("EVALSNAP_INFERENCE_TIMEOUT", "0.3")])
def test_a_model_call_past_its_deadline_fails_the_inference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            setting: str, seconds: str) -> None:
    from evalsnap import settings
    from evalsnap.agents.lanes import load_agent, run_inference

    agent = load_agent(_copy(EXAMPLE, tmp_path))
    monkeypatch.setenv("EVALSNAP_DEMO_AGENT_LATENCY_MS", "1500")
    monkeypatch.setenv(setting, seconds)
    settings.reload()
    try:
        case = EvalCase.model_validate({"eval_id": "slow", "conversation": [
            {"user_content": {"role": "user", "parts": [{"text": "Hello"}]}}]})

        async def timed() -> tuple[Any, float]:
            started = time.monotonic()
            record = await run_inference(agent, case, eval_set_id="t")
            return record, time.monotonic() - started

        # (asyncio.run then waits for the sleeping model's thread: LangGraph runs a sync node
        # in the loop's default executor, and a thread cannot be stopped from outside)
        record, elapsed = asyncio.run(timed())
    finally:
        monkeypatch.undo()
        settings.reload()
    assert elapsed < 1.4
    assert record.status == "failure" and "DeadlineExceeded" in record.error and setting in record.error


_NO_EXTRA = """
import sys
sys.modules["langgraph"] = None  # as on an install without the extra
sys.modules["langchain_core"] = None
from evalsnap.agents.lanes import load_agent
print("adk", load_agent(sys.argv[2]).framework)
try:
    load_agent(sys.argv[1])
except Exception as exc:
    print(type(exc).__name__, exc.exit_code, exc)
sys.argv = ["evalsnap", "run", sys.argv[1], sys.argv[1] + "/trip.evalset.json", "--store", sys.argv[3]]
from evalsnap.cli import main
main()
"""


@pytest.mark.parametrize("project", ["example", "langgraph.json"])
def test_without_the_extra_a_langgraph_agent_is_a_typed_error(tmp_path: Path, project: str) -> None:
    agent = _copy(EXAMPLE if project == "example" else MEMO, tmp_path)
    (agent / EVALSET).write_text((EXAMPLE / EVALSET).read_text("utf-8"), "utf-8")
    proc = subprocess.run([sys.executable, "-c", _NO_EXTRA, str(agent), str(ROOT / "examples" / "shop_agent"),
                           str(tmp_path / "store")], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "adk adk" in proc.stdout  # an ADK agent loads without LangGraph
    assert f"AgentLoadError 2 {agent} needs LangGraph, which is not installed" in proc.stdout
    assert "install the LangGraph extra: pip install 'evalsnap[langgraph]'" in proc.stdout
    assert "needs LangGraph" in proc.stderr and "pip install 'evalsnap" in proc.stderr
