"""Issue 9: a run killed with SIGKILL midway resumes with ``--reuse`` and loses nothing.

For each backend (local disk, S3 on moto) one module-scoped scenario:

1. ``evalsnap run`` with simulated agent latency starts in its own process group and is
   killed (SIGKILL to the whole group) as soon as some inference is indexed in the store.
2. What the killed run left must be sound: no object under its final name is partial (every
   well-named object re-hashes and parses), and no run manifest was published.
3. ``evalsnap run … --reuse --json`` (in the test process: :mod:`tests._cli`) completes;
   it reuses exactly the inferences indexed before the kill and calls the agent only for the
   others (``agent_calls`` equals those cases' calls in an uninterrupted run); its scores
   equal the uninterrupted run's.
4. ``evalsnap verify`` passes.

The uninterrupted reference run (no latency) is shared by both backends.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from evalsnap.reports.verify import verify_store
from storage import Store
from tests._cli import run_inproc, score_status
from tests.conftest import ROOT, CliResult, copy_shop
from tests.servers import Server, moto_with_bucket

CASES = ["weather_paris", "weather_two_cities", "cart_add_two_items", "cart_add_then_show",
         "greeting_then_weather", "cart_add_wrong_trajectory"]
CONFIG = {"criteria": {"tool_trajectory_avg_score": 1.0, "response_match_score": 0.5,
                       "final_state_match": 1.0}}
LATENCY_MS = "400"
BUCKET = "evalsnap-kill"
S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
          "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
          "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}


def _case_args() -> list[str]:
    return [a for c in CASES for a in ("--case", c)]


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("kill")
    agent_dir = copy_shop(base / "agents" / "shop_agent")
    config = base / "test_config.json"
    config.write_text(json.dumps(CONFIG))
    return {"base": base, "dir": agent_dir, "evalset": agent_dir / "shop.evalset.json",
            "config": config}


def _run_args(agent: dict[str, Path], store: str) -> list[str]:
    return ["run", str(agent["dir"]), str(agent["evalset"]), "--config", str(agent["config"]),
            "--store", store, *_case_args()]


@pytest.fixture(scope="module")
def uninterrupted(agent: dict[str, Path]) -> dict[str, Any]:
    """A full run without latency: the scores and per-case agent calls to compare with."""
    store = str(agent["base"] / "reference-store")
    run = run_inproc(*_run_args(agent, store), "--json")
    assert run.code in (0, 1), run.stderr[-3000:]
    shown = run_inproc("show", run.json["run_id"], "--store", store, "--json")
    assert shown.code == 0, shown.stderr[-3000:]
    calls = {c["eval_id"]: c["inference"]["model_calls"] for c in shown.json["cases"]}
    fps = {c["eval_id"]: c["inference"]["inference_fingerprint"] for c in shown.json["cases"]}
    assert sum(calls.values()) == run.json["agent_calls"] > 0
    return {"run": run, "calls": calls, "fingerprints": fps}


@pytest.fixture(scope="module")
def moto() -> Iterator[Server]:
    with moto_with_bucket(BUCKET) as server:
        yield server


@contextmanager
def _backend(name: str, agent: dict[str, Path],
             request: pytest.FixtureRequest) -> Iterator[tuple[str, dict[str, str], Store]]:
    """(store URL, env for CLI processes, an in-process Store on the same location)."""
    if name == "local":
        url = str(agent["base"] / "store-local")
        yield url, {}, Store(url)
        return
    server: Server = request.getfixturevalue("moto")
    url = f"s3://{BUCKET}/kill-resume"
    env = {**S3_ENV, "AWS_ENDPOINT_URL": server.url}
    # the test's own looks at the bucket wait longer than a run's default 10 s: on a loaded
    # 2-core machine moto, next to the run being killed and the other test workers, once
    # took longer than that to answer the first one
    yield url, env, Store(url, {"endpoint_url": server.url, "key": "testing",
                                "secret": "testing"}, timeout=60.0)


def _kill_midway(args: list[str], env: dict[str, str], store: Store,
                 poll: float) -> dict[str, Any]:
    """Starts the run in its own process group; SIGKILLs the group once inference is indexed
    (looked for every ``poll`` seconds: on S3 each look is a request to moto)."""
    proc = subprocess.Popen([sys.executable, "-m", "evalsnap.cli", *args], cwd=ROOT,
                            env={**os.environ, **env, "EVALSNAP_DEMO_AGENT_LATENCY_MS": LATENCY_MS},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    deadline = time.monotonic() + 180
    indexed: list[str] = []
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            indexed = store.list_refs("index/inference")
            if indexed:
                break
            time.sleep(poll)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, (
        f"the run was not killed midway (exit {proc.returncode}); it finished too fast or "
        f"failed: {stderr.decode(errors='replace')[-3000:]}")
    return {"indexed_before": set(store.list_refs("index/inference")),
            "inference_objects": list(store.iter_objects("inference")),
            "runs": store.list_refs("runs")}


@pytest.fixture(scope="module", params=["local", "s3"])
def resumed(request: pytest.FixtureRequest, agent: dict[str, Path],
            uninterrupted: dict[str, Any]) -> Iterator[dict[str, Any]]:
    with _backend(request.param, agent, request) as (url, env, store):
        # a model call takes LATENCY_MS (400 ms): a look every 0.2 s on S3 still kills the
        # run with most of its inference to do
        killed = _kill_midway(_run_args(agent, url), env, store,
                              poll=0.05 if request.param == "local" else 0.2)
        after_kill = verify_store(store)
        # the kill is what needs a process; the resume runs in this one (tests._cli: it
        # starts with no memo of any run, as a new process would)
        resume = run_inproc(*_run_args(agent, url), "--reuse", "--json", env=env)
        verify = run_inproc("verify", "--store", url, env=env)
        yield {"backend": request.param, "url": url, "store": store, "killed": killed,
               "after_kill": after_kill, "resume": resume, "verify": verify}


def test_the_kill_left_only_sound_objects_and_no_manifest(resumed: dict[str, Any]) -> None:
    killed = resumed["killed"]
    assert killed["indexed_before"], "nothing was indexed before the kill"
    assert killed["runs"] == [], "a manifest was published by a run that never finished"
    # Every object under its final name hashes right and parses; a temp file of a write cut
    # short by the kill may remain (it is invisible to readers) and nothing else.
    bad = [f for f in resumed["after_kill"].findings
           if not f.location.rsplit("/", 1)[-1].startswith(".tmp-")]
    assert bad == [], bad


def test_resume_repeats_no_finished_inference(resumed: dict[str, Any],
                                              uninterrupted: dict[str, Any]) -> None:
    resume: CliResult = resumed["resume"]
    assert resume.code == uninterrupted["run"].code, resume.stderr[-3000:]
    out = resume.json
    done_before = {eval_id for eval_id, fp in uninterrupted["fingerprints"].items()
                   if fp.split(":", 1)[1] in resumed["killed"]["indexed_before"]}
    assert done_before, "no case finished before the kill"
    reused = {c["eval_id"] for c in out["cases"] if c["inference_reused"]}
    assert reused == done_before
    remaining = set(CASES) - done_before
    assert remaining, "the kill came after every inference had finished"
    assert out["agent_calls"] == sum(uninterrupted["calls"][c] for c in remaining)
    assert out["complete"] is True


def test_resume_gives_the_scores_of_an_uninterrupted_run(resumed: dict[str, Any],
                                                          uninterrupted: dict[str, Any]) -> None:
    assert score_status(resumed["resume"].json) == score_status(uninterrupted["run"].json)
    assert resumed["resume"].json["passed"] == uninterrupted["run"].json["passed"]


def test_verify_passes_after_resume(resumed: dict[str, Any]) -> None:
    verify: CliResult = resumed["verify"]
    assert verify.code == 0, verify.stdout[-2000:] + verify.stderr[-3000:]
    assert "ok: nothing wrong" in verify.stdout
    report = verify_store(resumed["store"])
    assert report.ok and report.runs == 1, report.findings
