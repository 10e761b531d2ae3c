"""Issue 29 item 6: credentials never reach Prefect's database.

A store URL is a flow parameter, and Prefect keeps every flow run's parameters. A URL that
holds credentials (``s3://KEY:SECRET@bucket/p``) is refused before any flow starts, naming
where credentials go instead; credentials given the supported ways (``--storage-option``,
the environment) stay in the CLI's process. Each test then asks the suite's Prefect server,
through Prefect's client, whether any flow run's parameters, logs or artifacts hold the
secret. The CLI runs in the test process (:mod:`tests._cli`): its own process adds nothing
here, and Prefect's records are the suite's server's either way.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._cli import run_inproc
from tests.servers import Server, moto_with_bucket

BUCKET = "creds"


def _prefect_holds(secret: str) -> list[str]:
    """Where the suite's Prefect API holds ``secret``: newest flow runs' parameters, their
    logs and the artifacts."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import FlowRunSort

    found = []
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(sort=FlowRunSort.START_TIME_DESC, limit=200)
        for run in runs:
            if secret in json.dumps(run.parameters, default=str):
                found.append(f"flow run {run.name} parameters")
        recent = [r.id for r in runs[:20]]
        if recent:
            logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=recent)))
            found += [f"log of flow run {log.flow_run_id}" for log in logs if secret in log.message]
            for artifact in client.read_artifacts(flow_run_filter=FlowRunFilter(
                    id=FlowRunFilterId(any_=recent))):
                if secret in json.dumps(artifact.data, default=str):
                    found.append(f"artifact {artifact.key}")
    return found


def _secret() -> str:
    return f"s3cr3t{uuid.uuid4().hex}"


@pytest.mark.parametrize("command", ["run", "rescore", "env"])
def test_a_store_url_with_credentials_is_refused_before_the_flow(shop_copy, command):
    secret = _secret()
    url = f"s3://AKIAEXAMPLEKEY00000:{secret}@{BUCKET}/p"
    agent, evalset = str(shop_copy), str(shop_copy / "shop.evalset.json")
    if command == "run":
        result = run_inproc("run", agent, evalset, "--store", url, "--json")
    elif command == "rescore":
        result = run_inproc("rescore", "latest", "--store", url, "--json")
    else:  # EVALSNAP_STORE holds the URL
        result = run_inproc("run", agent, evalset, "--json", env={"EVALSNAP_STORE": url})
    assert result.code == 2, result.stderr[-3000:]
    assert result.stdout == ""
    assert secret not in result.stderr and "AKIAEXAMPLEKEY00000" not in result.stderr
    assert "holds credentials" in result.stderr and "s3://***@creds/p" in result.stderr
    assert "AWS_ACCESS_KEY_ID" in result.stderr and "--storage-option" in result.stderr
    assert "Traceback" not in result.stderr
    assert _prefect_holds(secret) == []


def test_the_python_api_refuses_it_too_and_starts_no_flow(shop_copy):
    import evalsnap
    from evalsnap import errors

    secret = _secret()
    with pytest.raises(errors.UsageError) as info:
        evalsnap.evaluate(str(shop_copy), str(shop_copy / "shop.evalset.json"),
                          store=f"gs://someone:{secret}@bucket/p")
    assert secret not in str(info.value) and "GOOGLE_APPLICATION_CREDENTIALS" in str(info.value)
    assert _prefect_holds(secret) == []


def test_which_urls_hold_credentials():
    from evalsnap import errors
    from evalsnap.api import check_store_url

    for url in ("s3://bucket/p", "gs://bucket", "memory://x", "/tmp/a@b", "./store@2",
                "file:///tmp/x", "s3://bucket/dir@v1/x", "s3://bucket/a:b@c"):
        check_store_url(url)
    for url in ("s3://KEY:hunter2@bucket/p", "s3://KEY:se/cr+et@bucket/p", "gs://token@bucket",
                "S3://k:s@b", "memory://u:p@x"):
        with pytest.raises(errors.UsageError) as info:
            check_store_url(url)
        assert "hunter2" not in str(info.value) and "se/cr+et" not in str(info.value)


@pytest.fixture(scope="module")
def moto() -> Iterator[Server]:
    with moto_with_bucket(BUCKET) as server:
        yield server


def test_credentials_given_as_storage_options_stay_out_of_prefect(shop_copy, moto: Server,
                                                                    tmp_path: Path) -> None:
    """A run on a bucket, its secret key given with ``--storage-option``: it runs and
    publishes, and Prefect knows the store URL but not the key."""
    secret = _secret()
    url = f"s3://{BUCKET}/p-{uuid.uuid4().hex[:8]}"
    env = {"AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
           "AWS_EC2_METADATA_DISABLED": "true", "AWS_DEFAULT_REGION": "us-east-1"}
    result = run_inproc("run", str(shop_copy), f"{shop_copy / 'shop.evalset.json'}:weather_paris",
                     "--store", url, "--storage-option", f"endpoint_url={moto.url}",
                     "--storage-option", "key=AKIAEXAMPLEKEY00001",
                     "--storage-option", f"secret={secret}", "--json", env=env)
    assert result.code in (0, 1, 3), result.stderr[-3000:]
    run_id = result.json["run_id"]
    assert secret not in result.stdout + result.stderr
    assert _prefect_holds(secret) == []
    assert _prefect_holds(url), "the check must see this run's flow parameters"
    assert run_id
