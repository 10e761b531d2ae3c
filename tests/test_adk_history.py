"""ADK interop: each run writes an ``EvalSetResult`` that ADK's own loader (what ``adk web``
uses) reads; ``import-adk-history`` brings ADK history files in as records of kind
``import``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from google.adk.evaluation.eval_case import Invocation
from google.adk.evaluation.eval_metrics import (
    EvalMetricResult,
    EvalMetricResultPerInvocation,
    EvalStatus,
)
from google.adk.evaluation.eval_result import EvalCaseResult
from google.adk.evaluation.local_eval_set_results_manager import LocalEvalSetResultsManager
from google.genai import types

from tests._cli import run_inproc


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, golden_demo: Any) -> dict[str, Any]:
    """A copy of the session's cold demo run (tests._golden): its agent dir holds the ADK
    history that run wrote."""
    root = tmp_path_factory.mktemp("adk")
    agent, store, result = golden_demo.copy(root)
    agents = agent.parent
    assert result.code in (1, 3), result.stderr[-3000:]
    return {"root": root, "agents": agents, "agent": agent, "store": store, "run": result}


def test_run_writes_history_adk_loads(exported: dict[str, Any]) -> None:
    out = exported["run"].json
    path = Path(out["adk_history_path"])
    assert path.parent == exported["agent"] / ".adk" / "eval_history"
    manager = LocalEvalSetResultsManager(agents_dir=str(exported["agents"]))
    name = path.name.removesuffix(".evalset_result.json")
    assert name in manager.list_eval_set_results("shop_agent")
    loaded = manager.get_eval_set_result("shop_agent", name)
    assert loaded.eval_set_id == out["eval_set_id"]
    by_case = {c.eval_id: c for c in loaded.eval_case_results}
    assert set(by_case) == {c["eval_id"] for c in out["cases"]}
    for case in out["cases"]:
        adk_case = by_case[case["eval_id"]]
        overall = {m.metric_name: m for m in adk_case.overall_eval_metric_results}
        assert set(overall) == set(case["metrics"])
        for metric, value in case["metrics"].items():
            assert overall[metric].score == value["score"], (case["eval_id"], metric)
        assert adk_case.eval_metric_result_per_invocation  # actual invocations are there


def _adk_written_history(agents: Path) -> Path:
    """A history file written by ADK itself, as ``adk eval`` / ``adk web`` would."""
    def inv(text: str, answer: str) -> Invocation:
        return Invocation(user_content=types.Content(role="user", parts=[types.Part(text=text)]),
                          final_response=types.Content(role="model",
                                                       parts=[types.Part(text=answer)]))

    cases = []
    for i, (score, status) in enumerate([(1.0, EvalStatus.PASSED), (0.2, EvalStatus.FAILED)]):
        per_inv = [EvalMetricResultPerInvocation(
            actual_invocation=inv(f"q{i}", f"a{i}"), expected_invocation=inv(f"q{i}", "x"),
            eval_metric_results=[EvalMetricResult(metric_name="response_match_score",
                                                  threshold=0.5, score=score,
                                                  eval_status=status)])]
        cases.append(EvalCaseResult(
            eval_set_id="adk_set", eval_id=f"case_{i}", final_eval_status=status,
            overall_eval_metric_results=[EvalMetricResult(
                metric_name="response_match_score", threshold=0.5, score=score,
                eval_status=status)],
            eval_metric_result_per_invocation=per_inv, session_id=f"s{i}", user_id="u"))
    LocalEvalSetResultsManager(agents_dir=str(agents)).save_eval_set_result(
        "legacy_app", "adk_set", cases)
    return agents / "legacy_app" / ".adk" / "eval_history"


@pytest.fixture(scope="module")
def imported(exported: dict[str, Any]) -> dict[str, Any]:
    history = _adk_written_history(exported["agents"])
    store = exported["root"] / "imported"
    first = run_inproc("import-adk-history", str(history), "--store", str(store), "--json")
    listed = run_inproc("ls", "--store", str(store), "--json")
    return {"history": history, "store": store, "first": first, "ls": listed}


def test_import_creates_import_records_visible_in_ls(imported: dict[str, Any]) -> None:
    first = imported["first"]
    assert first.code == 0, first.stderr[-2000:]
    [item] = first.json["imported"]
    assert item["app_name"] == "legacy_app" and item["cases"] == 2 and item["units"] == 2
    runs = imported["ls"].json["runs"]
    assert [(r["run_id"], r["kind"], r["snapshot_id"]) for r in runs] == [
        (item["run_id"], "import", None)]


def test_imported_record_shows_inference_without_state_and_scores(
        imported: dict[str, Any]) -> None:
    [item] = imported["first"].json["imported"]
    shown = run_inproc("show", item["run_id"], "--store", str(imported["store"]), "--json")
    assert shown.code == 0, shown.stderr[-2000:]
    data = shown.json
    assert data["record"]["kind"] == "import" and data["record"]["snapshot_oid"] is None
    cases = {c["eval_id"]: c for c in data["cases"]}
    assert set(cases) == {"case_0", "case_1"}
    for i, (score, status) in enumerate([(1.0, "PASSED"), (0.2, "FAILED")]):
        case = cases[f"case_{i}"]
        assert case["initial_session_state"] is None and case["final_session_state"] is None
        [invocation] = case["inference"]["invocations"]
        assert invocation["final_response"]["parts"][0]["text"] == f"a{i}"
        metric = case["metrics"]["response_match_score"]
        assert (metric["score"], metric["status"]) == (score, status)
        assert [r["score"] for r in metric["rows"]] == [score]
    assert data["record"]["summary"]["passed"] is False


def test_import_is_idempotent_and_verifies(imported: dict[str, Any]) -> None:
    again = run_inproc("import-adk-history", str(imported["history"]), "--store",
                    str(imported["store"]), "--json")
    assert again.code == 0
    assert again.json["imported"] == imported["first"].json["imported"]
    check = run_inproc("verify", "--store", str(imported["store"]), "--json")
    assert check.code == 0 and check.json["runs"] == 1, check.stdout


def test_exported_history_imports_back(exported: dict[str, Any]) -> None:
    """evalsnap's own export is valid ADK input (the agent dir is accepted too)."""
    store = exported["root"] / "roundtrip"
    result = run_inproc("import-adk-history", str(exported["agent"]), "--store", str(store),
                     "--json")
    assert result.code == 0, result.stderr[-2000:]
    [item] = result.json["imported"]
    run = exported["run"].json
    assert item["app_name"] == "shop_agent" and item["cases"] == len(run["cases"])


def test_import_of_a_non_history_dir_exits_2(tmp_path: Path) -> None:
    (tmp_path / "x.evalset_result.json").write_text(json.dumps({"nope": 1}))
    bad = run_inproc("import-adk-history", str(tmp_path), "--store", str(tmp_path / "s"))
    assert bad.code == 2 and "not an ADK EvalSetResult" in bad.stderr
