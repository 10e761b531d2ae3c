"""Issue 21 item 4: contracts under hostile user code, through the real CLI."""

from __future__ import annotations

import json
import shutil
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests._cli import run_inproc
from tests.conftest import CliResult, run_cli

PRINTING = textwrap.dedent('''
    import os
    import sys

    from google.adk.evaluation.evaluator import EvalStatus, EvaluationResult, PerInvocationResult


    def prints(metric, actual, expected, scenario):
        print("NOISE FROM A METRIC")
        sys.stdout.write("MORE NOISE\\n")
        os.write(1, b"RAW NOISE ON FD 1\\n")
        rows = [PerInvocationResult(actual_invocation=inv, score=1.0,
                                    eval_status=EvalStatus.PASSED) for inv in actual]
        return EvaluationResult(overall_score=1.0, overall_eval_status=EvalStatus.PASSED,
                                per_invocation_results=rows)
''')


def test_json_stdout_is_one_object_whatever_a_metric_prints(shop_copy: Path, tmp_path: Path):
    (shop_copy / "printing_metrics.py").write_text(PRINTING)
    config = tmp_path / "test_config.json"
    config.write_text(json.dumps({
        "criteria": {"noisy": 0.5, "response_match_score": 0.5},
        "customMetrics": {"noisy": {"codeConfig": {"name": "shop_agent.printing_metrics.prints"},
                                    "version": "1"}}}))
    cases = ["--case", "weather_paris", "--case", "cart_add_two_items"]

    agents = [shop_copy, tmp_path / "agents2" / "shop_agent"]
    shutil.copytree(shop_copy, agents[1])

    def run(i: int, env: dict[str, str]) -> CliResult:
        return run_cli("run", str(agents[i]), str(agents[i] / "shop.evalset.json"),
                       "--config", str(config), "--store", str(tmp_path / f"s{i}"), "--json",
                       *cases, env=env)

    # in the CLI's process, and in the scoring process Prefect's process pool starts: two
    # CLI processes at once (each its own agent copy and store: both score every unit),
    # their start-ups overlapping
    envs = ({}, {"EVALSNAP_SCORE_POOL_MIN_UNITS": "1", "EVALSNAP_SCORE_PROCESSES": "1"})
    with ThreadPoolExecutor(len(envs)) as pool:
        results = list(pool.map(run, range(len(envs)), envs))
    for result in results:
        assert result.code == 0, result.stderr[-3000:]
        assert result.json["passed"]  # exactly one JSON line on stdout
        for noise in ("NOISE FROM A METRIC", "MORE NOISE", "RAW NOISE ON FD 1"):
            assert noise not in result.stdout and noise in result.stderr


EXITING = textwrap.dedent('''
    import os
    import time


    def exits(metric, actual, expected, scenario):
        os._exit(7)


    def sleeps(metric, actual, expected, scenario):
        time.sleep(60)
''')
POOL = {"EVALSNAP_SCORE_POOL_MIN_UNITS": "1", "EVALSNAP_SCORE_PROCESSES": "1"}


def _config(tmp_path: Path, fn: str) -> Path:
    # three code metrics: the second scores in the scoring process (tasks.score.run_scoring)
    config = tmp_path / f"{fn}.json"
    config.write_text(json.dumps({
        "criteria": {"response_match_score": 0.5, "hostile": 0.5, "tool_trajectory_avg_score": 1.0},
        "customMetrics": {"hostile": {"codeConfig": {"name": f"shop_agent.exiting_metrics.{fn}"},
                                      "version": "1"}}}))
    return config


def test_os_exit_in_a_scoring_process_is_that_metrics_not_evaluated(shop_copy: Path,
                                                                     tmp_path: Path):
    (shop_copy / "exiting_metrics.py").write_text(EXITING)
    store = str(tmp_path / "s")
    result = run_cli("run", str(shop_copy), str(shop_copy / "shop.evalset.json"), "--config",
                     str(_config(tmp_path, "exits")), "--store", store, "--json",
                     "--case", "weather_paris", env=POOL)
    assert result.code == 3, result.stderr[-3000:]
    metrics = result.json["cases"][0]["metrics"]
    assert metrics["hostile"]["status"] == "NOT_EVALUATED"
    assert "scoring process ended" in metrics["hostile"]["reason"]
    assert {metrics[m]["status"] for m in ("response_match_score", "tool_trajectory_avg_score")} \
        == {"PASSED"}
    shown = run_inproc("show", result.json["record_id"], "--store", store, "--json")
    assert shown.code == 0


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def test_a_killed_cli_leaves_no_scoring_process(shop_copy: Path, tmp_path: Path):
    import os
    import signal
    import subprocess
    import sys
    import time

    (shop_copy / "exiting_metrics.py").write_text(EXITING)
    proc = subprocess.Popen(
        [sys.executable, "-m", "evalsnap.cli", "run", str(shop_copy),
         str(shop_copy / "shop.evalset.json"), "--config", str(_config(tmp_path, "sleeps")),
         "--store", str(tmp_path / "s"), "--case", "weather_paris", "--json"],
        env={**os.environ, **POOL}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        children: list[int] = []
        while time.monotonic() < deadline and not children:
            children = [c for c in _children(proc.pid)
                        if b"multiprocessing" in Path(f"/proc/{c}/cmdline").read_bytes()]
            time.sleep(0.2)
        assert children, "the run started no scoring process"
        time.sleep(3)  # the scoring process is in its initializer or the sleeping metric
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(Path(f"/proc/{c}").exists() for c in children):
            time.sleep(0.2)
        alive = [c for c in children if Path(f"/proc/{c}").exists()
                 and "Z" not in Path(f"/proc/{c}/stat").read_text().rsplit(")", 1)[1][:3]]
        assert not alive, f"scoring processes {alive} outlived the killed CLI"
    finally:
        if proc.poll() is None:
            proc.kill()
