"""Issue 29 items 2-4: hostile agent tools fail only their own case.

``tests/fixtures/identity_agents/hostile``: tools that call ``sys.exit``, raise
``KeyboardInterrupt``, ``SystemExit`` from a coroutine, a ``BaseException`` subclass, or
never return. Each fails its case's inference (exit 3, a published record); the good case
passes; a blocking sync tool cannot defeat ``EVALSNAP_INFERENCE_TIMEOUT``.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_cli

FIXTURE = Path(__file__).parent / "fixtures" / "identity_agents" / "hostile"
NO_RETRY = {"EVALSNAP_RETRIES": "0"}


def _copy(base: Path) -> Path:
    dst = base / "agents" / "hostile"
    shutil.copytree(FIXTURE, dst, ignore=shutil.ignore_patterns("__pycache__", ".adk"))
    return dst


def _by_case(out: dict[str, Any]) -> dict[str, str]:
    return {c["eval_id"]: c["inference"] for c in out["cases"]}


@pytest.mark.parametrize("exit_code", ["0", "9"])
def test_exiting_and_interrupting_tools_fail_only_their_case(tmp_path: Path,
                                                             exit_code: str) -> None:
    agent, store = _copy(tmp_path), tmp_path / "store"
    result = run_cli("run", str(agent), str(agent / "hostile.evalset.json"), "--store",
                     str(store), "--json", env={**NO_RETRY, "HOSTILE_EXIT_CODE": exit_code})
    assert result.code == 3, (result.stdout[-2000:], result.stderr[-3000:])
    out = result.json
    assert _by_case(out) == {"echo_tool": "success", "exit_tool": "failure",
                             "interrupt_tool": "failure", "async_exit_tool": "failure",
                             "weird_tool": "failure"}
    shown = run_cli("show", out["record_id"], "--store", str(store), "--json")
    assert shown.code == 3 or shown.code == 0, shown.stderr[-2000:]
    errors = {c["eval_id"]: c["inference"]["error"] for c in shown.json["cases"]}
    assert "SystemExit" in errors["exit_tool"] and "KeyboardInterrupt" in errors["interrupt_tool"]
    assert "SystemExit" in errors["async_exit_tool"] and "Weird" in errors["weird_tool"]


def test_a_sync_tool_that_never_returns_cannot_defeat_the_inference_deadline(
        tmp_path: Path) -> None:
    agent, store = _copy(tmp_path), tmp_path / "store"
    started = time.monotonic()
    result = run_cli("run", str(agent), str(agent / "hanging.evalset.json"), "--store",
                     str(store), "--json", env={**NO_RETRY, "EVALSNAP_INFERENCE_TIMEOUT": "10"},
                     timeout=240)
    elapsed = time.monotonic() - started
    assert result.code == 3, (result.stdout[-2000:], result.stderr[-3000:])
    assert _by_case(result.json) == {"hang_tool": "failure", "echo_tool": "success"}
    shown = run_cli("show", result.json["record_id"], "--store", str(store), "--json").json
    (hung,) = [c for c in shown["cases"] if c["eval_id"] == "hang_tool"]
    assert "EVALSNAP_INFERENCE_TIMEOUT" in hung["inference"]["error"]
    assert elapsed < 150  # the tool sleeps 900 s: the run did not wait for it


def _sleepers(marker: str) -> list[int]:
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if len(cmdline) >= 2 and cmdline[0].endswith("sleep") and cmdline[1].startswith(marker):
            found.append(proc.pid)
    return found


def test_processes_a_tool_started_do_not_outlive_the_run(tmp_path: Path) -> None:
    """Issue 29 item 15: a plain child and a detached one (setsid, parent shell gone)."""
    import random

    agent, store = _copy(tmp_path), tmp_path / "store"
    marker = f"9{random.randint(10_000, 99_999)}"
    result = run_cli("run", str(agent), str(agent / "spawning.evalset.json"), "--store",
                     str(store), "--json", env={**NO_RETRY, "HOSTILE_SLEEP": marker})
    try:
        assert result.code == 0, (result.stdout[-2000:], result.stderr[-3000:])
        assert _by_case(result.json) == {"spawn_tool": "success", "detach_tool": "success"}
        assert _sleepers(marker) == []
    finally:
        import os
        import signal

        for pid in _sleepers(marker):
            os.kill(pid, signal.SIGKILL)
