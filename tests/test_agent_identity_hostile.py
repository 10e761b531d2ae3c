"""Issue 29 items 2-4: hostile agent tools fail only their own case.

``tests/fixtures/identity_agents/hostile``: tools that call ``sys.exit``, raise
``KeyboardInterrupt``, ``SystemExit`` from a coroutine, a ``BaseException`` subclass, or
never return. Each fails its case's inference (exit 3, a published record); the good case
passes; a blocking sync tool cannot defeat ``EVALSNAP_INFERENCE_TIMEOUT``.

The runs are CLI processes of their own (an exit or an interrupt must not end the process, a
stuck tool's thread must not keep it, a tool's child must not outlive it), two of them: the
exiting tools with ``sys.exit(0)`` beside the spawning tools, and with ``sys.exit(9)`` beside
the tool that never returns (two eval sets per run, one record each). Reading the records is
the CLI in the test process (:mod:`tests._cli`).
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._cli import run_inproc
from tests.conftest import CliResult, copy_agent, run_cli

FIXTURE = Path(__file__).parent / "fixtures" / "identity_agents" / "hostile"
NO_RETRY = {"EVALSNAP_RETRIES": "0"}
HOSTILE = {"echo_tool": "success", "exit_tool": "failure", "interrupt_tool": "failure",
           "async_exit_tool": "failure", "weird_tool": "failure"}


def _copy(base: Path) -> Path:
    return copy_agent(FIXTURE, base / "agents" / "hostile")


def _by_case(out: dict[str, Any]) -> dict[str, str]:
    return {c["eval_id"]: c["inference"] for c in out["cases"]}


def _sleepers(marker: str) -> list[int]:
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if len(cmdline) >= 2 and cmdline[0].endswith("sleep") and cmdline[1].startswith(marker):
            found.append(proc.pid)
    return found


def _errors(store: Path, record_id: str) -> dict[str, str]:
    shown = run_inproc("show", record_id, "--store", str(store), "--json")
    assert shown.code in (0, 3), shown.stderr[-2000:]
    return {c["eval_id"]: c["inference"]["error"] for c in shown.json["cases"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """``exit_code -> (result, {eval set id: run}, store, extra)`` for the two runs."""
    base = tmp_path_factory.mktemp("hostile")
    agent, store = _copy(base), base / "store"
    marker = f"9{random.randint(10_000, 99_999)}"
    found: dict[str, Any] = {}
    try:
        result = run_cli("run", str(agent), str(agent / "hostile.evalset.json"),
                         str(agent / "spawning.evalset.json"), "--store", str(store), "--json",
                         env={**NO_RETRY, "HOSTILE_EXIT_CODE": "0", "HOSTILE_SLEEP": marker})
        found["0"] = (result, store, {"sleepers": _sleepers(marker)})  # just after the run
        started = time.monotonic()
        result = run_cli("run", str(agent), str(agent / "hostile.evalset.json"),
                         str(agent / "hanging.evalset.json"), "--store", str(store), "--json",
                         env={**NO_RETRY, "HOSTILE_EXIT_CODE": "9",
                              "EVALSNAP_INFERENCE_TIMEOUT": "10"}, timeout=240)
        found["9"] = (result, store, {"elapsed": time.monotonic() - started})
        yield found
    finally:
        for pid in _sleepers(marker):
            os.kill(pid, signal.SIGKILL)


def _runs(result: CliResult) -> dict[str, dict[str, Any]]:
    assert result.code == 3, (result.stdout[-2000:], result.stderr[-3000:])
    return {r["eval_set_id"]: r for r in result.json["runs"]}


@pytest.mark.parametrize("exit_code", ["0", "9"])
def test_exiting_and_interrupting_tools_fail_only_their_case(runs: dict[str, Any],
                                                             exit_code: str) -> None:
    result, store, _ = runs[exit_code]
    out = _runs(result)["hostile"]
    assert _by_case(out) == HOSTILE and out["exit_code"] == 3
    errors = _errors(store, out["record_id"])
    assert "SystemExit" in errors["exit_tool"] and "KeyboardInterrupt" in errors["interrupt_tool"]
    assert "SystemExit" in errors["async_exit_tool"] and "Weird" in errors["weird_tool"]


def test_a_sync_tool_that_never_returns_cannot_defeat_the_inference_deadline(
        runs: dict[str, Any]) -> None:
    result, store, extra = runs["9"]
    out = _runs(result)["hanging"]
    assert _by_case(out) == {"hang_tool": "failure", "echo_tool": "success"}
    errors = _errors(store, out["record_id"])
    assert "EVALSNAP_INFERENCE_TIMEOUT" in errors["hang_tool"]
    assert extra["elapsed"] < 150  # the tool sleeps 900 s: the run did not wait for it


def test_processes_a_tool_started_do_not_outlive_the_run(runs: dict[str, Any]) -> None:
    """Issue 29 item 15: a plain child and a detached one (setsid, parent shell gone)."""
    result, _, extra = runs["0"]
    out = _runs(result)["spawning"]
    assert out["exit_code"] == 0, out
    assert _by_case(out) == {"spawn_tool": "success", "detach_tool": "success"}
    assert extra["sleepers"] == []
