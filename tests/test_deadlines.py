"""Issue 21 item 1: every call has a deadline, through the real CLI.

The demo's offline models take ``EVALSNAP_DEMO_AGENT_LATENCY_MS`` / ``..._JUDGE_...``: a
latency of ten minutes is a model that never answers, as far as a run is concerned. Each
test checks the outcome (what failed and why) and that the call ended well before the
stuck call would have: a hang fails the test. The CLI runs in the test process
(:func:`tests._hang_guard.run_cut`: cut by ``SIGALRM`` after ``timeout`` seconds, as
``subprocess.run(timeout=...)`` cut a CLI process); a run whose metrics score in a scoring
process needs a CLI process of its own and gets one (``tests._cli.needs_a_process``).
A stuck call cut by its deadline is cancelled (the models' latency and the hanging async
metric are ``asyncio`` waits), or left on a daemon thread (a sync metric, by design:
:mod:`evalsnap.deadlines`), so nothing it leaves keeps the test process from ending.
"""

from __future__ import annotations

import json
import socket
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tests._cli import run_inproc
from tests._hang_guard import run_cut

STUCK = "600000"  # ms: ten minutes
NO_RETRY = {"EVALSNAP_RETRY_DELAYS": "", "EVALSNAP_RETRIES": "0"}
CASE = ["--case", "weather_paris"]


def _run(shop: Path, tmp_path: Path, *extra: str, env: dict[str, str], config: Path | None = None,
         timeout: float = 120, cli=run_cut):
    args = ["run", str(shop), str(shop / "shop.evalset.json"), "--store", str(tmp_path / "s"),
            "--json", *CASE, *extra]
    if config is not None:
        args += ["--config", str(config)]
    started = time.monotonic()
    result = cli(*args, env={**NO_RETRY, **env}, timeout=timeout)
    return result, time.monotonic() - started


def test_an_agent_model_call_that_never_answers_fails_the_inference(shop_copy, tmp_path):
    result, _ = _run(shop_copy, tmp_path, env={"EVALSNAP_DEMO_AGENT_LATENCY_MS": STUCK,
                                               "EVALSNAP_AGENT_CALL_TIMEOUT": "2"})
    assert result.code == 3, result.stderr[-3000:]
    case = result.json["cases"][0]
    assert case["inference"] == "failure"
    assert {m["status"] for m in case["metrics"].values()} == {"NOT_EVALUATED"}
    reason = case["metrics"]["response_match_score"]["reason"]
    assert "EVALSNAP_AGENT_CALL_TIMEOUT" in reason and "offline-agent" in reason  # names the model


def test_the_whole_inference_of_a_case_has_a_deadline(shop_copy, tmp_path):
    result, _ = _run(shop_copy, tmp_path, env={"EVALSNAP_DEMO_AGENT_LATENCY_MS": STUCK,
                                               "EVALSNAP_AGENT_CALL_TIMEOUT": "300",
                                               "EVALSNAP_INFERENCE_TIMEOUT": "2"})
    assert result.code == 3, result.stderr[-3000:]
    error = result.json["cases"][0]["metrics"]["response_match_score"]["reason"]
    assert "EVALSNAP_INFERENCE_TIMEOUT" in error and "weather_paris" in error


def test_a_slow_but_answering_model_is_not_cut_off(shop_copy, tmp_path):
    # every call answers in 0.3 s, under a 2 s deadline: the deadline is per call, not per case
    result, _ = _run(shop_copy, tmp_path, "--case", "cart_add_two_items",
                     env={"EVALSNAP_DEMO_AGENT_LATENCY_MS": "300",
                          "EVALSNAP_AGENT_CALL_TIMEOUT": "2"})
    assert result.code in (0, 1), result.stderr[-3000:]
    assert {c["inference"] for c in result.json["cases"]} == {"success"}


def test_a_judge_call_that_never_answers_is_that_units_not_evaluated(shop_copy, tmp_path):
    config = tmp_path / "judge.json"
    config.write_text(json.dumps({
        "evalsnapPlugins": ["shop_agent.offline_models"],
        "criteria": {"response_match_score": 0.5,
                     "final_response_match_v2": {"threshold": 0.5, "judgeModelOptions": {
                         "judgeModel": "offline-judge-v1", "numSamples": 1}}}}))
    result, _ = _run(shop_copy, tmp_path, config=config,
                     env={"EVALSNAP_DEMO_JUDGE_LATENCY_MS": STUCK,
                          "EVALSNAP_JUDGE_CALL_TIMEOUT": "1", "EVALSNAP_RETRY_DELAYS": "0.1"})
    assert result.code == 3, result.stderr[-3000:]
    metrics = result.json["cases"][0]["metrics"]
    assert metrics["response_match_score"]["status"] == "PASSED"
    judged = metrics["final_response_match_v2"]
    assert judged["status"] == "NOT_EVALUATED"
    assert "EVALSNAP_JUDGE_CALL_TIMEOUT" in judged["reason"]
    # retried once (EVALSNAP_RETRY_DELAYS has one delay), and both attempts are in the ledger
    shown = run_inproc("show", result.json["record_id"], "--store", str(tmp_path / "s"), "--json")
    ledger = shown.json["cases"][0]["metrics"]["final_response_match_v2"]["ledger"]
    assert sorted(e["attempt"] for e in ledger) == [1, 2]
    assert all("no answer within 1 s" in (e["error"] or "") for e in ledger), ledger


HANGING = textwrap.dedent('''
    import asyncio
    import json
    import os
    import time

    from google.adk.evaluation.evaluator import EvalStatus, EvaluationResult, PerInvocationResult


    def _passed(actual):
        rows = [PerInvocationResult(actual_invocation=inv, score=1.0,
                                    eval_status=EvalStatus.PASSED) for inv in actual]
        return EvaluationResult(overall_score=1.0, overall_eval_status=EvalStatus.PASSED,
                                per_invocation_results=rows)


    def sleeps(metric, actual, expected, scenario):
        time.sleep(600)


    async def awaits(metric, actual, expected, scenario):
        await asyncio.Event().wait()


    def naps(metric, actual, expected, scenario):
        started = time.time()
        time.sleep(1.0)
        with open(os.environ["NAP_LOG"], "a") as log:
            log.write(json.dumps([started, time.time()]) + "\\n")
        return _passed(actual)
''')


def _metric_config(tmp_path: Path, fn: str, timeouts: dict | None = None) -> Path:
    config = tmp_path / f"{fn}.json"
    body = {"criteria": {"response_match_score": 0.5, "hostile": 0.5},
            "customMetrics": {"hostile": {"codeConfig": {"name": f"shop_agent.hanging.{fn}"},
                                          "version": "1"}}}
    if timeouts is not None:
        body["evalsnapTimeouts"] = timeouts
    config.write_text(json.dumps(body))
    return config


@pytest.mark.parametrize("pool", [False, True], ids=["flow-process", "scoring-process"])
def test_a_sync_metric_that_never_returns_is_not_evaluated(shop_copy, tmp_path, pool):
    (shop_copy / "hanging.py").write_text(HANGING)
    env = {"EVALSNAP_SCORE_POOL_MIN_UNITS": "1", "EVALSNAP_SCORE_PROCESSES": "1"} if pool else {}
    result, _ = _run(shop_copy, tmp_path, config=_metric_config(tmp_path, "sleeps",
                                                                {"hostile": 2}), env=env)
    assert result.code == 3, result.stderr[-3000:]
    metrics = result.json["cases"][0]["metrics"]
    assert metrics["hostile"]["status"] == "NOT_EVALUATED"
    assert "evalsnapTimeouts.hostile" in metrics["hostile"]["reason"]
    assert metrics["response_match_score"]["status"] == "PASSED"


def test_an_async_metric_that_never_returns_is_not_evaluated(shop_copy, tmp_path):
    (shop_copy / "hanging.py").write_text(HANGING)
    result, _ = _run(shop_copy, tmp_path, config=_metric_config(tmp_path, "awaits"),
                     env={"EVALSNAP_METRIC_TIMEOUT": "2"})
    assert result.code == 3, result.stderr[-3000:]
    reason = result.json["cases"][0]["metrics"]["hostile"]["reason"]
    assert "EVALSNAP_METRIC_TIMEOUT" in reason and "'hostile'" in reason


def test_sync_metrics_do_not_block_each_other(shop_copy, tmp_path):
    """A sync metric runs off the event loop: the units of one metric overlap in time."""
    (shop_copy / "hanging.py").write_text(HANGING)
    log = tmp_path / "naps.log"
    cases = ["--case", "cart_add_two_items", "--case", "weather_two_cities", "--case", "greeting_then_weather"]
    result, _ = _run(shop_copy, tmp_path, *cases, config=_metric_config(tmp_path, "naps"),
                     env={"NAP_LOG": str(log)})
    assert result.code in (0, 1), result.stderr[-3000:]
    spans = sorted(json.loads(line) for line in log.read_text().splitlines())
    assert len(spans) == 4
    assert any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:], strict=False)), spans


@pytest.mark.parametrize("table, message", [
    ({"hostile": "soon"}, "must be a number of seconds"),
    ({"hostile": 0}, "must be a number of seconds"),
    ({"unknown_metric": 3}, "names no metric under `criteria`"),
    ([3], "must be an object"),
])
def test_a_malformed_deadline_table_is_a_config_error(shop_copy, tmp_path, table, message):
    (shop_copy / "hanging.py").write_text(HANGING)
    # refused while the run is planned: in the test process (tests._cli), nothing can hang
    result, _ = _run(shop_copy, tmp_path, config=_metric_config(tmp_path, "naps", table), env={},
                     cli=run_inproc)
    assert result.code == 2, result.stderr[-3000:]
    assert message in result.stdout + result.stderr


def test_a_bad_deadline_setting_is_a_usage_error(shop_copy, tmp_path):
    result, _ = _run(shop_copy, tmp_path, env={"EVALSNAP_AGENT_CALL_TIMEOUT": "-1"})
    assert result.code == 2
    assert "EVALSNAP_AGENT_CALL_TIMEOUT" in result.stderr


# ---- a store endpoint that accepts connections and never answers ----------------------------

class _Tarpit:
    """A TCP listener on 127.0.0.1 that accepts every connection and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        self._stop = True
        self.sock.close()
        for conn in self.held:
            conn.close()


@pytest.fixture
def tarpit():
    pit = _Tarpit()
    yield pit
    pit.close()


S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
          "AWS_DEFAULT_REGION": "us-east-1", "EVALSNAP_STORE_TIMEOUT": "1"}


@pytest.mark.parametrize("command", ["ls", "run"])
def test_a_stuck_s3_endpoint_ends_within_its_deadline(shop_copy, tmp_path, tarpit, command):
    env = {**S3_ENV, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{tarpit.port}"}
    args = ["--store", "s3://evalsnap-stuck/store"]
    if command == "run":
        args = ["run", str(shop_copy), str(shop_copy / "shop.evalset.json"), *args, *CASE]
    else:
        args = ["ls", *args]
    started = time.monotonic()
    result = run_cut(*args, env=env, timeout=90)
    elapsed = time.monotonic() - started
    assert result.code == 2, (result.stdout[-2000:], result.stderr[-3000:])
    assert "got no answer within" in result.stderr and "EVALSNAP_STORE_TIMEOUT" in result.stderr
    assert tarpit.held, "the CLI never connected to the endpoint"
    assert elapsed < 60, elapsed
