"""Reading the run history cheaply: `latest` names the newest readable run by its
manifest's created_at, as `ls` orders them, without validating every manifest of a store
that has years of runs; a rescore's plan reads each inference's run id without validating
its conversation."""

from __future__ import annotations

from pathlib import Path

import pytest

from evalsnap.errors import NotFoundError
from evalsnap.records import RunManifest, repo
from tests._cli import run_inproc


def _manifest(run_id: str, created_at: str) -> RunManifest:
    return RunManifest(run_id=run_id, eval_set_id="set", app_name="app",
                       record_oid="sha256:" + run_id.encode().hex().ljust(64, "0")[:64],
                       snapshot_oid=None, objects=[], passed=True, complete=True,
                       created_at=created_at)


def test_latest_is_the_newest_readable_manifest_in_list_order(tmp_path: Path):
    store = repo.open_store(str(tmp_path / "store"))
    with pytest.raises(NotFoundError, match="holds no runs yet"):
        repo.resolve_record(store, "latest")
    # names do not sort like creation times: an imported run, a clock set back
    for run_id, created in [("20261130T010000Z-aaaaaa", "2026-11-30T01:00:00+00:00"),
                            ("zz-imported", "2026-11-29T00:00:00+00:00"),
                            ("00-newest", "2026-11-30T02:00:00+00:00"),
                            ("20261130T030000Z-broken", "2026-11-30T03:00:00+00:00")]:
        repo.write_manifest(store, _manifest(run_id, created))
    # the newest by created_at is damaged: it is skipped, as `ls` skips it
    broken = "20261130T030000Z-broken"
    data = store.get_ref("runs", broken)
    assert data is not None
    store.put_ref("runs", broken, data.replace(b'"passed": true', b'"passed": false'))

    assert repo.latest_manifest(store).run_id == "00-newest"
    assert repo.latest_manifest(store) == repo.list_manifests(store)[0]
    with pytest.raises(NotFoundError):  # the record object itself was never written
        repo.resolve_record(store, "latest")


def test_inference_run_id_reads_the_run_without_validating_the_conversation(
        tmp_path: Path, shop_copy: Path):
    url = str(tmp_path / "store")
    r = run_inproc("run", str(shop_copy), str(shop_copy / "shop.evalset.json"), "--store", url,
                "--case", "weather_paris", "--case", "cart_add_two_items",
                "--metric", "response_match_score", "--json")
    assert r.code in (0, 1), f"expected the run to finish, got {r.code}: {r.stderr[-3000:]}"
    run_id = r.json["run_id"]
    store = repo.open_store(url)
    _, record = repo.resolve_record(store, run_id)
    assert len(record.inference) == 2, "expected one inference per case"
    for inference in record.inference:
        assert repo.inference_run_id(store, inference.inference_oid) == \
            repo.get_inference(store, inference.inference_oid).run_id == run_id, \
            "expected the inference's run id read cheaply to be the run that made it"
    with pytest.raises(NotFoundError, match="not in store"):
        repo.inference_run_id(store, "sha256:" + "f" * 64)
