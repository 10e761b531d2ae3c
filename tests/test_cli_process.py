"""The CLI as a process of its own: Prefect's temporary API, output and a clean exit.

Every other CLI test talks to the session's ``prefect server``; this one leaves
``PREFECT_API_URL`` unset, as the README's demo does, so the CLI starts and stops its own
temporary API.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests._cli import run_inproc
from tests.conftest import ROOT, copy_shop, run_cli


def _processes_with(marker: str) -> list[int]:
    """PIDs whose environment holds ``marker`` (children inherit the CLI's environment)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker.encode() in environ:
            found.append(int(entry.name))
    return found


def test_run_on_the_temporary_api_prints_everything_and_leaves_no_process(tmp_path: Path):
    agent = copy_shop(tmp_path / "shop_agent")
    marker = f"EVALSNAP_TEST_MARK={uuid.uuid4().hex}"
    env = {"PREFECT_API_URL": "", "PREFECT_HOME": str(tmp_path / "prefect-home"),
           marker.split("=")[0]: marker.split("=")[1]}
    # two of the demo's cases (what is checked is the process, not the count): a passing one
    # and one designed to fail
    result = run_cli("run", str(agent), str(agent / "shop.evalset.json"), "--store",
                     str(tmp_path / "store"), "--json", "--case", "weather_paris", "--case",
                     "out_of_scope_flight", env=env)
    assert result.code == 3, result.stderr[-3000:]  # the demo has cases designed to fail
    summary = result.json  # exactly one complete JSON line, flushed before the fast exit
    assert summary["exit_code"] == 3 and summary["agent_calls"] > 0
    assert (tmp_path / "prefect-home" / "prefect.db").exists()  # its own API, not the tests'
    assert _processes_with(marker) == []  # the temporary API was stopped
    # ... and nothing links it: the report links no flow run on a server that is gone
    page = tmp_path / "store" / "v1" / "refs" / "reports" / (
        summary["record_id"].removeprefix("sha256:") + ".html")
    assert 'data-field="duration"' in page.read_text("utf-8")
    assert 'data-link="flow-run"' not in page.read_text("utf-8")

    # the record is there for a later call (`show` reads the store only: it is no flow
    # command, it starts no API, so it runs in the test process)
    shown = run_inproc("show", summary["record_id"], "--store", str(tmp_path / "store"),
                       "--json")
    assert shown.code == 0 and shown.json["record_id"] == summary["record_id"]


def test_usage_errors_keep_their_exit_code_and_message(tmp_path: Path):
    result = run_cli("run", str(tmp_path / "missing"), str(tmp_path / "x.evalset.json"),
                     env={"PREFECT_API_URL": "", "PREFECT_HOME": str(tmp_path / "home")})
    assert result.code == 2
    assert "error:" in result.stderr
    assert os.environ.get("PREFECT_API_URL")  # the session's server is untouched


def test_a_cli_killed_mid_run_leaves_no_process_behind(tmp_path: Path):
    """SIGKILL runs no exit handler: the temporary API goes with the CLI because the kernel
    signals it when its parent dies (Linux PR_SET_PDEATHSIG)."""
    if sys.platform != "linux":
        pytest.skip("parent-death signals are Linux-only")
    agent = copy_shop(tmp_path / "shop_agent")
    marker = uuid.uuid4().hex
    env = {**os.environ, "PREFECT_API_URL": "", "PREFECT_HOME": str(tmp_path / "home"),
           "EVALSNAP_TEST_MARK": marker}
    proc = subprocess.Popen([sys.executable, "-m", "evalsnap.cli", "run", str(agent),
                             str(agent / "shop.evalset.json"), "--store",
                             str(tmp_path / "store")], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        # the temporary API is up
        while len(set(_processes_with(marker)) - {proc.pid}) < 1:
            assert proc.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "the temporary API never ran"
            time.sleep(0.1)
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 30
    while _processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_with(marker) == []
