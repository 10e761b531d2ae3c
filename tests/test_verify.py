"""``evalsnap verify`` logic on small hand-built stores (no agent, no Prefect): every object
re-hashed and parsed, every manifest's checksum and links followed."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from evalsnap.records import (
    EvaluationRecord,
    InferenceRecord,
    InferenceRef,
    LedgerEntry,
    ManifestEntry,
    RunManifest,
    RunSummary,
    ScoreUnit,
    Snapshot,
    UnitRef,
    repo,
)
from evalsnap.reports.verify import verify_store
from storage import Store
from tests._cli import run_inproc

FP = "sha256:" + "ab" * 32


def _store(tmp_path: Path, local: bool) -> Store:
    return Store(str(tmp_path / "store") if local else f"memory://verify-{uuid.uuid4().hex}")


def _build(store: Store, run_id: str = "run-1", *, skip: str | None = None) -> dict[str, str]:
    """One consistent run: inference, judge entry, unit, snapshot, record, manifest."""
    inference = InferenceRecord(inference_fingerprint=FP, eval_set_id="es", eval_id="c1",
                                app_name="app", agent_name="root", adk_version="x",
                                status="success", run_id=run_id)
    oids = {"inference": repo.put(store, inference)}
    entry = LedgerEntry(metric_name="m", eval_id="c1", sample_index=0, request_key="k",
                        judge_model={"model": "j"}, request={"contents": []},
                        raw_response="ok", parse_ok=True, evaluator="E",
                        aggregation_version="v", run_id=run_id)
    oids["judge"] = repo.put(store, entry)
    unit = ScoreUnit(unit_fingerprint=FP, case_fingerprint=FP, rule_fingerprint=FP,
                     eval_id="c1", metric_name="m", threshold=0.5, score=1.0,
                     status="PASSED", complete=True, ledger=[oids["judge"]], run_id=run_id)
    oids["unit"] = repo.put(store, unit)
    snapshot = Snapshot(eval_set_id="es", app_name="app", adk_version="x", cases=[], rules=[])
    oids["snapshot"] = repo.put(store, snapshot)
    record = EvaluationRecord(
        run_id=run_id, eval_set_id="es", app_name="app", snapshot_oid=oids["snapshot"],
        inference=[InferenceRef(eval_id="c1", inference_oid=oids["inference"],
                                inference_fingerprint=FP, status="success", reused=False)],
        units=[UnitRef(eval_id="c1", metric_name="m", unit_oid=oids["unit"],
                       unit_fingerprint=FP, case_fingerprint=FP, rule_fingerprint=FP,
                       reused=False, why="new")],
        summary=RunSummary(complete=True, passed=True, agent_calls=1, judge_calls=1,
                           reused_units=0, scored_units=1))
    oids["record"] = repo.put(store, record)
    listed = [ManifestEntry(kind=k, oid=oids[k])
              for k in ("record", "snapshot", "inference", "unit")]
    repo.write_manifest(store, RunManifest(
        run_id=run_id, eval_set_id="es", app_name="app", record_oid=oids["record"],
        snapshot_oid=oids["snapshot"], objects=listed, passed=True, complete=True,
        created_at="2026-01-01T00:00:00Z"))
    return oids


@pytest.mark.parametrize("local", [True, False], ids=["local", "memory"])
def test_clean_store_verifies(tmp_path: Path, local: bool) -> None:
    store = _store(tmp_path, local)
    _build(store)
    report = verify_store(store)
    assert report.ok, report.findings
    assert report.runs == 1
    assert report.objects == {"inference": 1, "snapshot": 1, "unit": 1, "judge": 1, "record": 1,
                              "pack": 0, "outcomes": 0}


@pytest.mark.parametrize("kind", ["inference", "snapshot", "unit", "judge", "record"])
def test_missing_object_breaks_the_manifest(tmp_path: Path, kind: str) -> None:
    store = _store(tmp_path, local=True)
    oids = _build(store)
    hexd = oids[kind].removeprefix("sha256:")
    (tmp_path / "store" / "v1" / "objects" / kind / hexd[:2] / hexd[2:]).unlink()
    report = verify_store(store)
    hits = [f for f in report.findings if f.kind == "manifest" and f.oid == oids[kind]]
    assert hits and "missing" in hits[0].message and hits[0].run_id == "run-1"


def test_hash_correct_object_that_is_not_a_record_is_reported(tmp_path: Path) -> None:
    store = _store(tmp_path, local=False)
    _build(store)
    bogus = store.put_object("unit", b'{"not": "a unit"}')
    report = verify_store(store)
    assert [f.oid for f in report.findings] == [bogus]
    assert "does not match schema" in report.findings[0].message


def test_future_schema_object_is_reported_not_crashing(tmp_path: Path) -> None:
    store = _store(tmp_path, local=False)
    oid = store.put_object("snapshot", json.dumps({"schema_version": 999}).encode())
    report = verify_store(store)
    assert [f.oid for f in report.findings] == [oid]
    assert "schema_version 999" in report.findings[0].message


def test_stray_file_and_bad_manifest_json_are_reported(tmp_path: Path) -> None:
    store = _store(tmp_path, local=True)
    _build(store)
    stray = tmp_path / "store" / "v1" / "objects" / "unit" / "zz"
    stray.write_bytes(b"junk")
    store.put_ref("runs", "run-2", b"{not json")
    report = verify_store(store)
    assert any(f.location.endswith("/v1/objects/unit/zz") for f in report.findings)
    assert any(f.kind == "manifest" and f.run_id == "run-2" for f in report.findings)


def test_manifest_edited_without_checksum_is_reported(tmp_path: Path) -> None:
    store = _store(tmp_path, local=False)
    _build(store)
    data = json.loads(store.get_ref("runs", "run-1") or b"")
    data["passed"] = False  # a plausible edit that keeps the JSON valid
    store.put_ref("runs", "run-1", json.dumps(data).encode())
    report = verify_store(store)
    assert len(report.findings) == 1 and "checksum" in report.findings[0].message


def test_record_link_outside_the_manifest_is_followed(tmp_path: Path) -> None:
    """The judge entry is not listed in the manifest; it is reached through its unit."""
    store = _store(tmp_path, local=True)
    oids = _build(store)
    hexd = oids["judge"].removeprefix("sha256:")
    path = tmp_path / "store" / "v1" / "objects" / "judge" / hexd[:2] / hexd[2:]
    path.write_bytes(path.read_bytes().replace(b'"ok"', b'"OK"'))
    report = verify_store(store)
    assert {f.kind for f in report.findings} == {"judge", "manifest"}
    assert all(f.oid == oids["judge"] for f in report.findings)


def test_verify_cli_exit_codes_and_json(tmp_path: Path) -> None:
    store = _store(tmp_path, local=True)
    oids = _build(store)
    clean = run_inproc("verify", "--store", store.url, "--json")
    assert clean.code == 0, clean.stderr
    assert clean.json["ok"] and clean.json["runs"] == 1
    hexd = oids["record"].removeprefix("sha256:")
    (tmp_path / "store" / "v1" / "objects" / "record" / hexd[:2] / hexd[2:]).write_bytes(b"{}")
    bad = run_inproc("verify", "--store", store.url)
    assert bad.code == 1
    assert hexd[2:] in bad.stderr and "problem(s) found" in bad.stdout
    missing = run_inproc("verify", "--store", "nope://x")
    assert missing.code == 2 and "unknown protocol" in missing.stderr


@pytest.mark.parametrize("content", [b"", b"{not json", b'{"metadata": {"serializer": {"type": '
                                     b'"pickle"}}, "result": "gASV"}', b"[" * 5000 + b"]" * 5000],
                         ids=["empty", "not-json", "pickle", "nested"])
def test_a_damaged_cached_task_result_is_a_finding_and_deleting_it_clears_it(
        tmp_path: Path, content: bytes) -> None:
    """A full disk leaves 0-byte files in v1/prefect/; verify says so, and its advice works."""
    store = _store(tmp_path, local=True)
    _build(store)
    store.put_task_result("score-" + "0" * 64, content)
    bad = run_inproc("verify", "--store", store.url, "--json")
    assert bad.code == 1, bad.stderr
    (problem,) = bad.json["problems"]
    assert problem["kind"] == "task_result" and "delete the file" in problem["message"]
    assert bad.json["task_results"] == 1
    Path(problem["location"]).unlink()
    assert run_inproc("verify", "--store", store.url).code == 0


@pytest.mark.parametrize("damage", ["deleted", "damaged", "not-rows"])
def test_a_cached_results_outcomes_object_missing_or_damaged_is_a_finding(
        tmp_path: Path, damage: str) -> None:
    """A cached scoring result is the handle of an ``outcomes`` object (issue 31): verify
    names the object when it is gone or damaged, and the cached result that names it."""
    store = _store(tmp_path, local=True)
    _build(store)
    rows = b'{"eval_id": "c", "unit_oid": "sha256:%s"}' % (b"0" * 64)
    body = b"[\n" + rows + b"\n]\n" if damage != "not-rows" else b'[{"a": 1}]'
    oid = store.put_object("outcomes", body)
    handle = json.dumps({"outcomes": oid, "rows": 1})
    store.put_task_result("score-" + "0" * 64, json.dumps(
        {"metadata": {"serializer": {"type": "evalsnap-ids"}}, "result": handle}).encode())
    assert run_inproc("verify", "--store", store.url).code == (0 if damage != "not-rows" else 1)
    path = tmp_path / "store" / "v1" / "objects" / "outcomes" / oid[7:9] / oid[9:]
    if damage == "deleted":
        path.unlink()
    elif damage == "damaged":
        path.write_bytes(body.replace(b'"c"', b'"d"'))
    bad = run_inproc("verify", "--store", store.url, "--json")
    assert bad.code == 1, bad.stderr
    kinds = {p["kind"] for p in bad.json["problems"]}
    assert "task_result" in kinds and any(oid in p["message"] for p in bad.json["problems"]), \
        bad.json["problems"]
    assert (damage == "deleted") == ("outcomes" not in kinds), bad.json["problems"]


def test_a_missing_page_is_noted_not_failed_and_report_writes_it_again(
        golden_demo, tmp_path: Path) -> None:
    """The page is written after the commit, best effort: a store without it is sound
    (``verify`` exits 0 and notes it), and ``report RUN --store-page`` writes it again."""
    _, store, cold = golden_demo.copy(tmp_path)
    run_id, record_id = cold.json["run_id"], cold.json["record_id"]
    page = store / "v1" / "refs" / "reports" / (record_id.removeprefix("sha256:") + ".html")
    original = page.read_bytes()
    clean = run_inproc("verify", "--store", str(store), "--json")
    assert clean.code == 0 and clean.json["notes"] == [], clean.stdout[-2000:]
    page.unlink()
    noted = run_inproc("verify", "--store", str(store), "--json")
    assert noted.code == 0 and noted.json["ok"] is True, noted.stdout[-2000:]
    [note] = noted.json["notes"]
    assert run_id in note and "--store-page" in note
    again = run_inproc("report", run_id, "--store-page", "--store", str(store))
    assert again.code == 0, again.stderr[-2000:]
    assert page.is_file() and page.read_bytes().startswith(b"<!doctype html>")
    assert len(page.read_bytes()) > len(original) // 2
    assert run_inproc("verify", "--store", str(store), "--json").json["notes"] == []
