"""The scoring worker process: same units as in-process scoring, typed errors, and a dead
worker costs nothing but time (the task scores its metric in the flow's process)."""

from __future__ import annotations

import copy
import json
import logging
import os
import signal
import time
from pathlib import Path

import pytest

from evalsnap import score_worker
from evalsnap.adk.config import resolve_config
from evalsnap.errors import NotFoundError
from evalsnap.pipeline import stages
from tasks.score import score_task
from tests._pipeline import EXAMPLES, example_config, example_eval_set, infer_all

CODE_METRICS = ["tool_trajectory_avg_score", "response_match_score", "final_state_match",
                "response_mentions_city"]
#: Every second judge metric in config order goes to the worker as well.
WORKER_JUDGE = "rubric_based_final_response_quality_v1"


@pytest.fixture(scope="module")
def frozen(tmp_path_factory: pytest.TempPathFactory) -> dict:
    url = str(tmp_path_factory.mktemp("worker") / "store")
    eval_set = example_eval_set()
    config = example_config()
    rules = resolve_config(copy.deepcopy(config), where="<test config>").rules
    assert CODE_METRICS == [r.metric_name for r in rules if not r.judge]
    snapshot = stages.freeze(url, eval_set, rules, infer_all(url, eval_set), "shop_agent")
    return {"store_url": url, "snapshot_oid": snapshot,
            "config_json": json.dumps(config, sort_keys=True), "config_where": "<test config>",
            "sys_paths": [str(EXAMPLES)], "reuse": False, "force": False}


def _task_args(frozen: dict, metric: str, run_id: str) -> dict:
    return {**frozen, "metric_name": metric, "units_digest": "-", "run_id": run_id}


def _worker_args(frozen: dict, metric: str, run_id: str) -> dict:
    """``stages.score_metric``'s arguments (the task's, less its cache-key digest)."""
    return {**frozen, "metric_name": metric, "run_id": run_id}


def _comparable(rows: list[dict]) -> list[tuple]:
    return sorted((r["eval_id"], r["unit_fingerprint"], r["status"], r["score"], r["complete"])
                  for r in rows)


def test_worker_scores_code_metrics_exactly_as_the_flows_process(frozen, monkeypatch):
    here = {m: score_task.fn(**_task_args(frozen, m, "run-here")) for m in CODE_METRICS}
    units = []
    with score_worker.running(CODE_METRICS) as worker:
        assert worker is not None and worker.pid != os.getpid()
        assert worker.wait_ready(120)

        def not_here(*args, **kwargs):
            raise AssertionError("a code metric was scored in the flow's process")

        with monkeypatch.context() as patch:
            patch.setattr(stages, "score_metric", not_here)
            there = {m: score_task.fn(**_task_args(frozen, m, "run-there"))
                     for m in CODE_METRICS}
            units = [u for rows in there.values() for u in rows]
        pid = worker.pid
    assert {m: _comparable(r) for m, r in there.items()} == \
        {m: _comparable(r) for m, r in here.items()}
    assert all(u["run_id"] == "run-there" for u in units) and units
    _assert_gone(pid)
    assert score_worker.current() is None


def test_metrics_not_given_to_the_worker_stay_in_the_flows_process(frozen, monkeypatch):
    with score_worker.running(CODE_METRICS) as worker:
        assert worker is not None
        monkeypatch.setattr(score_worker, "score_in_worker", lambda *a, **k: pytest.fail(
            "a metric the worker was not started for went to the worker"))
        rows = score_task.fn(**_task_args(frozen, "final_response_match_v2", "run-judge"))
    assert rows and all(r["metric_name"] == "final_response_match_v2" for r in rows)


def _ledgers(store_url: str, rows: list[dict]) -> list[tuple]:
    """Per unit: its judge calls as (request key, sample, parsed answer), in order."""
    from evalsnap.pipeline import ledger as _ledger
    from evalsnap.records import repo
    from evalsnap.records.unit import ScoreUnit

    store = repo.open_store(store_url)
    out = []
    for row in rows:
        unit = repo.get(store, ScoreUnit, row["unit_oid"])
        entries = [_ledger.load_entry(store, oid) for oid in unit.ledger]
        out.append((row["eval_id"], unit.judge_calls,
                     tuple((e.request_key, e.sample_index, e.raw_response, e.source)
                           for e in entries if e is not None)))
    return sorted(out)


def test_a_judge_metric_in_the_worker_scores_and_records_as_in_process(frozen, monkeypatch):
    here = score_task.fn(**_task_args(frozen, WORKER_JUDGE, "judge-here"))
    with score_worker.running([WORKER_JUDGE]) as worker:
        assert worker is not None and worker.wait_ready(120)
        with monkeypatch.context() as patch:
            patch.setattr(stages, "score_metric", lambda *a, **k: pytest.fail(
                "the judge metric was scored in the flow's process"))
            there = score_task.fn(**_task_args(frozen, WORKER_JUDGE, "judge-there"))
    assert _comparable(there) == _comparable(here)
    assert sum(r["judge_calls"] for r in there) > 0
    assert _ledgers(frozen["store_url"], there) == _ledgers(frozen["store_url"], here)


def _tokens(limiter) -> int:
    return limiter.free_slots()


def test_a_worker_killed_while_calling_the_judge_gives_its_slots_back(frozen, monkeypatch):
    from evalsnap.pipeline.judge import judge_limiter

    limiter = judge_limiter()
    assert _tokens(limiter) == limiter.slots  # nothing in flight
    monkeypatch.setenv("EVALSNAP_DEMO_JUDGE_LATENCY_MS", "5000")  # the worker's judge hangs
    with score_worker.running([WORKER_JUDGE]) as worker:
        assert worker is not None and worker.wait_ready(120)
        from concurrent.futures import ThreadPoolExecutor

        pool = ThreadPoolExecutor(1)
        try:
            asked = pool.submit(worker.score_metric, **_worker_args(frozen, WORKER_JUDGE, "k"))
            deadline = time.monotonic() + 60
            while _tokens(limiter) == limiter.slots and time.monotonic() < deadline:
                time.sleep(0.05)
            held = limiter.slots - _tokens(limiter)
            assert held > 0, "the worker never took a judge slot"
            worker.proc.send_signal(signal.SIGKILL)
            with pytest.raises(score_worker.WorkerUnavailable):
                asked.result(timeout=60)
        finally:
            pool.shutdown(wait=False)
    assert _tokens(limiter) == limiter.slots  # what the dead worker held is back


def test_a_dead_worker_means_scoring_in_process(frozen, caplog):
    metric = "final_state_match"
    expected = _comparable(score_task.fn(**_task_args(frozen, metric, "run-a")))
    with score_worker.running([metric]) as worker:
        assert worker is not None and worker.wait_ready(120)
        worker.proc.send_signal(signal.SIGKILL)
        worker.proc.wait()
        with caplog.at_level(logging.WARNING, logger="evalsnap.score_worker"):
            rows = score_task.fn(**_task_args(frozen, metric, "run-b"))
    assert _comparable(rows) == expected
    assert "scoring final_state_match in the flow's process" in caplog.text
    assert "exited" in caplog.text


def test_errors_in_the_worker_come_back_with_their_type(frozen):
    with score_worker.running(["final_state_match"]) as worker:
        assert worker is not None and worker.wait_ready(120)
        missing = "sha256:" + "0" * 64
        with pytest.raises(NotFoundError, match="not in store"):
            worker.score_metric(**{**_worker_args(frozen, "final_state_match", "r"),
                                   "snapshot_oid": missing})
        # the worker survives a failed request and serves the next one
        rows = worker.score_metric(**_worker_args(frozen, "final_state_match", "r2"))
        assert rows and rows[0]["run_id"] == "r2"


def test_a_run_never_waits_for_a_worker_that_is_still_importing(frozen, caplog, monkeypatch):
    monkeypatch.setenv("EVALSNAP_SCORE_WORKER", "auto")  # `on` waits for it
    with score_worker.running(["final_state_match"]) as worker:
        assert worker is not None
        with caplog.at_level(logging.INFO, logger="evalsnap.score_worker"):
            rows = score_task.fn(**_task_args(frozen, "final_state_match", "run-early"))
        assert worker.wait_ready(120)  # it was importing, not broken
    assert rows and "still starting" in caplog.text


def test_when_a_run_gets_a_worker(monkeypatch):
    rules = resolve_config(example_config(), where="<test config>").rules
    monkeypatch.setenv("EVALSNAP_SCORE_WORKER", "auto")
    monkeypatch.setenv("EVALSNAP_SCORE_WORKER_MIN_UNITS", "200")
    pick = score_worker.metrics_for_worker
    if (os.cpu_count() or 1) >= 2:
        assert pick(rules, "/s", "threads", 50, reuse=False, force=False) == \
            CODE_METRICS + [WORKER_JUDGE]
        # judge calls under a Prefect concurrency limit stay with the flow's Prefect context
        assert pick(rules, "/s", "threads", 50, reuse=False, force=False,
                    prefect_judge_limit=True) == CODE_METRICS
    assert pick(rules, "/s", "threads", 39, reuse=False, force=False) == []  # 195 units
    assert pick(rules, "/s", "threads", 300, reuse=True, force=False) == []
    assert pick(rules, "/s", "dask", 300, reuse=False, force=False) == []
    assert pick(rules, "memory://s", "threads", 300, reuse=False, force=False) == []
    monkeypatch.setenv("EVALSNAP_SCORE_WORKER", "on")
    assert pick(rules, "/s", "threads", 1, reuse=True, force=True) == \
        CODE_METRICS + [WORKER_JUDGE]
    monkeypatch.setenv("EVALSNAP_SCORE_WORKER", "off")
    assert pick(rules, "/s", "threads", 300, reuse=False, force=False) == []


def _assert_gone(pid: int) -> None:
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists(), f"worker {pid} still running"


def test_a_failing_progress_hook_does_not_stop_the_answers(frozen, caplog):
    from concurrent.futures import ThreadPoolExecutor

    def broken_hook() -> None:
        raise RuntimeError("progress display went away")

    with score_worker.running(["final_state_match"]) as worker:
        assert worker is not None and worker.wait_ready(120)
        pool = ThreadPoolExecutor(1)
        try:
            answer = pool.submit(worker.score_metric, on_unit=broken_hook,
                                 **_worker_args(frozen, "final_state_match", "r-hook"))
            rows = answer.result(timeout=120)  # a dead reader thread would block for good
        finally:
            pool.shutdown(wait=False)
    assert rows and rows[0]["run_id"] == "r-hook"
    assert "progress display went away" in caplog.text
