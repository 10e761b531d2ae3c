"""Issue 21 item 2: SIGINT and SIGTERM stop a run within seconds, whatever it is doing.

The CLI is started as a terminal starts it: its own process group, SIGINT at its default
disposition; Ctrl-C is SIGINT to the whole group (``os.killpg``), ``kill`` is SIGTERM to the
PID. Each test checks the exit code, the time to exit, that no child process is left, what
the last message says, and what the store holds afterwards.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests._cli import run_inproc

HANGS = textwrap.dedent('''
    import os
    import time
    from pathlib import Path

    from google.adk.evaluation.evaluator import EvalStatus, EvaluationResult, PerInvocationResult


    def hangs_on_tokyo(metric, actual, expected, scenario):
        text = " ".join(p.text or "" for inv in actual for p in inv.user_content.parts)
        if "Tokyo" in text:
            Path(os.environ["HANG_MARK"]).write_text("in the metric")
            time.sleep(600)
        rows = [PerInvocationResult(actual_invocation=inv, score=1.0,
                                    eval_status=EvalStatus.PASSED) for inv in actual]
        return EvaluationResult(overall_score=1.0, overall_eval_status=EvalStatus.PASSED,
                                per_invocation_results=rows)
''')


def _descendants(pid: int) -> set[int]:
    import psutil

    try:
        return {p.pid for p in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return set()


def _alive(pids: set[int]) -> set[int]:
    import psutil

    out = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.add(pid)
        except psutil.Error:
            pass
    return out


def _start(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "evalsnap.cli", *args],
                            env={**os.environ, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, process_group=0)


def _wait_for(predicate, seconds: float, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            pytest.fail(f"the run ended early ({proc.returncode}): {proc.communicate()[1][-3000:]}")
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"not reached in {seconds} s: {proc.communicate()[1][-3000:]}")


def _stopped(proc: subprocess.Popen[str], sig: int, *, group: bool) -> tuple[float, str, set[int]]:
    children = _descendants(proc.pid)
    started = time.monotonic()
    if group:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    try:
        _, stderr = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"still running 30 s after {signal.Signals(sig).name}")
    elapsed = time.monotonic() - started
    time.sleep(0.5)
    return elapsed, stderr, _alive(children)


def _hanging_config(shop: Path, tmp_path: Path) -> Path:
    (shop / "hanging.py").write_text(HANGS)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "criteria": {"response_match_score": 0.5, "hangs": 0.5},
        "customMetrics": {"hangs": {"codeConfig": {"name": "shop_agent.hanging.hangs_on_tokyo"},
                                    "version": "1"}}}))
    return config


@pytest.mark.parametrize("sig, group, pool", [
    (signal.SIGINT, True, True),     # Ctrl-C in a terminal, metric in a scoring process
    (signal.SIGTERM, False, False),  # `kill PID`, metric on a thread of the CLI's process
], ids=["ctrl-c-group", "sigterm-pid"])
def test_a_run_stuck_in_a_metric_stops_within_seconds(shop_copy, tmp_path, sig, group, pool):
    mark = tmp_path / "mark"
    store = tmp_path / "s"
    env = {"HANG_MARK": str(mark)}
    if pool:
        env.update(EVALSNAP_SCORE_POOL_MIN_UNITS="1", EVALSNAP_SCORE_PROCESSES="1")
    args = ["run", str(shop_copy), str(shop_copy / "shop.evalset.json"), "--config",
            str(_hanging_config(shop_copy, tmp_path)), "--store", str(store),
            "--case", "weather_paris", "--case", "weather_two_cities"]
    proc = _start(args, env)
    _wait_for(mark.exists, 120, proc)
    elapsed, stderr, left = _stopped(proc, sig, group=group)
    assert proc.returncode == {signal.SIGINT: 130, signal.SIGTERM: 143}[sig], stderr[-3000:]
    assert elapsed < 15, elapsed
    assert not left, f"child processes {left} outlived the CLI"
    assert f"{signal.Signals(sig).name} received" in stderr
    assert "nothing was published" in stderr and "Traceback" not in stderr
    assert not list((store / "v1" / "refs" / "runs").glob("*"))  # no run manifest
    # what was finished is kept: a --reuse rerun without the hanging metric calls no agent
    rerun = run_inproc("run", str(shop_copy), str(shop_copy / "shop.evalset.json"), "--store",
                       str(store), "--case", "weather_paris", "--case", "weather_two_cities",
                       "--metric", "response_match_score", "--reuse", "--json")
    assert rerun.code in (0, 1), rerun.stderr[-3000:]
    assert rerun.json["agent_calls"] == 0
    assert run_inproc("verify", "--store", str(store)).code == 0


def test_the_message_names_what_was_published_before_the_signal(shop_copy, tmp_path):
    """Two eval sets: the first is published, the second hangs in a metric; Ctrl-C."""
    mark = tmp_path / "mark"
    store = tmp_path / "s"
    other = shop_copy / "other.evalset.json"
    data = json.loads((shop_copy / "shop.evalset.json").read_text())
    other.write_text(json.dumps({**data, "eval_set_id": "shop_other"}))
    proc = _start(["run", str(shop_copy), f"{shop_copy / 'shop.evalset.json'}:weather_paris",
                   f"{other}:weather_two_cities", "--config",
                   str(_hanging_config(shop_copy, tmp_path)), "--store", str(store)],
                  {"HANG_MARK": str(mark)})
    _wait_for(mark.exists, 120, proc)
    elapsed, stderr, left = _stopped(proc, signal.SIGINT, group=True)
    assert proc.returncode == 130 and elapsed < 15 and not left, stderr[-3000:]
    listed = run_inproc("ls", "--store", str(store), "--json")
    runs = [json.loads(line) for line in listed.stdout.splitlines() if line.strip()]
    published = [line for line in stderr.splitlines() if "was published before the stop" in line]
    assert len(published) == 1 and "'shop'" in published[0], stderr[-3000:]
    assert "the rest of the run was not published" in stderr
    assert runs and all(r["eval_set_id"] == "shop" for r in runs if "eval_set_id" in r), runs


def test_sigint_during_inference_stops_at_once(shop_copy, tmp_path):
    """60 cases with slow agent calls (the issue's reproduction): Ctrl-C after a few seconds."""
    store = tmp_path / "s"
    data = json.loads((shop_copy / "shop.evalset.json").read_text())
    cases = [{**c, "eval_id": f"{c['eval_id']}_{i}"} for i in range(5) for c in data["eval_cases"]]
    many = shop_copy / "many.evalset.json"
    many.write_text(json.dumps({**data, "eval_set_id": "many", "eval_cases": cases[:60]}))
    proc = _start(["run", str(shop_copy), str(many), "--store", str(store)],
                  {"EVALSNAP_DEMO_AGENT_LATENCY_MS": "2000"})
    _wait_for(lambda: (store / "v1" / "objects").exists(), 120, proc)
    time.sleep(2)
    elapsed, stderr, left = _stopped(proc, signal.SIGINT, group=True)
    assert proc.returncode == 130, stderr[-3000:]
    assert elapsed < 15 and not left, (elapsed, left)
    assert "nothing was published" in stderr and "internal error" not in stderr
