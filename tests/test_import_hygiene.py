"""Issue 26 item 5: importing evalsnap changes nothing; the start-up tricks run from the CLI's
``main`` only; the Python API leaves the caller's logging alone.

Each check runs in a fresh interpreter, since the test process has imported everything long
ago. What "nothing" means: no stand-in modules in ``sys.modules`` (evalsnap's deferred
modules, or ``None`` entries that block an import), no thread, no child process, and the
environment, warning filters, signal handlers and loggers as they were.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT

STATE = r"""
import json, logging, os, signal, sys, threading, warnings

import psutil

def state():
    blocked = sorted(n for n, m in sys.modules.items() if m is None)
    standins = sorted(n for n, m in sys.modules.items()
                      if m is not None and type(m).__name__ == "DeferredModule")
    adk = logging.getLogger("google_adk")
    flow_runs = logging.getLogger("prefect.flow_runs")
    return {
        "blocked": blocked, "standins": standins,
        "threads": sorted(t.name for t in threading.enumerate()),
        "children": [" ".join(p.cmdline()[:3]) for p in psutil.Process().children(recursive=True)],
        "environ": dict(os.environ),
        "warnings": [repr(f) for f in warnings.filters],
        "signals": {s.name: repr(signal.getsignal(s)) for s in
                    (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)},
        "loggers": {"google_adk": [adk.level, [type(f).__name__ for f in adk.filters]],
                    "prefect.flow_runs": [flow_runs.level, [
                        type(f).__name__ for f in flow_runs.filters
                        if type(f).__module__.startswith("evalsnap")]]},
        "experimental_muted": any("EXPERIMENTAL" in repr(f) for f in warnings.filters),
        "meta_path": [type(f).__name__ for f in sys.meta_path],
    }
"""

IMPORTS = STATE + r"""
sys.argv = ["evalsnap", "run", "agent", "evalset.json"]  # `import evalsnap.cli` once started a server here
before = state()
import evalsnap, evalsnap.api, evalsnap.testing, evalsnap.cli
import evalsnap.cli.signals, evalsnap.startup, evalsnap.exitcodes
import time
time.sleep(1.0)  # a thread or process started in the background would be up by now
after = state()
print(json.dumps({"before": before, "after": after}))
"""


def _fresh(code: str, *args: str, timeout: float = 300) -> dict:
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _changes(before: dict, after: dict) -> dict:
    changed = {key: (before[key], after[key]) for key in before if before[key] != after[key]}
    if "environ" in changed:
        b, a = before["environ"], after["environ"]
        changed["environ"] = {k: (b.get(k), a.get(k)) for k in set(b) | set(a) if b.get(k) != a.get(k)}
    return changed


def test_importing_evalsnap_its_api_and_testing_helper_changes_nothing():
    seen = _fresh(IMPORTS)
    after = seen["after"]
    assert after["standins"] == [], "stand-in modules in sys.modules after import"
    assert after["children"] == [], "a process was started on import"
    assert after["threads"] == ["MainThread"], "a thread was started on import"
    # everything else as it was: no `None` entries, environment, filters, handlers, loggers
    assert _changes(seen["before"], after) == {}


def test_the_cli_main_still_runs_the_start_up_tricks(tmp_path):
    """The deferral moved from ``import evalsnap`` to ``main``: the command line keeps it."""
    probe = STATE + r"""
import atexit
atexit.register(lambda: print(json.dumps(state())))  # main runs the exit handlers, then leaves
sys.argv = ["evalsnap", *sys.argv[1:]]
from evalsnap.cli import main
main()
"""
    proc = subprocess.run([sys.executable, "-c", probe, "ls", "--store", str(tmp_path / "s")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"pandas", "vertexai", "rouge_score.rouge_scorer"} <= set(seen["standins"])
    assert seen["environ"]["PREFECT_LOGGING_LEVEL"]  # Prefect's defaults, set by main
    assert seen["signals"]["SIGHUP"] != "<Handlers.SIG_DFL: 0>"  # main handles SIGHUP too


API_CALL = STATE + r"""
import prefect, flows.evaluate, flows.rescore  # Prefect's own import-time set-up comes first
logging.getLogger("google_adk").setLevel(logging.DEBUG)  # the caller's choice
before = state()
import evalsnap
result = evalsnap.evaluate(sys.argv[1], sys.argv[2], store=sys.argv[3], cases=["weather_paris"],
                           metrics=["tool_trajectory_avg_score"])
after = state()
print(json.dumps({"before": before, "after": after, "exit_code": result.exit_code}))
"""


def test_the_python_api_leaves_the_callers_logging_and_process_alone(shop_copy, tmp_path):
    seen = _fresh(API_CALL, str(shop_copy), str(shop_copy / "shop.evalset.json"),
                  str(tmp_path / "s"))
    assert seen["exit_code"] in (0, 1, 3)
    changes = _changes(seen["before"], seen["after"])
    # What the libraries a run imports do themselves: Prefect's worker threads and its
    # ephemeral-free API client, and the warning filters scipy and others add on import.
    for key in ("threads", "children", "warnings"):
        changes.pop(key, None)
    # ADK's optional a2a import, marked missing when an agent is loaded (evalsnap/adk/agent.py
    # calls startup.remember_missing(); to move to the CLI's start-up: see the report).
    if changes.get("blocked") == ([], ["google.adk.agents.remote_a2a_agent"]):
        del changes["blocked"]
    assert changes == {}, changes
    assert seen["after"]["loggers"]["google_adk"] == [10, []]
    assert seen["after"]["standins"] == []
