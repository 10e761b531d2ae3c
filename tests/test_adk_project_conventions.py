"""Issue 18: a user's ADK project works as under ``adk eval``, with no rewiring.

``tests/fixtures/adk_projects/gateway_agent`` registers its agent model and its judge model
(``my-judge/v1``) with ADK's ``LLMRegistry`` in its agent module, and its config has no
evalsnap extension: only importing the package makes the config resolvable. Every test
runs the real CLI (or the Python API, which runs the same flow).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests._adk_parity import local_eval_service, scores
from tests._cli import fresh_user_code, run_inproc, score_status
from tests.conftest import copy_agent

GATEWAY = Path(__file__).parent / "fixtures" / "adk_projects" / "gateway_agent"
FORCE_POOL = {"EVALSNAP_SCORE_POOL_MIN_UNITS": "1", "EVALSNAP_SCORE_PROCESSES": "1"}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A copy of the project, one cold run scored partly in Prefect's process pool."""
    base = tmp_path_factory.mktemp("gateway")
    agent = copy_agent(GATEWAY, base / "gateway_agent")
    store = base / "store"
    cold = run_inproc("run", str(agent), str(agent / "gateway.evalset.json"), "--store", str(store),
                   "--json", env=FORCE_POOL)
    return {"agent": agent, "store": store, "cold": cold}


def test_models_registered_by_the_agent_module_work_in_every_scoring_process(project):
    cold = project["cold"]
    assert cold.code == 1, cold.stderr[-3000:]  # `greets` fails the judge, as designed
    scores = score_status(cold.json)
    assert len(scores) == 9 and cold.json["complete"]
    assert scores[("adds", "final_response_match_v2")] == (1.0, "PASSED")
    assert scores[("greets", "final_response_match_v2")] == (0.0, "FAILED")
    assert scores[("two_turns", "tool_trajectory_avg_score")] == (1.0, "PASSED")
    assert cold.json["judge_calls"] == 4  # one per invocation: 1 + 2 + 1


def test_dask_workers_import_the_agent_package(project, tmp_path: Path):
    pytest.importorskip("prefect_dask")
    result = run_inproc("run", str(project["agent"]), str(project["agent"] / "gateway.evalset.json"),
                     "--store", str(tmp_path / "dask"), "--task-runner", "dask", "--json",
                     env={"EVALSNAP_DASK_WORKERS": "1"})
    assert result.code == 1, result.stderr[-3000:]
    assert score_status(result.json) == score_status(project["cold"].json)


def test_scores_equal_adks_local_eval_service_on_the_same_inference(project):
    import importlib
    import sys

    from google.adk.evaluation.eval_config import EvalConfig, get_eval_metrics_from_config
    from google.adk.evaluation.eval_set import EvalSet
    from google.adk.evaluation.metric_evaluator_registry import (
        DEFAULT_METRIC_EVALUATOR_REGISTRY,
        register_custom_metrics_from_config,
    )

    shown = run_inproc("show", project["cold"].json["record_id"], "--store",
                    str(project["store"]), "--json").json
    # the agent's models registered here must not outlive this test (the rescore test below
    # checks that a rescore without --agent has no judge)
    with fresh_user_code():
        sys.path.insert(0, str(project["agent"].parent))
        importlib.import_module("gateway_agent")  # as `adk eval` does: the agent first
        config = EvalConfig.model_validate_json(
            (project["agent"] / "test_config.json").read_text())
        metrics = [m for m in get_eval_metrics_from_config(config)
                   if m.metric_name in config.criteria]
        eval_set = EvalSet.model_validate_json(
            (project["agent"] / "gateway.evalset.json").read_text())
        adk = scores(local_eval_service(
            "gateway_agent", eval_set, shown["cases"], metrics,
            register_custom_metrics_from_config(config, DEFAULT_METRIC_EVALUATOR_REGISTRY.fork())))
    ours = {(c["eval_id"], name): (m["score"], m["metric_status"])
            for c in shown["cases"] for name, m in c["metrics"].items()}
    assert len(adk) == 9 and ours == adk


def _judge_registered() -> bool:
    """Whether ADK's model registry of this process knows ``my-judge/v1`` (only importing
    the agent package registers it; :mod:`tests._cli` forgets that after each call)."""
    import re

    from google.adk.models import registry

    return any(re.fullmatch(pattern, "my-judge/v1") for pattern in registry._llm_registry_dict)


def test_replay_in_a_fresh_process_needs_no_registered_judge(project):
    """The CLI never imports the agent for a replay: `my-judge/v1` is not registered where
    it runs (the CLI in this process, as a new process has it: checked), and the ledger
    answers every request."""
    assert not _judge_registered(), "expected no registered judge before the replay"
    replayed = run_inproc("replay", project["cold"].json["record_id"], "--store",
                          str(project["store"]), "--json")
    assert replayed.code == 1, replayed.stderr[-3000:]
    assert replayed.json["judge_calls"] == 0
    assert score_status(replayed.json) == score_status(project["cold"].json)
    assert replayed.json["replay_changes"] == []


def test_rescore_imports_the_agent_package_named_by_agent(project, tmp_path: Path):
    config = json.loads((project["agent"] / "test_config.json").read_text())
    config["criteria"]["final_response_match_v2"]["threshold"] = 0.25  # rule change
    edited = tmp_path / "test_config.json"
    edited.write_text(json.dumps(config))
    args = ("rescore", project["cold"].json["run_id"], "--config", str(edited), "--store",
            str(project["store"]), "--reuse", "--json")
    # as in a new process: no earlier test's models registered (checked)
    assert not _judge_registered(), "expected no registered judge before the rescore"
    without = run_inproc(*args)
    assert without.code == 2, (without.stdout[-2000:], without.stderr[-3000:])
    assert "my-judge/v1" in without.stderr and "--agent" in without.stderr
    rescored = run_inproc(*args, "--agent", str(project["agent"]))
    assert rescored.code == 1, rescored.stderr[-3000:]
    assert rescored.json["agent_calls"] == 0 and rescored.json["judge_calls"] == 0
    assert score_status(rescored.json) == score_status(project["cold"].json)


def test_a_sub_agent_is_evaluated_by_name(project, tmp_path: Path):
    result = run_inproc("run", str(project["agent"]), str(project["agent"] / "gateway.evalset.json")
                     + ":adds", "--agent-name", "adder", "--store", str(tmp_path / "s"), "--json")
    assert result.code == 0, result.stderr[-3000:]
    shown = run_inproc("show", result.json["record_id"], "--store", str(tmp_path / "s"),
                    "--json").json
    final = shown["cases"][0]["inference"]["invocations"][0]["final_response"]["parts"][0]
    assert final["text"] == "Adder says the sum is 5."
    unknown = run_inproc("run", str(project["agent"]), str(project["agent"] / "gateway.evalset.json"),
                      "--agent-name", "nobody", "--store", str(tmp_path / "s"))
    assert unknown.code == 2 and "adder" in unknown.stderr


def test_adk_eval_selection_ids_and_several_eval_sets(project, tmp_path: Path):
    agent, store = project["agent"], str(tmp_path / "s")
    picked = run_inproc("run", str(agent), f"{agent / 'gateway.evalset.json'}:adds,greets",
                     "--store", store, "--json")
    assert picked.code == 1, picked.stderr[-3000:]
    assert [c["eval_id"] for c in picked.json["cases"]] == ["adds", "greets"]
    # eval set ids resolve in the agent's folder, as `adk eval` resolves them
    both = run_inproc("run", str(agent), "gateway:adds", "gateway_more", "--store", store, "--json",
                   "--reuse")
    assert both.code == 0, both.stderr[-3000:]
    assert both.json["eval_set_ids"] == ["gateway", "gateway_more"]
    assert [[c["eval_id"] for c in r["cases"]] for r in both.json["runs"]] == [["adds"],
                                                                               ["adds_more"]]
    assert both.json["agent_calls"] == 2  # `adds` came from the first run
    listed = run_inproc("ls", "--store", store, "--json")
    assert {r["eval_set_id"] for r in listed.json["runs"]} == {"gateway", "gateway_more"}
    unknown = run_inproc("run", str(agent), "gateway_less", "--store", store)
    assert unknown.code == 2 and "gateway_more" in unknown.stderr
    missing_case = run_inproc("run", str(agent), "gateway:nope", "--store", store)
    assert missing_case.code == 2 and "nope" in missing_case.stderr


def test_python_api_returns_the_typed_result_and_raises_typed_errors(project, tmp_path: Path):
    import evalsnap
    from evalsnap.errors import UsageError

    store = str(tmp_path / "api")
    result = evalsnap.evaluate(str(project["agent"]),
                               f"{project['agent'] / 'gateway.evalset.json'}:adds,greets",
                               store=store)
    assert isinstance(result, evalsnap.RunResult)
    assert (result.passed, result.complete, result.exit_code) == (False, True, 1)
    assert [c.eval_id for _, c in result.cases] == ["adds", "greets"]
    assert result.runs[0].cases[1].metrics["final_response_match_v2"].status == "FAILED"
    # ADK's informational efficiency metrics: one tool call in one turn for `adds`
    assert result.runs[0].cases[0].efficiency["tool_call_count_v1"].value == 1.0
    with pytest.raises(UsageError, match="not_a_metric"):
        evalsnap.evaluate(str(project["agent"]), str(project["agent"] / "gateway.evalset.json"),
                          store=store, metrics=["not_a_metric"])
    again = evalsnap.rescore(result.runs[0].run_id, store=store, reuse=True,
                             agent=str(project["agent"]))
    assert again.judge_calls == 0 and again.runs[0].reused_units == 6


def test_pytest_helper_mirrors_agent_evaluator(project, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch):
    from evalsnap.testing import assert_agent_passes

    monkeypatch.syspath_prepend(str(project["agent"].parent))
    evalset = project["agent"] / "gateway.evalset.json"
    passed = assert_agent_passes("gateway_agent", f"{evalset}:adds,two_turns", num_runs=2,
                                 store=str(tmp_path / "p"))
    assert passed.passed and len(passed.cases) == 4  # 2 cases x 2 runs
    with pytest.raises(AssertionError) as failed:
        assert_agent_passes(project["agent"], str(evalset), store=str(tmp_path / "p"))
    message = str(failed.value)
    assert ("gateway/greets · final_response_match_v2: FAILED (mean score 0.000, threshold 0.5; "
            "0/1 repetitions passed)") in message
    assert "gateway/adds" not in message


def test_a_directory_of_test_files_each_scored_with_its_folders_config(project, tmp_path: Path):
    tests_dir = GATEWAY.parent / "gateway_tests"
    result = run_inproc("run", str(project["agent"]), str(tests_dir), "--store", str(tmp_path / "d"),
                     "--json")
    assert result.code == 1, result.stderr[-3000:]
    runs = {r["eval_set_id"]: r for r in result.json["runs"]}
    assert list(runs) == ["adding_leniently", "greeting", "adding"]  # sorted paths
    match = {set_id: [(c["eval_id"], c["metrics"]["response_match_score"]["threshold"],
                       c["metrics"]["response_match_score"]["status"]) for c in r["cases"]]
             for set_id, r in runs.items()}
    assert match == {"adding_leniently": [("adding_leniently", 0.5, "PASSED")],
                     "greeting": [("greeting", 0.8, "PASSED")],  # no config there: ADK's default
                     "adding": [("adding", 0.9, "FAILED")]}
    assert [runs[s]["passed"] for s in runs] == [True, True, False]
    assert result.json["agent_calls"] == 2 + 3 + 2  # the greeting file has two turns
    from evalsnap.testing import assert_agent_passes

    with pytest.raises(AssertionError) as failed:
        assert_agent_passes(project["agent"], tests_dir, store=str(tmp_path / "d"), reuse=True)
    assert "adding/adding · response_match_score: FAILED" in str(failed.value)
    assert "greeting/" not in str(failed.value)
