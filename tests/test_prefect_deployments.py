"""prefect.yaml: every entrypoint loads with the parameters the UI shows, and the rerun
deployment runs end to end through a real server, a process work pool and a worker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import EVALSET, ROOT

PREFECT = str(Path(sys.executable).parent / "prefect")
EXPECTED = {
    "nightly-eval": {"agent_dir", "evalset", "config", "store", "reuse"},
    "rerun": {"run_or_snapshot", "evalset", "config", "reuse", "force", "metrics", "cases"},
}


def _deployments() -> list[dict]:
    return yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]


def test_every_entrypoint_loads_with_its_parameters(monkeypatch):
    from prefect.flows import Flow, load_flow_from_entrypoint

    monkeypatch.chdir(ROOT)
    deployments = {d["name"]: d for d in _deployments()}
    assert set(EXPECTED) <= set(deployments)
    for name, deployment in deployments.items():
        flow = load_flow_from_entrypoint(deployment["entrypoint"])
        assert isinstance(flow, Flow)
        properties = flow.parameters.model_dump()["properties"]
        assert EXPECTED.get(name, set()) <= set(properties)
        assert set(deployment["parameters"]) <= set(properties), name
        for pname, schema in properties.items():  # the UI shows a description per input
            assert schema.get("description"), f"{name}: {pname} has no description"
        for key in ("task_runner", "dask_address"):
            assert key in properties
    nightly = deployments["nightly-eval"]
    assert nightly["parameters"]["reuse"] is True
    [schedule] = nightly["schedules"]
    assert schedule["cron"] and schedule["timezone"]
    assert deployments["rerun"]["parameters"]["run_or_snapshot"] == "latest"


def _prefect(*args: str, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    proc = subprocess.run([PREFECT, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"prefect {' '.join(args)}: {proc.stdout[-2000:]}" \
                                 f"{proc.stderr[-3000:]}"
    return proc


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGINT, 10), (signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture
def worker(tmp_path):
    """Creates the process work pool, deploys prefect.yaml, starts a worker (stopped by PID)."""
    env = {**os.environ, "PREFECT_CLI_PROMPT": "false", "PREFECT_WORKER_QUERY_SECONDS": "1",
           "PREFECT_RUNNER_POLL_FREQUENCY": "1"}
    pools = subprocess.run([PREFECT, "work-pool", "ls"], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=60).stdout
    if "evalsnap-process" not in pools:
        _prefect("work-pool", "create", "evalsnap-process", "--type", "process", env=env)
    _prefect("--no-prompt", "deploy", "--all", env=env)
    log = open(tmp_path / "worker.log", "wb")
    proc = subprocess.Popen([PREFECT, "worker", "start", "--pool", "evalsnap-process",
                             "--limit", "2"], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        _stop(proc)  # before the server (session teardown) goes away
        log.close()


def test_rerun_deployment_end_to_end(cli, shop_copy, store_dir, worker, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        FlowRunFilter,
        FlowRunFilterId,
    )

    from evalsnap.records import EvaluationRecord, repo

    evalset = shop_copy / EVALSET.name
    first = cli("run", str(shop_copy), str(evalset), "--store", str(store_dir),
                "--case", "weather_paris", "--case", "cart_add_two_items",
                "--metric", "tool_trajectory_avg_score", "--metric", "response_match_score",
                "--metric", "response_mentions_city", "--json")
    assert first.code in (0, 1), first.stderr[-3000:]
    run_id = first.json["run_id"]

    # What the UI's "custom run" does: create a flow run of the deployment with parameters.
    parameters = {"run_or_snapshot": run_id, "store": str(store_dir), "evalset": str(evalset),
                  "config": str(shop_copy / "test_config.json"), "reuse": False, "force": True,
                  "metrics": ["response_match_score", "response_mentions_city"],
                  "cases": ["weather_paris"]}
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("evalsnap-rescore/rerun")
        assert "rerun" in deployment.tags
        flow_run = client.create_flow_run_from_deployment(deployment.id, parameters=parameters)
        deadline = time.time() + 180
        while True:
            flow_run = client.read_flow_run(flow_run.id)
            if flow_run.state and flow_run.state.is_final():
                break
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
            assert time.time() < deadline, "rerun did not finish in 180 s:\n" + \
                (tmp_path / "worker.log").read_text()[-3000:]
            time.sleep(1)
        assert flow_run.state.is_completed(), (tmp_path / "worker.log").read_text()[-4000:]
        assert flow_run.name.startswith("rescore-")
        assert {"evalsnap", "rerun"} <= set(flow_run.tags)
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run.id])))
        task_runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id])))

    # The published record: a rescore of the first run with exactly the chosen subset.
    store = repo.open_store(str(store_dir))
    oid, record = repo.resolve_record(store, "latest")
    assert isinstance(record, EvaluationRecord)
    assert record.kind == "rescore" and record.source == run_id and record.force
    assert {(u.eval_id, u.metric_name) for u in record.units} == \
        {("weather_paris", "response_match_score"), ("weather_paris", "response_mentions_city")}
    assert all(u.why == "forced" and not u.reused for u in record.units)
    assert record.summary.agent_calls == 0

    # The artifacts, through the API: table, markdown summary, finished progress.
    by_type = {a.type: a for a in artifacts}
    assert {"table", "markdown", "progress"} <= set(by_type), [a.type for a in artifacts]
    assert by_type["table"].key == "evalsnap-shop-scores"
    table = by_type["table"].data
    rows = table if isinstance(table, list) else json.loads(table)
    assert {(r["case"], r["metric"]) for r in rows} == \
        {("weather_paris", "response_match_score"), ("weather_paris", "response_mentions_city")}
    summary = by_type["markdown"].data
    assert oid in summary and record.snapshot_oid in summary and record.run_id in summary
    assert "units scored now | 2" in summary
    assert float(by_type["progress"].data) == 100.0
    assert {"score response_match_score", "score response_mentions_city"} <= \
        {t.name for t in task_runs}
