"""``--baseline`` and ``--fail-on`` through the real CLI (exit codes as in the README's table),
``diff --fail-on-change``, and the flow's final state following the gate.

A small eval set (three cases of the demo, two code metrics: no judge) keeps every run
short; each run is the real CLI in the test process (:mod:`tests._cli`) on the session's
Prefect server. The tests that start from a cold run of it share one (:func:`cold`, its store
copied per test)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from evalsnap.reports.regressions import compare, gate
from tests._cli import run_inproc
from tests.conftest import EVALSET, CliResult, copy_shop

CASES = ["weather_paris", "cart_add_two_items", "greeting_then_weather"]
CRITERIA = {"tool_trajectory_avg_score": 1.0, "response_match_score": 0.5}


@pytest.fixture
def cli():
    """The command line in this process (what a process adds is tests/test_cli_process.py's)."""
    return run_inproc


@pytest.fixture
def small(shop_copy: Path) -> dict[str, Path]:
    """An eval set of three passing cases and a config of two metrics, in the agent's copy."""
    return _small(shop_copy)


@pytest.fixture(scope="module")
def _small_cold(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Path], Path, CliResult]:
    base = tmp_path_factory.mktemp("small")
    agent = copy_shop(base / "agents" / "shop_agent")
    small = _small(agent)
    store = base / "store"
    return small, store, _run(run_inproc, small, store, "--json")


@pytest.fixture
def cold(_small_cold, store_dir: Path) -> tuple[dict[str, Path], CliResult]:
    """``(small, first)``: the module's one agent copy with the small eval set, and its cold
    run ``first``, whose store is copied to ``store_dir`` (each test adds to its own)."""
    small, store, first = _small_cold
    shutil.copytree(store, store_dir)
    return small, first


def _small(shop_copy: Path) -> dict[str, Path]:
    data = json.loads((shop_copy / EVALSET.name).read_text("utf-8"))
    data["eval_cases"] = [c for c in data["eval_cases"] if c["eval_id"] in CASES]
    evalset = shop_copy / "small.evalset.json"
    evalset.write_text(json.dumps(data), "utf-8")
    config = shop_copy / "small_config.json"
    config.write_text(json.dumps({"criteria": CRITERIA}), "utf-8")
    return {"agent": shop_copy, "evalset": evalset, "config": config}


def _edited(small: dict[str, Path], text: str = "Completely unrelated words here.") -> Path:
    """The small eval set with weather_paris's expected answer replaced (response_match fails)."""
    data = json.loads(small["evalset"].read_text("utf-8"))
    for case in data["eval_cases"]:
        if case["eval_id"] == "weather_paris":
            case["conversation"][0]["final_response"]["parts"][0]["text"] = text
    path = small["evalset"].with_name("edited.evalset.json")
    path.write_text(json.dumps(data), "utf-8")
    return path


def _run(cli, small, store, *extra):
    return cli("run", str(small["agent"]), str(small["evalset"]), "--config", str(small["config"]),
               "--store", str(store), *extra)


def _rescore(cli, small, store, evalset, *extra):
    return cli("rescore", "latest", "--evalset", str(evalset), "--config", str(small["config"]),
               "--store", str(store), "--reuse", *extra)


def test_baseline_regressions_fixes_and_fail_on_exit_codes(cli, cold, store_dir):
    small, first = cold
    assert first.code == 0, first.stderr[-3000:]
    assert first.json["full"] is True and "regressions" not in first.json

    # Nothing changed: no regression, and --fail-on regression exits 0.
    again = _run(cli, small, store_dir, "--reuse", "--baseline", "latest", "--fail-on",
                 "regression", "--json")
    assert again.code == 0, again.stderr[-3000:]
    assert again.json["baseline"]["run_id"] == first.json["run_id"]
    assert again.json["regressions"] == [] and again.json["fixes"] == []

    # One expected answer edited: weather_paris · response_match_score goes PASSED → FAILED.
    edited = _edited(small)
    worse = _rescore(cli, small, store_dir, edited, "--baseline", "latest", "--fail-on",
                     "regression", "--json")
    assert worse.code == 1, worse.stderr[-3000:]
    [regression] = worse.json["regressions"]
    assert (regression["eval_id"], regression["metric"], regression["change"]) == \
        ("weather_paris", "response_match_score", "PASSED → FAILED")
    assert worse.json["baseline"]["run_id"] == again.json["run_id"]  # the newest full run
    assert worse.json["exit_code"] == 1 and worse.json["fail_on"] == "regression"
    # show --json of that run names its baseline, regressions and fixes too
    shown_json = cli("show", worse.json["run_id"], "--store", str(store_dir), "--json")
    assert shown_json.code == 0, shown_json.stderr[-3000:]
    assert shown_json.json["baseline"]["run_id"] == again.json["run_id"]
    assert shown_json.json["regressions"] == worse.json["regressions"]
    assert shown_json.json["fixes"] == worse.json["fixes"] == []

    # The same known failure against itself is no regression: --fail-on regression exits 0,
    # while the quality gate (the default) still exits 1, and never exits 0.
    known = _rescore(cli, small, store_dir, edited, "--baseline", "latest", "--fail-on",
                     "regression", "--json")
    assert known.code == 0 and known.json["regressions"] == [], known.stderr[-3000:]
    assert known.json["passed"] is False
    assert _rescore(cli, small, store_dir, edited, "--baseline", "latest").code == 1
    assert _rescore(cli, small, store_dir, edited, "--fail-on", "never").code == 0
    assert _rescore(cli, small, store_dir, edited, "--fail-on", "incomplete").code == 0

    # Back to the original answer: a fix against the regressed run, by case and metric.
    fixed = _rescore(cli, small, store_dir, small["evalset"], "--baseline", worse.json["run_id"],
                     "--json")
    assert fixed.code == 0, fixed.stderr[-3000:]
    assert [(f["eval_id"], f["metric"], f["change"]) for f in fixed.json["fixes"]] == \
        [("weather_paris", "response_match_score", "FAILED → PASSED")]

    # The table a person reads names the regression.
    shown = _rescore(cli, small, store_dir, edited, "--baseline", fixed.json["run_id"],
                     "--fail-on", "regression")
    assert shown.code == 1
    assert "REGRESSED weather_paris · response_match_score: PASSED → FAILED" in shown.stdout
    assert "…" not in shown.stdout, "without a terminal no column is cut"

    # A baseline of another eval set, or one that does not exist, is bad usage (exit 2).
    missing = _run(cli, small, store_dir, "--baseline", "no-such-run")
    assert missing.code == 2 and "no-such-run" in missing.stderr


def test_diff_fail_on_change_and_nothing_moved(cli, cold, store_dir):
    small, first = cold
    second = _run(cli, small, store_dir, "--reuse", "--json")
    assert first.code == second.code == 0
    a, b = first.json["run_id"], second.json["run_id"]
    same = cli("diff", a, b, "--store", str(store_dir), "--fail-on-change")
    assert same.code == 0, same.stderr[-2000:]
    assert "nothing moved" in same.stdout and "6 unit(s)" in same.stdout
    assert "none" not in same.stdout
    assert cli("diff", a, b, "--store", str(store_dir), "--json").json["changed"] == 0

    changed = _rescore(cli, small, store_dir, _edited(small), "--json")
    moved = cli("diff", b, changed.json["run_id"], "--store", str(store_dir), "--fail-on-change")
    assert moved.code == 1, moved.stdout + moved.stderr[-2000:]
    assert "PASSED → FAILED" in moved.stdout
    assert cli("diff", b, changed.json["run_id"], "--store", str(store_dir)).code == 0


def test_flow_returns_failed_state_after_publishing(small, store_dir):
    """The flow's final state follows the gate, and the record is published all the same."""
    from evalsnap.records import repo
    from flows.evaluate import evaluate

    edited = _edited(small)
    state = evaluate(agent_dir=str(small["agent"]), evalset=str(edited),
                     config=str(small["config"]), store=str(store_dir), return_state=True)
    assert state.is_failed()
    assert state.message.startswith("NOT PASSED (fail_on=quality): shop: 1 failed (weather_paris)")
    failed = state.result(raise_on_failure=False)  # the gate's verdict, holding the summary
    assert type(failed).__name__ == "GateFailed" and str(failed) == state.message
    result = failed.summary
    assert result["exit_code"] == 1 and result["record_id"] in state.message
    oid, record = repo.resolve_record(repo.open_store(str(store_dir)), result["run_id"])
    assert oid == result["record_id"] and not record.summary.passed

    never = evaluate(agent_dir=str(small["agent"]), evalset=str(edited), config=str(small["config"]),
                     store=str(store_dir), reuse=True, fail_on="never", return_state=True)
    assert never.is_completed() and never.result()["exit_code"] == 0


def test_an_empty_store_parameter_is_the_store_setting(small, store_dir, monkeypatch):
    """A deployment's empty ``store`` is ``EVALSNAP_STORE`` (the work pool's job variables):
    the store is set in one place for every deployment."""
    from evalsnap import settings
    from evalsnap.records import repo
    from flows.evaluate import evaluate

    monkeypatch.setenv("EVALSNAP_STORE", str(store_dir))
    settings.reload()
    try:
        state = evaluate(agent_dir=str(small["agent"]), evalset=str(small["evalset"]),
                         config=str(small["config"]), store="", reuse=True, fail_on="never",
                         return_state=True)
    finally:
        monkeypatch.delenv("EVALSNAP_STORE")
        settings.reload()
    result = state.result()
    oid, _ = repo.resolve_record(repo.open_store(str(store_dir)), result["run_id"])
    assert oid == result["record_id"]


def _summary(**units: tuple[str, float | None, bool]) -> dict:
    return {"cases": [{"eval_id": k.split("__")[0], "repetition": 0, "metrics": {
        k.split("__")[1]: {"status": s, "score": score, "complete": complete}}}
        for k, (s, score, complete) in units.items()]}


def test_compare_tolerance_and_incomplete():
    before = _summary(a__m=("PASSED", 0.9, True), b__m=("PASSED", 0.9, True),
                      c__m=("FAILED", 0.1, True), d__m=("NOT_EVALUATED", None, False),
                      e__m=("PASSED", 1.0, True))
    after = _summary(a__m=("PASSED", 0.7, True), b__m=("NOT_EVALUATED", None, False),
                     c__m=("PASSED", 0.9, True), d__m=("PASSED", 1.0, True),
                     f__m=("FAILED", 0.0, True))
    assert compare(after, before)["regressions"] == [
        {"eval_id": "b", "repetition": 0, "metric": "m", "change": "complete → incomplete",
         "status_before": "PASSED", "status_after": "NOT_EVALUATED", "score_before": 0.9,
         "score_after": None, "p_value": None, "significant": True}]
    found = compare(after, before, tolerance=0.1)
    assert [(r["eval_id"], r["change"]) for r in found["regressions"]] == [
        ("a", "score 0.900 → 0.700 (drop > 0.1)"), ("b", "complete → incomplete")]
    assert [(f["eval_id"], f["change"]) for f in found["fixes"]] == [
        ("c", "FAILED → PASSED"), ("d", "incomplete → complete")]
    assert found["not_compared"] == 2  # e only before, f only after
    assert compare(after, before, tolerance=0.25)["regressions"][0]["eval_id"] == "b"


def test_gate_exit_codes():
    from evalsnap.reports.suite import combined
    from evalsnap.reports.summary_model import Aggregate, CaseResult, MetricResult, RecordResult

    def agg(eval_id: str, status: str) -> Aggregate:
        failed, incomplete = int(status == "FAILED"), int(status == "NOT_EVALUATED")
        return Aggregate(eval_id=eval_id, metric="m", n=1, passed=0, failed=failed,
                         incomplete=incomplete, scored=failed, gate="mean", status=status,
                         verdict="failing" if failed else "incomplete")

    part = RecordResult(
        eval_set_id="s", record_id="sha256:x", run_id="r", kind="run", complete=False,
        passed=False, exit_code=3, regressions=[], cases=[
            CaseResult(eval_id="a", metrics={"m": MetricResult(status="NOT_EVALUATED",
                                                                complete=False)}),
            CaseResult(eval_id="b", metrics={"m": MetricResult(status="FAILED", complete=True)})],
        aggregates=[agg("a", "NOT_EVALUATED"), agg("b", "FAILED")])
    codes = {fail_on: gate(part, fail_on)[0].exit_code
             for fail_on in ("quality", "incomplete", "regression", "never")}
    assert codes == {"quality": 3, "incomplete": 3, "regression": 0, "never": 0}
    assert gate(part, "quality")[1] == ("NOT PASSED (fail_on=quality): s: 1 failed (b); "
                                        "1 incomplete (a) of 2 case(s); record sha256:x")
    several = combined([part, part.model_copy(update={"complete": True, "exit_code": 1})])
    assert gate(several, "incomplete")[0].exit_code == 3
    assert gate(several, "never") == (several.model_copy(update={
        "fail_on": "never", "exit_code": 0, "runs": [
            p.model_copy(update={"fail_on": "never", "exit_code": 0}) for p in several.runs]}),
        None)
