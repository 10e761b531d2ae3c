"""prefect.yaml: every entrypoint loads with the parameters the UI shows, and the rerun
deployment runs end to end through a real server, a process work pool and a worker."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from tests._cli import run_inproc
from tests.conftest import EVALSET, ROOT, copy_agent, copy_shop, prefect_api

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
        if name in EXPECTED:
            for key in ("task_runner", "dask_address", "baseline", "fail_on", "tolerance"):
                assert key in properties
            # The form: no `str | None` toggle; an empty text box means "all" / "beside".
            assert all("anyOf" not in p for p in properties.values()), name
            assert all(v is not None for v in deployment["parameters"].values()), name
    nightly = deployments["nightly-eval"]
    assert nightly["parameters"]["reuse"] is True
    assert nightly["parameters"]["baseline"] == "last-good"  # the last good night (issue 30)
    [schedule] = nightly["schedules"]
    assert schedule["cron"] and schedule["timezone"]
    assert schedule["timezone"] in nightly["description"]
    assert deployments["rerun"]["parameters"]["run_or_snapshot"] == "latest"
    # One store setting: every deployment's store parameter is empty (the flow then reads
    # EVALSNAP_STORE), and the pool's job variables set it once for all of them
    assert {d["name"]: d["parameters"]["store"] for d in deployments.values()} == \
        dict.fromkeys(deployments, "")
    assert {d["work_pool"]["job_variables"]["env"]["EVALSNAP_STORE"]
            for d in deployments.values()} == {".evalsnap"}
    assert (ROOT / "prefect.yaml").read_text().count("EVALSNAP_STORE:") == 1


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


class Worker:
    """The module's one worker process and its log (both end-to-end tests use it)."""

    def __init__(self, proc: subprocess.Popen, log: Path) -> None:
        self.proc, self.log = proc, log

    def poll(self) -> int | None:
        return self.proc.poll()

    def tail(self, size: int = 3000) -> str:
        return self.log.read_text()[-size:]


@pytest.fixture(scope="module", autouse=True)
def _recording_server(recording_prefect_api: str) -> Iterator[None]:
    """This module's Prefect server records task runs and events (the tests read both
    back): its deployments, worker, flow runs and clients all use it."""
    patch = pytest.MonkeyPatch()
    patch.setenv("PREFECT_API_URL", recording_prefect_api)
    try:
        with prefect_api(recording_prefect_api):
            yield
    finally:
        patch.undo()


@pytest.fixture(scope="module")
def deployed() -> dict:
    """Creates the process work pool and deploys prefect.yaml on the module's server, once
    for the module (the end-to-end tests' worker and the UI's form test read them)."""
    env = {**os.environ, "PREFECT_CLI_PROMPT": "false"}
    # (`work-pool ls` truncates names in a narrow table: create it, or update it in place)
    _prefect("work-pool", "create", "evalsnap-process", "--type", "process", "--overwrite",
             env=env)
    _prefect("--no-prompt", "deploy", "--all", env=env, timeout=300)
    return env


@contextmanager
def _prefect_ui(static: Path, api_url: str) -> Iterator[str]:
    """Prefect's own UI app (``create_ui_app``: what ``prefect server start --ui`` mounts
    at ``/``, its static bundle and ``/ui-settings``) served from this process on
    127.0.0.1, its API the module's server (which runs without a UI): a second server
    and a second deployment of prefect.yaml cost ~25 CPU s. Stopped on exit."""
    import contextvars
    import threading

    import uvicorn
    from prefect.server.api.server import create_ui_app
    from prefect.settings import (
        PREFECT_UI_API_URL,
        PREFECT_UI_ENABLED,
        PREFECT_UI_STATIC_DIRECTORY,
        temporary_settings,
    )

    from tests.conftest import free_port

    with temporary_settings({PREFECT_UI_ENABLED: True, PREFECT_UI_API_URL: api_url,
                             PREFECT_UI_STATIC_DIRECTORY: str(static)}):
        app = create_ui_app(ephemeral=False)
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                               log_level="warning", lifespan="off"))
        # the settings above are a context variable: the server's thread runs in a copy
        thread = threading.Thread(target=contextvars.copy_context().run, args=(server.run,),
                                  daemon=True)
        thread.start()
        try:
            deadline = time.monotonic() + 60
            while not server.started:
                assert thread.is_alive() and time.monotonic() < deadline, "UI app not serving"
                time.sleep(0.05)
            yield f"http://127.0.0.1:{port}"
        finally:
            server.should_exit = True
            thread.join(30)


def test_custom_run_form_renders_without_none_toggles(deployed, tmp_path):
    """The rerun deployment's custom-run form in Prefect's real UI (headless Chromium): every
    parameter a plain input with its description, no ``None`` toggle; the screenshot is kept
    in /tmp/form.png. The nightly deployment's description names the schedule's time zone."""
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed")
    import httpx

    url = os.environ["PREFECT_API_URL"]
    deployments = httpx.post(f"{url}/deployments/filter", json={}, timeout=10).json()
    by_name = {d["name"]: d for d in deployments}
    assert "Europe/Paris" in by_name["nightly-eval"]["description"]
    schema = by_name["rerun"]["parameter_openapi_schema"]["properties"]
    assert all("anyOf" not in p and p.get("type") != "null" for p in schema.values()), schema
    with _prefect_ui(tmp_path / "ui", url) as ui:
        assert httpx.get(f"{ui}/ui-settings", timeout=10).json()["api_url"] == url
        page = ui + f"/deployments/deployment/{by_name['rerun']['id']}/run"
        args = [chromium, "--headless=new", "--no-sandbox", "--disable-gpu",
                "--disable-background-networking", "--no-first-run", "--hide-scrollbars",
                "--virtual-time-budget=20000"]
        Path("/tmp/form.png").unlink(missing_ok=True)  # this run's screenshot, not an old one
        # one page load gives both: the screenshot and the DOM it shows
        dom = subprocess.run([*args, "--window-size=1280,2600", "--screenshot=/tmp/form.png",
                              "--dump-dom", page], capture_output=True, text=True, timeout=120,
                             check=True).stdout
    assert Path("/tmp/form.png").stat().st_size > 20_000
    text = re.sub(r"<[^>]+>", " ", dom)
    for name in ("run_or_snapshot", "metrics", "cases", "baseline", "fail_on", "tolerance"):
        assert name in text, name
    assert "comma-separated" in text and "working directory" in text
    assert 'Property is type "None"' not in text and "Something went wrong" not in text


@pytest.fixture(scope="module")
def worker(deployed, tmp_path_factory):
    """A worker of the deployed pool (stopped by PID): once for the module, since starting
    a worker costs ~20 s each time."""
    env = {**deployed, "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_RUNNER_POLL_FREQUENCY": "1"}
    path = tmp_path_factory.mktemp("worker") / "worker.log"
    log = open(path, "wb")
    # --limit 4: the end-to-end tests' three flow runs may all run at once
    proc = subprocess.Popen([PREFECT, "worker", "start", "--pool", "evalsnap-process",
                             "--limit", "4"], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield Worker(proc, path)
    finally:
        _stop(proc)  # before the server (session teardown) goes away
        log.close()


def _shop(dst: Path) -> Path:
    copy_shop(dst)
    return dst


@pytest.fixture(scope="module")
def flow_runs(worker, tmp_path_factory) -> dict:
    """The end-to-end tests' flow runs of the deployments, created at once (what the UI's
    "custom run" does: a flow run of a deployment with parameters), so that the worker runs
    them side by side; each test waits for its own and checks them. Every run has a store
    (and a first run in it, made by the CLI) of its own."""
    from prefect.client.orchestration import get_client

    base = tmp_path_factory.mktemp("flow-runs")
    # test_rerun_deployment_end_to_end's store: one run of two cases and three metrics
    rerun_agent = _shop(base / "rerun" / "agents" / "shop_agent")
    rerun_store = base / "rerun" / "store"
    rerun_evalset = rerun_agent / EVALSET.name
    rerun_first = run_inproc("run", str(rerun_agent), str(rerun_evalset), "--store",
                             str(rerun_store), "--case", "weather_paris", "--case",
                             "cart_add_two_items", "--metric", "tool_trajectory_avg_score",
                             "--metric", "response_match_score", "--metric",
                             "response_mentions_city", "--json")
    assert rerun_first.code in (0, 1), rerun_first.stderr[-3000:]
    # test_gate_fails_the_flow_run_emits_events_and_names_runs's store: one passing unit,
    # then an edited eval set that makes it regress
    gate_agent = _shop(base / "gate" / "agents" / "shop_agent")
    gate_store = base / "gate" / "store"
    gate_evalset = gate_agent / EVALSET.name
    gate_first = run_inproc("run", str(gate_agent), str(gate_evalset), "--store",
                            str(gate_store), "--case", "weather_paris", "--metric",
                            "response_match_score", "--json")
    assert gate_first.code == 0, gate_first.stderr[-3000:]
    edited = json.loads(gate_evalset.read_text("utf-8"))
    for case in edited["eval_cases"]:
        if case["eval_id"] == "weather_paris":
            case["conversation"][0]["final_response"]["parts"][0]["text"] = "Nothing alike."
    (gate_agent / "edited.evalset.json").write_text(json.dumps(edited), "utf-8")
    gate_parameters = {"run_or_snapshot": gate_first.json["run_id"], "store": str(gate_store),
                       "evalset": str(gate_agent / "edited.evalset.json"),
                       "config": str(gate_agent / "test_config.json"), "cases": "weather_paris",
                       "metrics": "response_match_score",
                       "baseline": gate_first.json["run_id"], "fail_on": "regression"}
    # issue 20: the nightly deployment runs a LangGraph agent, its parameters unchanged
    graph_agent = copy_agent(ROOT / "examples" / "langgraph_agent", base / "gate" / "agents" / "langgraph_agent")

    with get_client(sync_client=True) as client:
        rerun = client.read_deployment_by_name("evalsnap-rescore/rerun")
        nightly = client.read_deployment_by_name("evalsnap-evaluate/nightly-eval")
        rerun_run = client.create_flow_run_from_deployment(rerun.id, parameters={
            "run_or_snapshot": rerun_first.json["run_id"], "store": str(rerun_store),
            "evalset": str(rerun_evalset), "config": str(rerun_agent / "test_config.json"),
            "reuse": False, "force": True,
            "metrics": "response_match_score, response_mentions_city",
            "cases": "weather_paris"})  # the form's comma-separated text boxes
        typed = client.create_flow_run_from_deployment(rerun.id, parameters=gate_parameters,
                                                       name="after the reference fix")
        graph_run = client.create_flow_run_from_deployment(nightly.id, parameters={
            "agent_dir": str(graph_agent), "evalset": str(graph_agent / "trip.evalset.json"),
            "config": "", "store": str(gate_store / "graph"), "reuse": True, "baseline": ""})
    return {"rerun_deployment": rerun, "rerun_first": rerun_first, "rerun_store": rerun_store,
            "rerun": rerun_run.id, "gate_first": gate_first, "gate_store": gate_store,
            "typed": typed.id, "gate_parameters": gate_parameters, "graph": graph_run.id}


def test_rerun_deployment_end_to_end(worker, flow_runs):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        FlowRunFilter,
        FlowRunFilterId,
    )

    from evalsnap.records import EvaluationRecord, repo

    run_id = flow_runs["rerun_first"].json["run_id"]
    store_dir = flow_runs["rerun_store"]
    assert "rerun" in flow_runs["rerun_deployment"].tags
    with get_client(sync_client=True) as client:
        flow_run = _wait_final(client, flow_runs["rerun"], worker)
        assert flow_run.state.is_completed(), worker.tail(4000)
        # created with Prefect's random name: the flow made it a telling one
        assert re.fullmatch(r"rescore-shop-subset-\d{8}-\d{6}-[0-9a-f]{4}", flow_run.name), \
            flow_run.name
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
    [summary] = [a.data for a in artifacts if a.key == "evalsnap-shop-summary"]
    assert "Covers: subset" in summary and "* cases failed" not in summary
    assert oid in summary and record.snapshot_oid in summary and record.run_id in summary
    assert "units scored now | 2" in summary
    assert float(by_type["progress"].data) == 100.0
    assert {"score response_match_score", "score response_mentions_city"} <= \
        {t.name for t in task_runs}


def _wait_final(client, flow_run_id, worker: Worker, timeout: float = 300):
    deadline = time.time() + timeout
    while True:
        flow_run = client.read_flow_run(flow_run_id)
        if flow_run.state and flow_run.state.is_final():
            return flow_run
        assert worker.poll() is None, worker.tail()
        assert time.time() < deadline, f"flow run not final in {timeout} s:\n" + worker.tail()
        time.sleep(0.25)


def _events(prefix: str, record_id: str, expected: set[str]) -> list[dict]:
    """Events of one record, read back through the server's API (``/events/filter``): polled
    until the ``expected`` ones are there (or 30 s passed), then what there is."""
    import httpx

    body = {"filter": {"event": {"prefix": [prefix]},
                       "any_resource": {"id": [f"evalsnap.record.{record_id}"]}}, "limit": 50}
    deadline = time.monotonic() + 30
    while True:  # events are sent asynchronously by the flow run's process
        response = httpx.post(f"{os.environ['PREFECT_API_URL']}/events/filter", json=body,
                              timeout=10)
        response.raise_for_status()
        found = response.json()["events"]
        if expected <= {e["event"] for e in found} or time.monotonic() > deadline:
            return found
        time.sleep(0.25)


def test_gate_fails_the_flow_run_emits_events_and_names_runs(worker, flow_runs):
    """A regression against the baseline ends the deployment's flow run Failed (message naming
    the case and metric), after the record is published; the events reach the server; a
    typed run name is kept and a generated one says eval set and subset."""
    from prefect.client.orchestration import get_client

    from evalsnap.records import repo

    first = flow_runs["gate_first"]
    store_dir = flow_runs["gate_store"]
    with get_client(sync_client=True) as client:
        typed = _wait_final(client, flow_runs["typed"], worker)
        graph_run = _wait_final(client, flow_runs["graph"], worker)

    assert typed.state.is_failed(), worker.tail(4000)
    message = typed.state.message
    assert message.startswith("REGRESSED (fail_on=regression): shop: 1 regressed since "
                              f"{first.json['run_id']} (weather_paris · response_match_score)")
    assert "\n" not in message
    assert typed.name == "after the reference fix"
    assert typed.run_count == 1  # a quality verdict is no exception to retry
    # The record was published before the state: the message names it, and it reads back.
    record_id = message.rsplit("record ", 1)[1]
    store = repo.open_store(str(store_dir))
    oid, record = repo.resolve_record(store, record_id)
    assert record.baseline.run_id == first.json["run_id"] and not record.full
    expected = {"evalsnap.run.failed", "evalsnap.run.regressed"}
    events = _events("evalsnap.run.", oid, expected)
    assert {e["event"] for e in events} == expected
    resource = events[0]["resource"]
    assert resource["evalsnap.eval-set"] == "shop" and resource["evalsnap.record"] == oid
    assert resource["evalsnap.run"] == record.run_id
    assert resource["evalsnap.store"] == repo.open_store(str(store_dir)).url
    regressed = next(e for e in events if e["event"] == "evalsnap.run.regressed")
    assert regressed["payload"]["regressions"][0]["change"] == "PASSED → FAILED"
    # the links an alert needs: the report (a local store's file:// page) and the flow run
    report = regressed["payload"]["report_url"]
    assert report.startswith("file://") and report.endswith(
        oid.removeprefix("sha256:") + ".html"), report
    assert regressed["payload"]["flow_run_url"].endswith(f"/flow-run/{typed.id}"), \
        regressed["payload"]["flow_run_url"]
    assert any(r["prefect.resource.id"] == f"prefect.flow-run.{typed.id}"
               for r in regressed["related"])

    # the LangGraph run: Failed by its two designed failures (fail_on=quality), published
    assert graph_run.state.is_failed(), worker.tail(4000)
    assert "2 failed" in graph_run.state.message and ("trip_wrong_trajectory" in
                                                        graph_run.state.message), \
        graph_run.state.message
    _, graph_record = repo.resolve_record(repo.open_store(str(store_dir / "graph")), "latest")
    assert graph_record.summary.agent_calls > 0 and graph_record.summary.complete
    assert {u.metric_name for u in graph_record.units} >= {"tool_trajectory_avg_score",
                                                           "final_state_match"}

    # fail_on=never: the same regression, Completed (the flow itself, as a flow run of this
    # process on the same server: the deployment's way to a flow run is the two above)
    from flows.rescore import rescore

    never = rescore(**{**flow_runs["gate_parameters"], "fail_on": "never"}, return_state=True)
    assert never.is_completed(), never.message
    assert [r["eval_id"] for r in never.result()["regressions"]] == ["weather_paris"]

    # A gate failure is a verdict, not a crash: no ERROR record in the failed runs' logs on
    # the server, and no ERROR line or traceback in the worker's output (its flow runs' too)
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId, LogFilterLevel

    failed_ids = [typed.id, graph_run.id]

    def gate_warnings(logs: list) -> set:
        return {log.flow_run_id for log in logs if log.level == 30 and log.message.startswith(
            ("REGRESSED", "NOT PASSED"))}

    deadline = time.monotonic() + 60
    with get_client(sync_client=True) as client:
        while True:  # a flow run's process ships its logs in batches, after its state
            logs = client.read_logs(log_filter=LogFilter(
                flow_run_id=LogFilterFlowRunId(any_=failed_ids)))
            if gate_warnings(logs) == set(failed_ids) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        # an ERROR would follow the gate's WARNING within milliseconds, in the same or the
        # next batch (Prefect ships every 2 s, and at exit): look for 6 s more
        quiet_until = time.monotonic() + 6
        while True:
            errors = client.read_logs(log_filter=LogFilter(
                flow_run_id=LogFilterFlowRunId(any_=failed_ids), level=LogFilterLevel(ge_=40)))
            if errors or time.monotonic() > quiet_until:
                break
            time.sleep(0.5)
    # the control: the gate's message is a WARNING record of each failed run, read back
    assert gate_warnings(logs) == set(failed_ids), [(g.level, g.message) for g in logs]
    assert errors == [], [f"{e.level} {e.message[:300]}" for e in errors]
    output = worker.log.read_text()
    assert "Traceback" not in output and "| ERROR" not in output, worker.tail(6000)


def test_the_documented_automation_is_one_prefect_accepts():
    """deployments/README.md's automation parses as Prefect's own automation model and
    matches the events the flows emit."""
    from prefect.events.schemas.automations import AutomationCore

    text = (ROOT / "deployments" / "README.md").read_text("utf-8")
    block = re.search(r"```yaml\n(name: evalsnap regression.*?)```", text, re.S)
    assert block, "the automation is not in deployments/README.md"
    automation = AutomationCore.model_validate(yaml.safe_load(block.group(1)))
    assert automation.trigger.expect == {"evalsnap.run.regressed"}
    assert automation.trigger.match.root["prefect.resource.id"] == "evalsnap.record.*"
