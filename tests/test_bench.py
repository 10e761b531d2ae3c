"""The benchmark runner works (numbers come from `python -m bench`, never from tests)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT


def test_bench_runner_works_at_n30(tmp_path: Path):
    out = tmp_path / "RESULTS.md"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--sizes", "30", "--reps", "1", "--scenarios", "3",
         "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = out.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| 3 | 30 |"))
    # scenario 3: a --reuse rerun with nothing changed makes no model call at all
    assert '"agent_calls": 0' in row and '"judge_calls": 0' in row
    assert "×" in row  # a ratio against ADK's cold run from the same invocation
    assert re.search(r"commit [0-9a-f]{7,}", text)  # results say what code they measured


def test_regenerating_keeps_the_reading_around_the_generated_block(tmp_path):
    from bench.__main__ import BEGIN, END, merge

    out = tmp_path / "RESULTS.md"
    assert merge(out, "table v1\n") == f"{BEGIN}\ntable v1\n{END}\n"
    out.write_text(f"# title\n\n{BEGIN}\ntable v1\n{END}\n\nreading\n")
    assert merge(out, "table v2\n") == f"# title\n\n{BEGIN}\ntable v2\n{END}\nreading\n"


def test_bench_runs_evalsnap_against_its_own_prefect_server(tmp_path: Path):
    out = tmp_path / "RESULTS.md"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--sizes", "30", "--reps", "1", "--scenarios", "3",
         "--api", "server", "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
        timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = out.read_text()
    assert "a running `prefect server` on 127.0.0.1 started by the runner" in text
    row = next(line for line in text.splitlines() if line.startswith("| 3 | 30 |"))
    assert '"agent_calls": 0' in row and '"judge_calls": 0' in row
    from tests.test_cli_process import _processes_with

    assert _processes_with("evalsnap-bench-prefect-") == []  # the server was stopped
