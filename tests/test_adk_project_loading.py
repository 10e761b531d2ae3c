"""A user's own ADK project as ``adk eval`` / ``AgentEvaluator`` load it, through the real CLI.

The fixtures under ``tests/fixtures/adk_projects/`` are agent packages in the shapes ADK
accepts, each with its own offline scripted model: ``get_agent_async`` only (with a
sub-agent for ``--agent-name``), a package configured by its ``.env`` (a fake secret that
must never be written anywhere), and ADK's old list formats (``.test.json`` with
``initial.session.json`` and ``test_config.json`` beside it; an old list-format eval set).
Every test copies its fixture to a temporary directory first.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._cli import ok, run_inproc, score_status
from tests.conftest import ROOT, CliResult, copy_agent, set_env_value

FIXTURES = Path(__file__).parent / "fixtures" / "adk_projects"


def _copy(name: str, base: Path) -> Path:
    return copy_agent(FIXTURES / name, base / "agents" / name)


def _run(agent: Path, evalset: Path, store: Path, *extra: str,
         env: dict[str, str] | None = None) -> CliResult:
    return run_inproc("run", str(agent), str(evalset), "--store", str(store), "--json", *extra,
                   env=env)


# ---- get_agent_async, and --agent-name -------------------------------------------------------

@pytest.fixture(scope="module")
def factory(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("factory")
    agent = _copy("factory_agent", base)
    evalset, store = agent / "factory.evalset.json", base / "store"
    runs = {
        "root": _run(agent, evalset, store),
        "greeter": _run(agent, evalset, store, "--agent-name", "greeter", "--reuse"),
        "greeter_again": _run(agent, evalset, store, "--agent-name", "greeter", "--reuse"),
        "root_by_name": _run(agent, evalset, store, "--agent-name", "router", "--reuse"),
        "missing": _run(agent, evalset, store, "--agent-name", "nobody"),
    }
    return {"agent": agent, "store": store, **runs}


def test_a_package_with_only_get_agent_async_runs(factory: dict[str, Any]) -> None:
    # inference tasks import the agent inside their running event loop: the factory is
    # awaited on a loop of its own
    out = ok(factory["root"])
    assert out["passed"] and out["complete"]
    assert [c["eval_id"] for c in out["cases"]] == ["hello", "two_turns"]
    assert score_status(out) == {("hello", "response_match_score"): (1.0, "PASSED"),
                            ("two_turns", "response_match_score"): (1.0, "PASSED")}
    assert out["agent_calls"] == 3  # one model call per turn


def test_agent_name_evaluates_the_sub_agent_and_is_part_of_the_identity(
        factory: dict[str, Any]) -> None:
    greeter = ok(factory["greeter"], code=1)  # the greeter answers, not the router
    assert greeter["agent_calls"] == 3, "another agent: no inference of the root is reused"
    for (_, metric), (score, status) in score_status(greeter).items():
        assert metric == "response_match_score" and score is not None and score < 1.0
        assert status == "FAILED"
    again = ok(factory["greeter_again"], code=1)
    assert again["agent_calls"] == 0 and score_status(again) == score_status(greeter)
    by_name = ok(factory["root_by_name"])  # naming the root is evaluating the root
    assert by_name["agent_calls"] == 0
    assert score_status(by_name) == score_status(factory["root"].json)


def test_an_unknown_agent_name_lists_the_agents_of_the_tree(factory: dict[str, Any]) -> None:
    missing = factory["missing"]
    assert missing.code == 2, missing.stderr[-2000:]
    assert missing.stdout.strip() == ""
    assert "no agent named 'nobody'" in missing.stderr
    assert "router, greeter" in missing.stderr


LOOP_PROBE = """
import asyncio, json, sys
from evalsnap.agents.lanes import load_agent

factory_dir, app_dir = sys.argv[1], sys.argv[2]

async def inside_a_running_loop():
    asyncio.get_running_loop()
    return load_agent(factory_dir), load_agent(factory_dir, agent_name="greeter")

root, greeter = asyncio.run(inside_a_running_loop())
outside = load_agent(factory_dir)
app_root, app_helper = load_agent(app_dir), load_agent(app_dir, agent_name="helper")
print(json.dumps({
    "root": root.root_agent.name, "greeter": greeter.root_agent.name,
    "greeter_parent": greeter.root_agent.parent_agent.name, "greeter_app": greeter.app,
    "same_identity": root.identity == outside.identity,
    "greeter_identity_differs": greeter.identity != root.identity,
    "app_root": app_root.app.root_agent.name, "app_helper": app_helper.app.root_agent.name,
    "helper_is_root_agent": app_helper.app.root_agent is app_helper.root_agent,
    "helper_plugins": [p.name for p in app_helper.app.plugins],
    "app_name": app_helper.app.name,
}))
"""

APP_AGENT = """
from google.adk.agents import Agent
from google.adk.apps.app import App
from google.adk.plugins.base_plugin import BasePlugin

helper = Agent(name="helper", model="app-agent-unused-model", instruction="Help.")
root = Agent(name="boss", model="app-agent-unused-model", instruction="Lead.",
             sub_agents=[helper])
app = App(name="app_agent", root_agent=root, plugins=[BasePlugin(name="audit")])
"""


def test_load_agent_inside_a_running_loop_and_sub_agents_of_an_app(tmp_path: Path) -> None:
    factory_dir = _copy("factory_agent", tmp_path)
    app_dir = tmp_path / "agents" / "app_agent"
    app_dir.mkdir()
    (app_dir / "__init__.py").write_text("from . import agent\n")
    (app_dir / "agent.py").write_text(textwrap.dedent(APP_AGENT))
    proc = subprocess.run([sys.executable, "-c", LOOP_PROBE, str(factory_dir), str(app_dir)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {
        "root": "router", "greeter": "greeter", "greeter_parent": "router",
        "greeter_app": None, "same_identity": True, "greeter_identity_differs": True,
        # an App's sub-agent: the runner ADK builds, its plugins and name kept
        "app_root": "boss", "app_helper": "helper", "helper_is_root_agent": True,
        "helper_plugins": ["audit"], "app_name": "app_agent",
    }


# ---- the agent's .env ------------------------------------------------------------------------

def _env_values(env_file: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in env_file.read_text().splitlines()
             if line.strip() and not line.startswith("#"))
    return {k.strip(): v.strip() for k, v in pairs}


def _files_holding(root: Path, needle: bytes) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


@pytest.fixture(scope="module")
def dotenv(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("dotenv")
    agent = _copy("dotenv_agent", base)
    env_file, evalset, store = agent / ".env", agent / "dotenv.evalset.json", base / "store"
    secrets = [_env_values(env_file)["DOTENV_AGENT_API_KEY"]]
    # The variables must come from .env alone, not from the test's environment.
    assert not [k for k in os.environ if k.startswith("DOTENV_AGENT_")]
    cold = _run(agent, evalset, store)
    secrets.append("sk-evalsnap-fixture-rotated-3Jw8Pq5Tz0Xv")
    set_env_value(env_file, "DOTENV_AGENT_API_KEY", secrets[-1])
    rotated = _run(agent, evalset, store, "--reuse")
    set_env_value(env_file, "DOTENV_AGENT_GREETING", "Hi")
    regreeted = _run(agent, evalset, store, "--reuse")
    return {"agent": agent, "store": store, "secrets": secrets, "cold": cold,
            "rotated": rotated, "regreeted": regreeted}


def test_env_is_loaded_before_the_agent_is_imported(dotenv: dict[str, Any]) -> None:
    out = ok(dotenv["cold"])  # agent.py reads the greeting at import, the model the key
    assert out["passed"] and out["agent_calls"] == 1
    assert score_status(out) == {("greet_partner", "response_match_score"): (1.0, "PASSED")}


def test_no_env_value_reaches_the_store_the_output_or_adk_history(
        dotenv: dict[str, Any]) -> None:
    store, adk = dotenv["store"], dotenv["agent"] / ".adk"
    assert list((store / "v1" / "objects").rglob("*")), "nothing stored: nothing checked"
    assert list(adk.rglob("*.evalset_result.json")), "no ADK history: nothing checked"
    places = [store, adk]
    prefect_home = os.environ.get("PREFECT_HOME")  # the tests' prefect server: its logs
    if prefect_home:
        places.append(Path(prefect_home))
    for secret in dotenv["secrets"]:
        for place in places:
            assert _files_holding(place, secret.encode()) == [], (secret, place)
        for name in ("cold", "rotated", "regreeted"):
            result = dotenv[name]
            assert secret not in result.stdout and secret not in result.stderr, name


def test_rotating_a_key_in_env_reuses_the_inference(dotenv: dict[str, Any]) -> None:
    rotated = ok(dotenv["rotated"])
    assert rotated["agent_calls"] == 0
    assert [c["inference_reused"] for c in rotated["cases"]] == [True]
    assert score_status(rotated) == score_status(dotenv["cold"].json)


def test_an_env_value_that_shapes_the_agent_runs_it_again(dotenv: dict[str, Any]) -> None:
    # the greeting is in the instruction, so in the agent tree the identity hashes
    regreeted = ok(dotenv["regreeted"], code=1)
    assert regreeted["agent_calls"] == 1
    ((_, (score, status)),) = score_status(regreeted).items()
    assert score is not None and score < 1.0 and status == "FAILED"


# ---- ADK's old list formats ------------------------------------------------------------------

@pytest.fixture(scope="module")
def legacy(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("legacy")
    agent = _copy("legacy_agent", base)
    test_file, store = agent / "weather.test.json", base / "store"
    cold = _run(agent, test_file, store)
    warm = _run(agent, test_file, store, "--reuse")
    shown = run_inproc("show", cold.json["record_id"], "--store", str(store), "--json")
    old_list = _run(agent, agent / "legacy_list.evalset.json", store)
    return {"agent": agent, "test_file": test_file, "cold": cold, "warm": warm,
            "shown": shown, "old_list": old_list}


def test_an_old_test_file_runs_as_one_multi_turn_case(legacy: dict[str, Any]) -> None:
    out = ok(legacy["cold"])
    assert out["eval_set_id"] == "weather"
    assert [c["eval_id"] for c in out["cases"]] == ["weather"]
    scores = score_status(out)
    assert scores[("weather", "tool_trajectory_avg_score")] == (1.0, "PASSED")
    response, status = scores[("weather", "response_match_score")]
    assert response is not None and 0.8 < response < 1.0 and status == "PASSED"
    assert out["agent_calls"] == 5  # three answers and two tool calls
    (case,) = ok(legacy["shown"])["cases"]
    assert case["initial_session_state"] == {"units": "celsius"}  # initial.session.json
    turns = case["reference"]["conversation"]
    assert [t["invocation_id"] for t in turns] == ["weather-0", "weather-1", "weather-2"]
    assert [[u["args"] for u in t["intermediate_data"]["tool_uses"]] for t in turns] == [
        [{"city": "Paris"}], [], [{"city": "Rome"}]]


def test_old_format_ids_are_stable_so_a_second_run_reuses_everything(
        legacy: dict[str, Any]) -> None:
    cold, warm = legacy["cold"].json, ok(legacy["warm"])
    assert [c["eval_id"] for c in warm["cases"]] == ["weather"]
    assert warm["agent_calls"] == 0
    assert warm["reused_units"] == cold["scored_units"] == 2 and warm["scored_units"] == 0
    assert score_status(warm) == score_status(cold)


def test_an_old_list_format_eval_set_keeps_its_case_names(legacy: dict[str, Any]) -> None:
    out = ok(legacy["old_list"], code=1)  # one case expects the wrong tool call
    assert out["eval_set_id"] == "legacy_list"
    assert score_status(out) == {
        ("oslo_in_celsius", "tool_trajectory_avg_score"): (1.0, "PASSED"),
        ("oslo_in_celsius", "response_match_score"): (1.0, "PASSED"),
        ("rome_expects_the_wrong_city", "tool_trajectory_avg_score"): (0.0, "FAILED"),
        ("rome_expects_the_wrong_city", "response_match_score"): (1.0, "PASSED"),
    }


def test_old_format_parity_with_adk_migration_and_local_eval_service(
        legacy: dict[str, Any]) -> None:
    """ADK's own loading of the same file, scored by ADK's LocalEvalService on the same
    inference: the same case (ids aside) and the same score and status per metric."""
    from google.adk.evaluation.agent_evaluator import AgentEvaluator
    from google.adk.evaluation.base_eval_service import (
        EvaluateConfig,
        EvaluateRequest,
        InferenceResult,
        InferenceStatus,
    )
    from google.adk.evaluation.eval_case import EvalCase, Invocation
    from google.adk.evaluation.eval_config import get_eval_metrics_from_config
    from google.adk.evaluation.in_memory_eval_sets_manager import InMemoryEvalSetsManager
    from google.adk.evaluation.local_eval_service import LocalEvalService

    from evalsnap.fingerprint import strip_volatile

    test_file, agent = legacy["test_file"], legacy["agent"]
    config = AgentEvaluator.find_config_for_test_file(str(test_file))
    session = AgentEvaluator._get_initial_session(str(agent / "initial.session.json"))
    adk_set = AgentEvaluator._load_eval_set_from_file(str(test_file), config, session)
    (adk_case,) = adk_set.eval_cases
    (ours,) = legacy["shown"].json["cases"]

    def comparable(case: EvalCase) -> Any:
        return strip_volatile(case.model_dump(mode="json", exclude={"eval_id"}))

    assert comparable(EvalCase.model_validate(ours["reference"])) == comparable(adk_case)

    manager = InMemoryEvalSetsManager()
    manager.create_eval_set("legacy_agent", adk_set.eval_set_id)
    manager.add_eval_case("legacy_agent", adk_set.eval_set_id, adk_case)
    result = InferenceResult(
        app_name="legacy_agent", eval_set_id=adk_set.eval_set_id, eval_case_id=adk_case.eval_id,
        inferences=[Invocation.model_validate(i) for i in ours["inference"]["invocations"]],
        session_id="s", status=InferenceStatus.SUCCESS)
    metrics = [m for m in get_eval_metrics_from_config(config) if m.metric_name in config.criteria]
    service = LocalEvalService(root_agent=None, eval_sets_manager=manager)  # type: ignore[arg-type]

    async def evaluate() -> list[Any]:
        request = EvaluateRequest(inference_results=[result],
                                  evaluate_config=EvaluateConfig(eval_metrics=metrics))
        return [r async for r in service.evaluate(request)]

    (case_result,) = asyncio.run(evaluate())
    adk = {m.metric_name: (m.score, m.eval_status.name)
           for m in case_result.overall_eval_metric_results}
    mine = {name: (m["score"], m["metric_status"]) for name, m in ours["metrics"].items()}
    assert set(adk) == {"tool_trajectory_avg_score", "response_match_score"}
    assert mine == adk
    assert adk["response_match_score"][0] < 1.0  # a score that could differ


MALFORMED: dict[str, dict[str, Any]] = {
    "empty_list": {"test": [], "expect": "has no turns"},
    "query_not_text": {"test": [{"query": 5, "expected_tool_use": [], "reference": "x"}],
                       "expect": "turn 0 has no `query` string"},
    "tool_use_without_name": {
        "test": [{"query": "weather in Paris?", "reference": "x",
                  "expected_tool_use": [{"tool": "get_weather", "tool_input": {}}]}],
        "expect": "expected_tool_use[0] without a `tool_name` string"},
    "column_missing_for_adk_default_criteria": {
        "test": [{"query": "hi", "reference": "Hello."}], "no_config": True,
        "expect": "tool_trajectory_avg_score must include 'query' and 'expected_tool_use'"},
    "initial_session_not_an_object": {
        "test": [{"query": "hi", "expected_tool_use": [], "reference": "Hello."}],
        "session": [1], "expect": "must be an object"},
}


@pytest.fixture(scope="module")
def malformed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Every malformed file, one after the other, in this process (tests._cli)."""
    def one(name: str, spec: dict[str, Any]) -> tuple[Path, Path, CliResult]:
        agent = _copy("legacy_agent", tmp_path_factory.mktemp(name))
        test_file = agent / "weather.test.json"
        test_file.write_text(json.dumps(spec["test"]))
        if spec.get("no_config"):
            (agent / "test_config.json").unlink()
        if "session" in spec:
            (agent / "initial.session.json").write_text(json.dumps(spec["session"]))
        store = agent.parent.parent / "store"
        return test_file, store, _run(agent, test_file, store)

    yield {name: one(name, spec) for name, spec in MALFORMED.items()}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_a_malformed_old_format_file_is_a_typed_error_naming_it(
        name: str, malformed: dict[str, Any]) -> None:
    test_file, store, result = malformed[name]
    assert result.code == 2, (result.stdout[-1000:], result.stderr[-2000:])
    assert result.stdout.strip() == ""
    assert MALFORMED[name]["expect"] in result.stderr
    assert str(test_file) in result.stderr
    assert "Traceback" not in result.stderr
    assert not (store / "v1" / "objects").exists()
