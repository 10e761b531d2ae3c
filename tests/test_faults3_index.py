"""Issue 29 items 11 and 12, through the CLI on a local store.

* 11: ``latest`` goes by when the store wrote a manifest, not by the date a manifest claims:
  a planted manifest dated 2099 (checksum recomputed) is not ``latest``, and ``verify``
  flags its date.
* 12: an index entry that names an object no committed run names (a killed ``--force`` run's
  inference, removed by gc) does not cost the agent calls a kept record could spare: the
  index is rebuilt from the previous committed record, 0 agent calls.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from evalsnap.records import RunManifest, repo
from tests._cli import run_inproc


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, golden_demo: Any) -> dict[str, Any]:
    """A copy of the session's cold demo run (tests/_golden.py)."""
    agent, store, cold = golden_demo.copy(tmp_path_factory.mktemp("faults3-index"))
    assert cold.code == 3, cold.stderr[-3000:]
    return {"agent": agent, "store": store, "cold": cold.json}


def test_a_manifest_dated_in_the_future_is_not_latest(world: dict[str, Any]) -> None:
    store = world["store"]
    run_id = world["cold"]["run_id"]
    runs = store / "v1" / "refs" / "runs"
    data = json.loads((runs / run_id).read_text("utf-8"))
    planted_id = "29990101T000000Z-planted"
    data.update(run_id=planted_id, created_at="2099-01-01T00:00:00Z", checksum="")
    manifest = RunManifest.model_validate(data)
    sealed = manifest.model_copy(update={"checksum": repo.manifest_checksum(manifest)})
    planted = runs / planted_id
    planted.write_bytes(sealed.to_bytes())
    old = time.time() - 86400
    os.utime(planted, (old, old))  # written before the real run, whatever it claims

    shown = run_inproc("show", "latest", "--store", str(store), "--json")
    assert shown.code == 0, shown.stderr[-2000:]
    assert shown.json["record"]["run_id"] == run_id
    verify = run_inproc("verify", "--store", str(store), "--json")
    assert verify.code == 1
    assert "in the future" in json.dumps(verify.json) and planted_id in json.dumps(verify.json)
    planted.unlink()


def test_an_index_entry_naming_a_lost_object_is_rebuilt_from_the_committed_record(
        world: dict[str, Any]) -> None:
    store = world["store"]
    record = json.loads(_object(store, "record", world["cold"]["record_id"]))
    index = store / "v1" / "refs" / "index" / "inference"

    def entry_of(ref: dict[str, Any]) -> Path:
        return index / ref["inference_fingerprint"].split(":")[1]

    # a case whose entry names its own inference (cases with the same inputs share an entry)
    ref = next(i for i in record["inference"]
               if json.loads(entry_of(i).read_text())["oid"] == i["inference_oid"])
    entry = entry_of(ref)
    # what a killed `--force` run leaves once gc removed its orphan inference: the index entry
    # and Prefect's cached results (refreshed by --force) named it, gc removed those results
    entry.write_text(json.dumps({"oid": "sha256:" + "e" * 64, "run_id": "killed-force-run"}))
    shutil.rmtree(store / "v1" / "prefect")

    again = run_inproc("run", str(world["agent"]), str(world["agent"] / "shop.evalset.json"),
                       "--store", str(store), "--json", "--reuse")
    out = again.json
    assert out["agent_calls"] == 0, out["agent_calls"]
    assert {c["eval_id"]: c["inference_reused"] for c in out["cases"]}[ref["eval_id"]]
    assert json.loads(entry.read_text())["oid"] == ref["inference_oid"]  # repaired


def _object(store: Path, kind: str, oid: str) -> str:
    hexd = oid.split(":")[1]
    return (store / "v1" / "objects" / kind / hexd[:2] / hexd[2:]).read_text("utf-8")


def test_a_planted_huge_manifest_or_object_is_never_read_whole(world: dict[str, Any]) -> None:
    """Issue 29 item 5: every stored read has a cap, checked before parsing (on local disk by
    the file's size: nothing is read). Sparse files: gigabytes that cost no disk."""
    from storage.store import MAX_OBJECT_BYTES, MAX_REF_BYTES

    store = world["store"]
    runs = store / "v1" / "refs" / "runs"
    huge = runs / "20000101T000000Z-huge"
    with open(huge, "wb") as handle:
        handle.truncate(MAX_REF_BYTES + 1)
    listed = run_inproc("ls", "--store", str(store))
    assert listed.code == 0 and world["cold"]["run_id"] in listed.stdout
    assert "huge" in listed.stderr and "MiB" in listed.stderr, listed.stderr[-2000:]
    shown = run_inproc("show", "20000101T000000Z-huge", "--store", str(store))
    assert shown.code == 2 and "longer than" in shown.stderr, shown.stderr[-2000:]
    cached = sorted((store / "v1" / "prefect").iterdir())[0]
    kept = cached.read_bytes()
    with open(cached, "r+b") as handle:  # a Prefect cached result, too
        handle.truncate(MAX_REF_BYTES + 1)
    verify = run_inproc("verify", "--store", str(store), "--json")
    assert verify.code == 1, verify.stderr[-2000:]
    found = json.dumps(verify.json)
    assert "20000101T000000Z-huge" in found and cached.name in found
    huge.unlink()
    cached.write_bytes(kept)

    record = Path(_path(store, "record", world["cold"]["record_id"]))
    good = record.read_bytes()
    with open(record, "r+b") as handle:
        handle.truncate(MAX_OBJECT_BYTES + 1)
    try:
        shown = run_inproc("show", world["cold"]["record_id"], "--store", str(store))
        assert shown.code == 2 and "longer than" in shown.stderr, shown.stderr[-2000:]
    finally:
        record.write_bytes(good)


def _path(store: Path, kind: str, oid: str) -> str:
    hexd = oid.split(":")[1]
    return str(store / "v1" / "objects" / kind / hexd[:2] / hexd[2:])
