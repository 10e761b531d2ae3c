"""Issue 31: a bucket costs a handful of requests, not one per object — and still never hands
out a damaged or missing object.

On a moto S3 bucket, through the CLI: a cold run sends about one request per object it
leaves (no HEAD before a GET, nothing read back), ``store_requests`` in ``--json`` counts
them; a no-op ``--reuse`` in a new process proves what it reuses with a few listings and
packs (under 100 requests for the demo's 13 cases × 7 metrics, 0 model calls, the same
verdicts); damage in the bucket — a unit, an index segment, an inference deleted, a pack
— is never reused: each costs exactly the work it invalidates.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests import _packs
from tests._cli import run_inproc
from tests.conftest import copy_shop, run_cli
from tests.servers import Server, moto_with_bucket
from tests.test_remote_stores import _env

BUCKET = "evalsnap-requests"


@pytest.fixture(scope="module")
def moto() -> Iterator[Server]:
    with moto_with_bucket(BUCKET) as server:
        yield server


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_shop(tmp_path_factory.mktemp("requests") / "shop_agent")


def _client(moto: Server) -> Any:
    return boto3.client("s3", endpoint_url=moto.url, aws_access_key_id="testing",
                        aws_secret_access_key="testing", region_name="us-east-1")


def _keys(moto: Server, prefix: str) -> list[str]:
    pages = _client(moto).get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return [item["Key"] for page in pages for item in page.get("Contents", [])]


class _Bucket:
    """A store's files in the moto bucket by store-relative path (for :mod:`tests._packs`)."""

    def __init__(self, moto: Server, prefix: str) -> None:
        self.moto, self.prefix, self.client = moto, prefix, _client(moto)

    def files(self, rel: str) -> list[str]:
        return sorted(k[len(self.prefix) + 1:] for k in _keys(self.moto, f"{self.prefix}/{rel}/"))

    def read(self, rel: str) -> bytes:
        data: bytes = self.client.get_object(Bucket=BUCKET, Key=f"{self.prefix}/{rel}")["Body"].read()
        return data

    def write(self, rel: str, data: bytes) -> None:
        self.client.put_object(Bucket=BUCKET, Key=f"{self.prefix}/{rel}", Body=data)


def _verdicts(result: dict[str, Any]) -> dict[tuple[str, int, str], tuple[Any, Any]]:
    return {(c["eval_id"], c.get("repetition", 0), m): (v["status"], v["score"])
            for c in result["cases"] for m, v in c["metrics"].items()}


def _reused(result: dict[str, Any]) -> dict[tuple[str, str], bool]:
    return {(c["eval_id"], m): v["reused"] for c in result["cases"] for m, v in c["metrics"].items()}


@pytest.fixture(scope="module")
def cold(agent: Path, moto: Server) -> dict[str, Any]:
    prefix = f"cold-{uuid.uuid4().hex[:8]}"
    env = _env(AWS_ENDPOINT_URL=moto.url)
    res = run_inproc("run", str(agent), str(agent / "shop.evalset.json"), "--store",
                     f"s3://{BUCKET}/{prefix}", "--json", env=env)
    assert res.code == 3, res.stderr[-3000:]  # the demo is incomplete by design
    # a copy of the bucket's store as the cold run left it, for the test that damages it
    # (before any other test adds a run to the original)
    copy = f"damage-{uuid.uuid4().hex[:8]}"
    client = _client(moto)
    keys = _keys(moto, prefix + "/")
    for key in keys:
        client.copy_object(Bucket=BUCKET, Key=copy + key[len(prefix):],
                           CopySource={"Bucket": BUCKET, "Key": key})
    assert len(_keys(moto, copy + "/")) == len(keys)
    return {"prefix": prefix, "env": env, "json": res.json, "copy": copy}


def test_a_cold_run_costs_about_one_request_per_object_it_leaves(cold: dict[str, Any],
                                                                 moto: Server) -> None:
    counts = cold["json"]["store_requests"]
    keys = _keys(moto, cold["prefix"] + "/")
    objects = len(keys)
    assert objects > 30
    # units and judge entries are in packs (a few per scoring task), not an object each
    assert not [k for k in keys if "/v1/objects/unit/" in k or "/v1/objects/judge/" in k]
    assert 1 <= len([k for k in keys if "/v1/objects/pack/" in k]) <= 20
    # the unit and judge indexes are a few segments, not a ref per key
    segments = [k for k in keys if "/v1/refs/index/segments/" in k]
    assert 1 <= len(segments) <= 10, segments
    assert not [k for k in keys if "/v1/refs/index/unit/" in k or "/v1/refs/index/judge/" in k]
    # one PUT per object it leaves, and a few reads and listings whatever the run's size
    # (the bucket's probe, the eval set's latest record, the index; 20 of 85 for this run)
    assert counts["put"] <= objects + 2, (counts, objects)
    assert counts["total"] - counts["put"] <= 25, counts
    assert counts["head"] <= 1, counts  # the bucket, probed once; never a HEAD before a GET
    assert set(counts) == {"list", "head", "get", "put", "delete", "total"}


def test_a_no_op_rerun_costs_a_handful_of_requests(cold: dict[str, Any], agent: Path) -> None:
    url = f"s3://{BUCKET}/{cold['prefix']}"
    warm = run_cli("run", str(agent), str(agent / "shop.evalset.json"), "--store", url,
                   "--json", "--reuse", env=cold["env"])
    out = warm.json
    assert (out["agent_calls"], out["judge_calls"]) == (0, 0)
    assert out["store_requests"]["total"] <= 100, out["store_requests"]
    assert _verdicts(out) == _verdicts(cold["json"])
    # every complete unit is reused; the incomplete one (NOT_EVALUATED) is scored again
    complete = {k for k, v in _reused(cold["json"]).items() if _complete(cold["json"], k)}
    assert {k for k, v in _reused(out).items() if v} == complete
    assert out["reused_units"] == len(complete) and out["scored_units"] == 1


def test_a_rerun_knows_an_incomplete_unit_from_one_look_at_the_index(
        cold: dict[str, Any], moto: Server) -> None:
    """The previous record's incomplete unit is scored again. Whether some other run indexed
    a complete unit for its key is one look at the index for the whole run (one listing of
    the segments and one read of each), never a read per unit; a complete unit the record
    names needs no look at all."""
    from evalsnap.pipeline import hints, reuse
    from evalsnap.records import ScoreUnit, repo, segments

    record = _record(moto, cold["prefix"], cold["json"]["record_id"])
    store = repo.open_store(f"s3://{BUCKET}/{cold['prefix']}", {
        "endpoint_url": moto.url, "key": "testing", "secret": "testing"})
    store.new_run()
    units = {u["unit_fingerprint"]: repo.find(store, ScoreUnit, u["unit_oid"])
             for u in record["units"]}
    store.new_run()  # what finding them read is forgotten
    incomplete = [fp for fp, unit in units.items() if not unit.complete]
    complete = [fp for fp, unit in units.items() if unit.complete]
    assert incomplete and complete
    hints.prime(store, record["eval_set_id"])
    before = store.requests.snapshot()
    assert all(isinstance(reuse.find_unit(store, fp), tuple) for fp in complete)
    assert store.requests.snapshot() == before  # the record's units: nothing asked
    assert all(reuse.find_unit(store, fp) == "incomplete before" for fp in incomplete)
    after = store.requests.snapshot()
    listed = [n for n in store.list_refs(segments.NAMESPACE) if n.startswith("units-")]
    assert after["get"] - before["get"] == len(listed)  # each unit segment read once
    assert after["list"] - before["list"] <= 2  # the segments; the per-key index of old stores

    store.new_run()  # no hints: the index alone, with the same answers
    assert reuse.find_unit(store, incomplete[0]) == "incomplete before"
    assert all(isinstance(reuse.find_unit(store, fp), tuple) for fp in complete)


def test_priming_opens_the_records_packs_a_few_at_a_time(
        cold: dict[str, Any], moto: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a rerun proves from the previous record's packs, it proves a few packs at a
    time, letting each batch go (opened all at once, a 30,030-case rerun held every member:
    3,079 MiB); the hints are the same whatever the batch."""
    from evalsnap.pipeline import hints
    from evalsnap.records import repo

    record = _record(moto, cold["prefix"], cold["json"]["record_id"])
    assert len(record["packs"]) > 1, record["packs"]

    def primed(at_once: int) -> tuple[Any, list[int]]:
        monkeypatch.setattr(hints, "PACKS_AT_ONCE", at_once)
        store = repo.open_store(f"s3://{BUCKET}/{cold['prefix']}", {
            "endpoint_url": moto.url, "key": "testing", "secret": "testing"})
        store.new_run()
        opened: list[int] = []
        real = store.open_packs

        def counted(oids: Any, **kw: Any) -> Any:
            oids = list(oids)
            opened.append(len(oids))
            return real(oids, **kw)

        monkeypatch.setattr(store, "open_packs", counted)
        return hints.prime(store, record["eval_set_id"]), opened

    one, opened_one = primed(1)
    whole, opened_whole = primed(1000)
    assert max(opened_one) == 1 and max(opened_whole) > 1  # (the latest record's packs)
    assert (one.units, one.inferences, one.committed_inferences) == (
        whole.units, whole.inferences, whole.committed_inferences)
    assert one.units and one.inferences


def _complete(result: dict[str, Any], key: tuple[str, str]) -> bool:
    case = next(c for c in result["cases"] if c["eval_id"] == key[0])
    return bool(case["metrics"][key[1]]["complete"])


def test_damage_in_the_bucket_is_never_reused(cold: dict[str, Any], agent: Path,
                                             moto: Server) -> None:
    # the cold run's store, copied in the bucket before anything else used it
    prefix = cold["copy"]
    url = f"s3://{BUCKET}/{prefix}"
    env = cold["env"]
    evalset = str(agent / "shop.evalset.json")
    first = cold["json"]
    record = _record(moto, prefix, first["record_id"])
    client = _client(moto)
    units = [u for u in record["units"] if u["metric_name"] == "response_match_score"]
    damaged_unit = units[0]
    # a unit's only copy is its member of a scoring task's pack: damaged there (the pack no
    # longer hashes to its name; its other members still match theirs)
    _packs.damage_member(_Bucket(moto, prefix), "unit", damaged_unit["unit_oid"])
    # a damaged index segment: the previous record still names its units, so they are
    # reused (it costs no work); verify reports it
    [segment] = [k for k in _keys(moto, f"{prefix}/v1/refs/index/segments/units-")]
    client.put_object(Bucket=BUCKET, Key=segment, Body=b"{not json")
    gone = record["inference"][2]
    client.delete_object(Bucket=BUCKET, Key=_object_key(prefix, "inference", gone["inference_oid"]))
    # a pack that is not one: the inference records' pack (their loose copies stay)
    pack = record["packs"][-1]
    assert {m["kind"] for m in json.loads(_Bucket(moto, prefix).read(
        _object_key("", "pack", pack).lstrip("/")))["members"]} == {"inference"}
    client.put_object(Bucket=BUCKET, Key=_object_key(prefix, "pack", pack), Body=b"[]")

    verify = run_inproc("verify", "--store", url, "--json", env=env)
    assert verify.code == 1
    found = json.dumps(verify.json)
    for oid in (damaged_unit["unit_oid"], gone["inference_oid"], pack):
        assert oid.split(":")[1][2:] in found or oid in found, oid
    assert segment.rsplit("/", 1)[1] in found

    # in this process (tests._cli: no memo of the run before); the no-op rerun above is
    # the one in a new process
    again = run_inproc("run", str(agent), evalset, "--store", url, "--json", "--reuse", env=env)
    out = again.json
    reused = _reused(out)
    assert not reused[(damaged_unit["eval_id"], "response_match_score")]
    assert out["agent_calls"] > 0  # the deleted inference, and only it, ran again (its units:
    # the scripted agent answers the same, so their keys are unchanged and they are reused)
    cases = {c["eval_id"]: c for c in out["cases"]}
    assert [e for e, c in cases.items() if not c["inference_reused"]] == [gone["eval_id"]]
    assert _verdicts(out) == _verdicts(first)
    untouched = set(reused) - {(damaged_unit["eval_id"], "response_match_score")}
    assert {k for k in untouched if reused[k]} == {k for k in untouched if _complete(first, k)}


def _object_key(prefix: str, kind: str, oid: str) -> str:
    hexd = oid.split(":")[1]
    return f"{prefix}/v1/objects/{kind}/{hexd[:2]}/{hexd[2:]}"


def _record(moto: Server, prefix: str, oid: str) -> dict[str, Any]:
    body = _client(moto).get_object(Bucket=BUCKET, Key=_object_key(prefix, "record", oid))
    data = body["Body"].read()
    assert "sha256:" + hashlib.sha256(data).hexdigest() == oid
    return json.loads(data)


def test_the_summary_artifact_shows_what_the_run_cost_the_store(cold: dict[str, Any]) -> None:
    from evalsnap.reports.artifacts import summary_markdown

    counts = cold["json"]["store_requests"]
    text = summary_markdown(cold["json"], f"s3://{BUCKET}/{cold['prefix']}")
    assert (f"| store requests | {counts['total']} ({counts['list']} list, {counts['head']} head, "
            f"{counts['get']} get, {counts['put']} put, {counts['delete']} delete) |") in text


def test_a_metric_scored_in_chunks_packs_every_unit_it_scored(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A metric task scores, writes and packs a chunk of its cases at a time (bounded memory
    at 10,000 cases): with chunks of 4 of the demo's 13 cases, every unit the run scored is
    in one of the record's packs (so a rerun reads packs, not objects), and a no-op rerun
    reuses all of it."""
    from evalsnap.pipeline import score
    from evalsnap.records import EvaluationRecord, pack, repo
    from storage import Store

    monkeypatch.setattr(score, "CHUNK", 4)
    agent = copy_shop(tmp_path / "shop_agent")
    store = tmp_path / "store"
    args = ("run", str(agent), str(agent / "shop.evalset.json"), "--store", str(store), "--json")
    cold = run_inproc(*args)  # in this process (91 units: no scoring process either)
    assert cold.code == 3, cold.stderr[-3000:]  # the demo is incomplete by design
    s = Store(str(store))
    record = repo.get(s, EvaluationRecord, cold.json["record_id"])
    units_of = {p: {oid for (kind, oid) in pack.read_pack(s.get_object(pack.KIND, p), where=p)
                    if kind == "unit"} for p in record.packs}
    packed_units = set().union(*units_of.values())
    scored = {u.unit_oid for u in record.units if not u.reused}
    assert scored and scored <= packed_units, \
        f"expected every scored unit in a pack; {len(scored - packed_units)} are not"
    metrics = {u.metric_name for u in record.units}
    unit_packs = [p for p, units in units_of.items() if units]
    assert len(unit_packs) >= 3 * len(metrics), \
        f"expected a pack per chunk of 4 cases (13 cases: 4 per metric), got {len(unit_packs)} " \
        f"for {len(metrics)} metrics"
    warm = run_inproc(*args, "--reuse")
    assert (warm.json["agent_calls"], warm.json["judge_calls"]) == (0, 0)
    assert _verdicts(warm.json) == _verdicts(cold.json)
