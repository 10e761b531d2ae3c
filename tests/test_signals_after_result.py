"""Issue 29 item 16: once the result is printed, the exit code is the result's; SIGHUP is
handled like SIGTERM (exit 129, with the "stopping" message).

The CLI runs as a terminal starts it (its own process group). To make "just after the JSON
was printed" a window a test can hit every time, the agent package registers an exit
handler that sleeps: the CLI's ``main`` runs exit handlers after printing the result.
"""

from __future__ import annotations

import json
import signal
import time

import pytest

from tests.test_signals import _hanging_config, _start, _stopped, _wait_for

SLOW_EXIT = """
import atexit, os, pathlib, time

def _slow_exit():
    pathlib.Path(os.environ["EXIT_MARK"]).write_text("exiting")
    time.sleep(8)

atexit.register(_slow_exit)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT],
                         ids=lambda s: signal.Signals(s).name)
def test_a_signal_after_the_json_was_printed_exits_with_the_printed_code(shop_copy, tmp_path, sig):
    with (shop_copy / "__init__.py").open("a") as init:
        init.write(SLOW_EXIT)
    mark = tmp_path / "exiting"
    proc = _start(["run", str(shop_copy), str(shop_copy / "shop.evalset.json"),
                   "--store", str(tmp_path / "s"), "--json",
                   # one case and one metric, left NOT_EVALUATED there: incomplete, exit 3
                   "--case", "out_of_scope_flight", "--metric", "final_state_match"],
                  {"EXIT_MARK": str(mark)})
    assert proc.stdout is not None
    line = proc.stdout.readline()  # the one JSON object, printed before the exit handlers
    printed = json.loads(line)
    _wait_for(mark.exists, 60, proc)  # in the exit handlers now: the result is printed
    elapsed, stderr, left = _stopped(proc, sig, group=False)
    assert proc.returncode == printed["exit_code"] == 3, stderr[-3000:]
    assert elapsed < 6, f"waited for the exit handler ({elapsed:.1f} s)"
    assert f"{signal.Signals(sig).name} received after the result was printed" in stderr
    assert "Traceback" not in stderr and not left


def test_sighup_stops_a_run_like_sigterm(shop_copy, tmp_path):
    """A closed terminal (SIGHUP) during a run stuck in a metric: stopped, 129, the message."""
    mark = tmp_path / "mark"
    store = tmp_path / "s"
    proc = _start(["run", str(shop_copy), str(shop_copy / "shop.evalset.json"), "--config",
                   str(_hanging_config(shop_copy, tmp_path)), "--store", str(store),
                   "--case", "weather_paris", "--case", "weather_two_cities"],
                  {"HANG_MARK": str(mark)})
    _wait_for(mark.exists, 120, proc)
    started = time.monotonic()
    elapsed, stderr, left = _stopped(proc, signal.SIGHUP, group=False)
    assert proc.returncode == 129, stderr[-3000:]
    assert elapsed < 15 and time.monotonic() - started < 20 and not left, (elapsed, left)
    assert "SIGHUP received" in stderr and "stopping the run" in stderr
    assert "nothing was published" in stderr and "Traceback" not in stderr
    assert not list((store / "v1" / "refs" / "runs").glob("*"))
