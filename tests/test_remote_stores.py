"""Issue 6: full runs against S3 (moto) and GCS (fake-gcs-server), reuse from a new process,
Prefect's task cache in the bucket, and fast, clear failures for unusable stores.

Every CLI call is given only dummy credentials and 127.0.0.1 endpoints; the cold runs and the
reading commands run in the test process (:mod:`tests._cli`), the ``--reuse`` runs in a new
process each, since a new process is what they are about.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec
import pytest

from tests._cli import run_inproc, score_status
from tests.conftest import copy_shop, free_port, prefect_api, run_cli
from tests.servers import Server, fake_gcs_with_bucket, moto_with_bucket, s3_create_bucket, start_moto

BUCKET = "evalsnap-e2e"

_BASE_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "NO_GCE_CHECK": "true",
    "GCE_METADATA_HOST": "127.0.0.1:9",
    "GCE_METADATA_IP": "127.0.0.1:9",
    "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL",
                        "AWS_ENDPOINT_URL_S3", "GOOGLE_APPLICATION_CREDENTIALS",
                        "STORAGE_EMULATOR_HOST")}
    return {**env, **_BASE_ENV, **extra}


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_shop(tmp_path_factory.mktemp("remote") / "shop_agent")


@pytest.fixture(scope="module")
def moto() -> Iterator[Server]:
    with moto_with_bucket(BUCKET) as server:
        yield server


@pytest.fixture(scope="module")
def fake_gcs() -> Iterator[Server]:
    with fake_gcs_with_bucket(BUCKET) as server:
        yield server


#: Three of the demo's cases (the count is not the point; more than one inference batch is:
#: three batches of one case under the default 8 workers): a passing one, a two-turn one,
#: and the failing one with an incomplete unit, each with its own inference fingerprint (so
#: one Prefect cache entry per batch of one case).
CASES = ["weather_paris", "cart_add_then_show", "out_of_scope_flight"]


def _two_runs(agent: Path, url: str, env: dict[str, str], prefect_url: str) -> dict[str, Any]:
    evalset = str(agent / "shop.evalset.json")
    cases = [a for c in CASES for a in ("--case", c)]
    cold = run_inproc("run", str(agent), evalset, "--store", url, "--json", *cases, env=env)
    # a new process, on a Prefect server that records its task runs (read back below)
    warm = run_cli("run", str(agent), evalset, "--store", url, "--json", "--reuse", *cases,
                   env={**env, "PREFECT_API_URL": prefect_url})
    return {"url": url, "env": env, "cold": cold, "warm": warm, "prefect_url": prefect_url}


@pytest.fixture(scope="module")
def s3_runs(agent: Path, moto: Server, recording_prefect_api: str) -> dict[str, Any]:
    runs = _two_runs(agent, f"s3://{BUCKET}/e2e-{uuid.uuid4().hex[:8]}",
                     _env(AWS_ENDPOINT_URL=moto.url), recording_prefect_api)
    runs["fs"] = fsspec.filesystem("s3", endpoint_url=moto.url, key="testing",
                                   secret="testing", use_listings_cache=False)
    return runs


@pytest.fixture(scope="module")
def gcs_runs(agent: Path, fake_gcs: Server, recording_prefect_api: str) -> dict[str, Any]:
    runs = _two_runs(agent, f"gs://{BUCKET}/e2e-{uuid.uuid4().hex[:8]}",
                     _env(STORAGE_EMULATOR_HOST=fake_gcs.url), recording_prefect_api)
    runs["fs"] = fsspec.filesystem("gs", endpoint_url=fake_gcs.url, token="anon",
                                   use_listings_cache=False)
    return runs


@pytest.fixture(params=["s3", "gcs"])
def runs(request: pytest.FixtureRequest) -> dict[str, Any]:
    return request.getfixturevalue(f"{request.param}_runs")


def test_cold_run_in_the_bucket_calls_the_models(runs: dict[str, Any]) -> None:
    cold = runs["cold"]
    assert cold.code in (1, 3), cold.stderr[-3000:]
    assert cold.json["agent_calls"] > 0 and cold.json["judge_calls"] > 0
    assert cold.json["reused_units"] == 0


def test_reuse_from_a_new_process_makes_no_model_calls(runs: dict[str, Any]) -> None:
    cold, warm = runs["cold"].json, runs["warm"]
    assert warm.code == runs["cold"].code, warm.stderr[-3000:]
    assert warm.json["agent_calls"] == 0
    assert warm.json["judge_calls"] == 0
    # only units that were incomplete before are scored again (and need no model call)
    incomplete = sum(1 for c in cold["cases"] for v in c["metrics"].values()
                     if not v["complete"])
    assert warm.json["scored_units"] <= incomplete
    assert warm.json["reused_units"] + warm.json["scored_units"] == cold["scored_units"]
    complete_before = {k: v for k, v in score_status(cold).items()
                       if v[1] != "NOT_EVALUATED"}
    assert {k: score_status(warm.json)[k] for k in complete_before} == complete_before
    assert all(c["inference_reused"] for c in warm.json["cases"])


def test_objects_manifests_and_task_cache_live_in_the_bucket(runs: dict[str, Any]) -> None:
    fs, root = runs["fs"], runs["url"].split("://", 1)[1]
    for kind in ("inference", "snapshot", "pack", "record"):
        assert fs.find(f"{root}/v1/objects/{kind}"), kind
    # a scoring task's units and judge entries are written only as packs
    members = {m["kind"] for p in fs.find(f"{root}/v1/objects/pack")
               for m in json.loads(fs.cat_file(p))["members"]}
    assert {"unit", "judge", "inference"} <= members, members
    runs_dir = fs.ls(f"{root}/v1/refs/runs")
    assert {p.rsplit("/", 1)[-1] for p in runs_dir} == {
        runs["cold"].json["run_id"], runs["warm"].json["run_id"]}
    cached = [p for p in fs.find(f"{root}/v1/prefect") if p.rsplit("/", 1)[-1].startswith("infer-")]
    n_cases = len(runs["cold"].json["cases"])
    assert n_cases == len(CASES)
    from evalsnap import settings
    from evalsnap.pipeline.infer import batches

    # one cache entry per inference batch (its key: the batch's inference fingerprints),
    # written by the cold run and read by the --reuse run
    assert len(cached) == len(batches(n_cases, settings.get().max_workers)) > 1
    # ADK interop copy for a remote store: under refs adk_history/<app>/
    history = fs.find(f"{root}/v1/refs/adk_history/shop_agent")
    assert len(history) == 2
    from google.adk.evaluation._eval_set_results_manager_utils import (
        parse_eval_set_result_json,
    )
    parsed = parse_eval_set_result_json(fs.cat_file(history[0]))
    assert parsed.eval_set_id == "shop" and len(parsed.eval_case_results) == n_cases


def test_verify_passes_on_the_bucket(runs: dict[str, Any]) -> None:
    result = run_inproc("verify", "--store", runs["url"], "--json", env=runs["env"])
    assert result.code == 0, result.stdout + result.stderr[-2000:]
    assert result.json["runs"] == 2 and result.json["problems"] == []


def _warm_flow_run_task_states(url: str, run_id_marker: str, prefix: str = "infer "
                               ) -> dict[str, str]:
    """State names of the inference (``prefix``) task runs of the --reuse flow run on
    ``url``, by task run name."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.client.schemas.sorting import FlowRunSort

    with get_client(sync_client=True) as client:
        flow_runs = [fr for fr in client.read_flow_runs(sort=FlowRunSort.START_TIME_DESC,
                                                        limit=200)
                     if fr.parameters.get("store") == url and fr.parameters.get("reuse")]
        assert flow_runs, f"no --reuse flow run found for {url} ({run_id_marker})"
        task_runs = client.read_task_runs(flow_run_filter=FlowRunFilter(
            id=FlowRunFilterId(any_=[flow_runs[0].id])))
    return {tr.name: tr.state_name for tr in task_runs if tr.name.startswith(prefix)}


def test_second_process_gets_prefect_cache_hits_from_the_bucket(runs: dict[str, Any]) -> None:
    with prefect_api(runs["prefect_url"]):
        states = _warm_flow_run_task_states(runs["url"], runs["warm"].json["run_id"])
        # a scoring task's cached result is the handle of its outcomes object (issue 31)
        scored = _warm_flow_run_task_states(runs["url"], runs["warm"].json["run_id"], "score ")
    assert states and all(s == "Cached" for s in states.values()), states
    # every metric whose units were all complete; a metric with an incomplete unit was not
    # cached, and runs again
    complete = {name: all(c["metrics"][name]["complete"] for c in runs["cold"].json["cases"])
                for name in runs["cold"].json["cases"][0]["metrics"]}
    assert any(complete.values()), complete
    assert {name: scored.get(f"score {name}") == "Cached" for name in complete} == complete, \
        (scored, complete)


# ---- unusable stores: exit 2 naming the URL ---------------------------------------------------

def _run_quick(agent: Path, url: str, env: dict[str, str]) -> Any:
    return run_inproc("run", str(agent), str(agent / "shop.evalset.json"), "--store", url,
                   "--json", env=env, timeout=120)


@pytest.mark.parametrize("protocol", ["s3", "gcs"])
def test_missing_bucket_exits_2_naming_the_url(agent: Path, protocol: str,
                                                request: pytest.FixtureRequest) -> None:
    if protocol == "s3":
        server: Server = request.getfixturevalue("moto")
        url, env = "s3://no-such-bucket-e2e/p", _env(AWS_ENDPOINT_URL=server.url)
    else:
        server = request.getfixturevalue("fake_gcs")
        url, env = "gs://no-such-bucket-e2e/p", _env(STORAGE_EMULATOR_HOST=server.url)
    result = _run_quick(agent, url, env)
    assert result.code == 2, result.stderr[-2000:]
    assert url in result.stderr and "does not exist" in result.stderr
    assert result.stdout.strip() == ""


@pytest.mark.parametrize("protocol", ["s3", "gcs"])
def test_unreachable_endpoint_exits_2_naming_the_url(agent: Path, protocol: str) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    if protocol == "s3":
        url, env = f"s3://{BUCKET}/p", _env(AWS_ENDPOINT_URL=dead)
    else:
        url, env = f"gs://{BUCKET}/p", _env(STORAGE_EMULATOR_HOST=dead)
    result = _run_quick(agent, url, env)
    assert result.code == 2, result.stderr[-2000:]
    assert url in result.stderr and "unavailable" in result.stderr


@pytest.fixture(scope="module")
def moto_with_auth() -> Iterator[Server]:
    """A moto server that checks credentials (it accepts any by default)."""
    server = start_moto(unauthenticated_calls=0)
    try:
        yield server
    finally:
        server.stop()


def test_wrong_credentials_exit_2_naming_the_url(agent: Path, moto_with_auth: Server) -> None:
    url = f"s3://{BUCKET}/p"
    env = _env(AWS_ENDPOINT_URL=moto_with_auth.url, AWS_ACCESS_KEY_ID="AKIAWRONGWRONGWRONG1",
               AWS_SECRET_ACCESS_KEY="wrong-secret-value")
    result = _run_quick(agent, url, env)
    assert result.code == 2, result.stderr[-2000:]
    assert url in result.stderr and "credentials" in result.stderr
    assert "wrong-secret-value" not in result.stderr + result.stdout


def test_storage_options_reach_the_scoring_process(agent: Path, moto: Server,
                                                   s3_runs: dict[str, Any]) -> None:
    """`--storage-option` values live in the CLI's process only; the scoring process (Prefect's
    ProcessPoolTaskRunner) gets them from its initializer, or it could not open the bucket."""
    url = f"s3://{BUCKET}/opts-{uuid.uuid4().hex[:8]}"
    # no AWS_ENDPOINT_URL: only the option says where (a process of its own: the pool)
    env = _env(EVALSNAP_SCORE_PROCESSES="1", EVALSNAP_SCORE_POOL_MIN_UNITS="0")
    # two cases (the count is not the point): one passing, one with the demo's designed
    # NOT_EVALUATED unit and a failure
    cases = ["weather_paris", "out_of_scope_flight"]
    result = run_inproc("run", str(agent), str(agent / "shop.evalset.json"), "--store", url,
                        "--storage-option", f"endpoint_url={moto.url}", "--json",
                        *[a for c in cases for a in ("--case", c)], env=env)
    assert result.code == 3, result.stderr[-3000:]  # the demo's designed failures, no more

    def units(summary: dict[str, Any]) -> dict[tuple[str, str], tuple[Any, ...]]:
        return {(c["eval_id"], m): (u["status"], u["score"], u["complete"])
                for c in summary["cases"] if c["eval_id"] in cases
                for m, u in c["metrics"].items()}

    # the same units as the in-process scoring of the same cases (no pool below 200 units)
    assert {c["eval_id"] for c in result.json["cases"]} == set(cases)
    assert units(result.json) == units(s3_runs["cold"].json)


def test_a_bucket_deleted_while_in_use_is_reported_as_missing_not_an_object(
        moto: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 21: a bucket deleted mid-run is "bucket … does not exist", not "object not found"."""
    import boto3

    from storage import Store, StoreUnavailable
    from storage.errors import ObjectNotFound

    bucket = f"vanishing-{uuid.uuid4().hex[:8]}"
    s3_create_bucket(moto, bucket)
    for key, value in _env(AWS_ENDPOINT_URL=moto.url).items():
        monkeypatch.setenv(key, value)
    store = Store(f"s3://{bucket}/p")
    oid = store.put_object("unit", b'{"a": 1}')
    missing = "sha256:" + "0" * 64
    with pytest.raises(ObjectNotFound):  # the bucket is there: a missing object is one
        store.get_object("unit", missing)
    client = boto3.client("s3", endpoint_url=moto.url, aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name="us-east-1")
    for item in client.list_objects_v2(Bucket=bucket).get("Contents", []):
        client.delete_object(Bucket=bucket, Key=item["Key"])
    client.delete_bucket(Bucket=bucket)
    with pytest.raises(StoreUnavailable, match="does not exist"):
        store.get_object("unit", oid)
