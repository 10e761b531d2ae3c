"""Transient model errors are retried by Prefect task retries; permanent ones end as a
failed inference (exit 3), never a crashed flow. The CLI runs in the test process
(:mod:`tests._cli`); the demo's failure budget is per import of its models, which is per call
there as in a new process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests._cli import run_inproc
from tests.conftest import EVALSET

FAST_METRICS = ["--metric", "tool_trajectory_avg_score", "--metric", "response_match_score"]


@pytest.fixture
def cli():
    return run_inproc


def _show(cli, store: Path, run_id: str) -> dict:
    shown = cli("show", run_id, "--store", str(store), "--json")
    assert shown.code == 0, shown.stderr[-2000:]
    return shown.json


def test_transient_errors_are_retried_and_attempts_recorded(cli, shop_copy, store_dir):
    # the one test naming the default runner on the command line: run_inproc runs a call
    # with --task-runner in a process of its own (tests/_cli.py, _PROCESS_ARGS)
    result = cli("run", str(shop_copy), str(shop_copy / EVALSET.name), "--store", str(store_dir),
                 "--case", "weather_paris", *FAST_METRICS, "--task-runner", "threads", "--json",
                 env={"EVALSNAP_DEMO_AGENT_FAIL_FIRST": "2", "EVALSNAP_RETRIES": "2",
                      "EVALSNAP_RETRY_DELAYS": "0,0"})
    out = result.json
    assert result.code == 0, result.stderr[-3000:]
    assert out["complete"] and out["passed"]
    [case] = out["cases"]
    assert case["inference"] == "success"
    record = _show(cli, store_dir, out["run_id"])
    [shown] = record["cases"]
    assert shown["inference"]["status"] == "success"
    assert shown["inference"]["attempts"] == 3  # two transient failures, then an answer


def test_permanent_failure_is_a_failed_inference_not_a_crash(cli, shop_copy, store_dir):
    evalset = json.loads((shop_copy / EVALSET.name).read_text())
    good = next(c for c in evalset["eval_cases"] if c["eval_id"] == "weather_paris")
    bad = json.loads(json.dumps(good))
    bad["eval_id"] = "always_fails"
    bad["conversation"][0]["user_content"]["parts"][0]["text"] = "FAIL_MODEL: weather in Paris?"
    evalset["eval_cases"] = [good, bad]
    path = shop_copy / "fails.evalset.json"
    path.write_text(json.dumps(evalset))

    result = cli("run", str(shop_copy), str(path), "--config", str(shop_copy / "test_config.json"),
                 "--store", str(store_dir), *FAST_METRICS, "--json",
                 env={"EVALSNAP_RETRIES": "2", "EVALSNAP_RETRY_DELAYS": "0,0"})
    assert result.code == 3, result.stderr[-3000:]  # incomplete, not a crash (1 or 2)
    out = result.json
    by_id = {c["eval_id"]: c for c in out["cases"]}
    assert by_id["weather_paris"]["inference"] == "success"
    assert by_id["always_fails"]["inference"] == "failure"
    assert not out["complete"]
    record = _show(cli, store_dir, out["run_id"])
    failed = next(c for c in record["cases"] if c["eval_id"] == "always_fails")
    assert failed["inference"]["status"] == "failure"
    # ScriptedModelError says it is not retryable: no retry is spent on it (issue 27)
    assert failed["inference"]["attempts"] == 1
    assert failed["inference"]["error"]
