"""Issue 9 (corruption): a flipped byte in any stored object kind, or in a manifest, is found
by ``verify``; a ``--reuse`` run afterwards recomputes or fails with exit 2 naming the
object — it never uses the damaged bytes.

One cold run builds a local store; each test damages its own copy of it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from evalsnap.errors import CorruptRecordError
from evalsnap.records import EvaluationRecord, FrozenCase, LedgerEntry, ScoreUnit, _base, repo
from evalsnap.reports.verify import verify_store
from evalsnap.rows import Rows
from storage import Store
from tests import _packs
from tests._cli import run_inproc

KINDS = ["inference", "snapshot", "unit", "judge", "record", "manifest"]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, golden_demo: Any) -> dict[str, Any]:
    """A copy of the session's cold demo run (tests._golden), to damage."""
    root = tmp_path_factory.mktemp("corruption")
    agent, store, cold = golden_demo.copy(root)
    assert cold.code in (1, 3), cold.stderr[-3000:]
    s = Store(str(store))
    record = repo.get(s, EvaluationRecord, cold.json["record_id"])
    snapshot = repo.get_snapshot(s, record.snapshot_oid)
    judge_metrics = {r.metric_name for r in snapshot.rules if r.judge}
    shared = [i.inference_fingerprint for i in record.inference]
    # cases with identical inputs share a fingerprint: another sound copy could stand in
    ok_cases = [i.eval_id for i in record.inference
                if i.status == "success" and shared.count(i.inference_fingerprint) == 1]
    units = {(u.eval_id, u.metric_name): u for u in record.units}
    # three different cases, so each damage is seen on its own
    inf_case, unit_case, judge_case = ok_cases[0], ok_cases[1], ok_cases[2]
    plain_metric = next(m for (c, m) in units if c == unit_case and m not in judge_metrics)
    judge_metric = next(m for (c, m) in units if c == judge_case and m in judge_metrics
                        and repo.get(s, ScoreUnit, units[(c, m)].unit_oid).ledger)
    judge_unit = repo.get(s, ScoreUnit, units[(judge_case, judge_metric)].unit_oid)
    targets = {
        "inference": next(i.inference_oid for i in record.inference if i.eval_id == inf_case),
        "snapshot": record.snapshot_oid,
        "unit": units[(unit_case, plain_metric)].unit_oid,
        "judge": judge_unit.ledger[0],
        "judge_unit": units[(judge_case, judge_metric)].unit_oid,
        "record": cold.json["record_id"],
    }
    return {"root": root, "agent": agent, "store": store, "cold": cold, "targets": targets,
            "inf_case": inf_case, "unit_key": (unit_case, plain_metric),
            "judge_key": (judge_case, judge_metric), "run_id": cold.json["run_id"]}


def _copy(base: dict[str, Any], name: str) -> Path:
    dst = base["root"] / f"store-{name}"
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(base["store"], dst)
    return dst


def _path_of(store: Path, base: dict[str, Any], kind: str) -> Path:
    if kind == "manifest":
        return store / "v1" / "refs" / "runs" / base["run_id"]
    target = base["targets"][kind]
    hexd = target.removeprefix("sha256:")
    object_kind = "unit" if kind == "judge_unit" else kind
    return store / "v1" / "objects" / object_kind / hexd[:2] / hexd[2:]


def flip_byte(path: Path) -> None:
    """Flip one bit of one byte in the middle: same length, different hash."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


PACKED = {"unit": "unit", "judge": "judge", "judge_unit": "unit"}
"""A scoring task's units and judge entries live only in packs: their damage is a flipped
character of the member's text inside its pack (the pack then no longer hashes to its name,
its other members still match theirs)."""


def damage(store: Path, base: dict[str, Any], kind: str) -> None:
    if kind not in PACKED:
        flip_byte(_path_of(store, base, kind))
        return
    oid = base["targets"][kind]
    text = _packs.member(_packs.Local(store), PACKED[kind], oid).decode()
    middle = len(text) // 2
    flipped = text[:middle] + chr(ord(text[middle]) ^ 0x01) + text[middle + 1:]
    _packs.damage_member(_packs.Local(store), PACKED[kind], oid, flipped)


@pytest.mark.parametrize("kind", KINDS)
def test_a_flipped_byte_is_found_by_verify(base: dict[str, Any], kind: str) -> None:
    store = _copy(base, f"verify-{kind}")
    damage(store, base, kind)
    report = verify_store(Store(str(store)))
    assert not report.ok
    if kind == "manifest":
        assert any(f.kind == "manifest" and f.run_id == base["run_id"] and "checksum" in
                   f.message for f in report.findings), report.findings
        return
    target = base["targets"][kind]
    direct = [f for f in report.findings if f.kind == kind and f.oid == target]
    assert direct and "corrupt" in direct[0].message, report.findings
    # and the run that depends on it is flagged through its manifest
    assert any(f.kind == "manifest" and f.oid == target for f in report.findings)


def test_verify_cli_exits_0_when_clean_and_1_naming_the_object(base: dict[str, Any]) -> None:
    clean = run_inproc("verify", "--store", str(base["store"]))
    assert clean.code == 0, clean.stdout + clean.stderr
    store = _copy(base, "verify-cli")
    damage(store, base, "unit")
    damaged = run_inproc("verify", "--store", str(store))
    assert damaged.code == 1
    assert base["targets"]["unit"].removeprefix("sha256:")[2:] in damaged.stderr
    as_json = run_inproc("verify", "--store", str(store), "--json")
    assert as_json.code == 1 and not as_json.json["ok"]
    assert base["targets"]["unit"] in {p["oid"] for p in as_json.json["problems"]}


def _reuse_after(base: dict[str, Any], name: str, kinds: tuple[str, ...]) -> dict[str, Any]:
    store = _copy(base, name)
    for kind in kinds:
        damage(store, base, kind)
    warm = run_inproc("run", str(base["agent"]), str(base["agent"] / "shop.evalset.json"),
                   "--store", str(store), "--json", "--reuse")
    return {"store": store, "warm": warm}


@pytest.fixture(scope="module")
def reuse_after_leaf_damage(base: dict[str, Any]) -> dict[str, Any]:
    """Damaged unit and judge entry (with its unit); then ``run --reuse``."""
    return _reuse_after(base, "reuse-leaves", ("unit", "judge", "judge_unit"))


def test_reuse_after_a_damaged_inference_recomputes_or_fails_naming_it(
        base: dict[str, Any]) -> None:
    damaged = _reuse_after(base, "reuse-inference", ("inference",))
    warm, target = damaged["warm"], base["targets"]["inference"]
    if warm.code == 2:
        assert target.removeprefix("sha256:")[2:] in warm.stderr, warm.stderr[-3000:]
        return
    assert warm.code == base["cold"].code, warm.stderr[-3000:]
    cases = {c["eval_id"]: c for c in warm.json["cases"]}
    assert not cases[base["inf_case"]]["inference_reused"]
    assert warm.json["agent_calls"] > 0
    record = repo.get(Store(str(damaged["store"])), EvaluationRecord, warm.json["record_id"])
    assert target not in {i.inference_oid for i in record.inference}


def test_reuse_rescores_a_damaged_unit_and_never_uses_a_damaged_judge_answer(
        base: dict[str, Any], reuse_after_leaf_damage: dict[str, Any]) -> None:
    warm = reuse_after_leaf_damage["warm"]
    s = Store(str(reuse_after_leaf_damage["store"]))
    record = repo.get(s, EvaluationRecord, warm.json["record_id"])
    refs = {(u.eval_id, u.metric_name): u for u in record.units}
    for key in (base["unit_key"], base["judge_key"]):
        assert not refs[key].reused, key
        repo.get(s, ScoreUnit, refs[key].unit_oid)  # sound (the same work: perhaps the same id)
    judge_unit = repo.get(s, ScoreUnit, refs[base["judge_key"]].unit_oid)
    for entry in judge_unit.ledger:
        repo.get(s, LedgerEntry, entry)
    assert warm.json["judge_calls"] >= 1  # the damaged sample was asked again
    scores = {(c["eval_id"], m): (v["score"], v["status"])
              for c in warm.json["cases"] for m, v in c["metrics"].items()}
    cold = {(c["eval_id"], m): (v["score"], v["status"])
            for c in base["cold"].json["cases"] for m, v in c["metrics"].items()}
    for key in (base["unit_key"], base["judge_key"]):  # recomputed from sound inputs
        assert scores[key] == cold[key], key
    # the new run is sound, and so are the damaged objects: scoring the same inputs again
    # wrote the same bytes over them (objects hold no run id or time)
    report = verify_store(s)
    assert not [f for f in report.findings if f.run_id == warm.json["run_id"]]
    assert not {base["targets"][k] for k in ("unit", "judge")} & {
        f.oid for f in report.findings}


@pytest.fixture(scope="module")
def reuse_after_published_damage(base: dict[str, Any]) -> dict[str, Any]:
    """Damaged snapshot, record and manifest of the earlier run; then ``run --reuse``."""
    return _reuse_after(base, "reuse-published", ("snapshot", "record", "manifest"))


def test_reuse_after_damaged_snapshot_record_manifest_recomputes_or_fails_clearly(
        base: dict[str, Any], reuse_after_published_damage: dict[str, Any]) -> None:
    warm = reuse_after_published_damage["warm"]
    damaged = {base["targets"]["snapshot"], base["targets"]["record"]}
    if warm.code == 2:
        assert any(oid.removeprefix("sha256:")[2:] in warm.stderr or oid in warm.stderr
                   for oid in damaged) or base["run_id"] in warm.stderr, warm.stderr[-3000:]
        return
    assert warm.code == base["cold"].code, warm.stderr[-3000:]
    out = warm.json
    assert out["parent_record"] not in damaged
    s = Store(str(reuse_after_published_damage["store"]))
    repo.get_snapshot(s, out["snapshot_id"])  # sound: the same freeze repairs a damaged copy
    record = repo.get(s, EvaluationRecord, out["record_id"])
    assert all(u.reused_from_record not in damaged for u in record.units)
    report = verify_store(s)
    assert not [f for f in report.findings if f.run_id == out["run_id"]]


def test_a_units_verdict_is_read_and_checked_as_the_unit_is(base: dict[str, Any]) -> None:
    """What summaries and pages hold of a unit (its verdict) is the stored unit's verdict, and
    a damaged unit gives the same typed error as reading the unit itself."""
    from evalsnap.errors import EvalsnapError

    store = _copy(base, "verdict")
    oid = base["targets"]["judge_unit"]

    def reader() -> Store:
        """A store that read the record (which says which packs hold its units)."""
        s = Store(str(store))
        repo.get(s, EvaluationRecord, base["targets"]["record"])
        return s

    unit = repo.get(reader(), ScoreUnit, oid)
    verdict = repo.get_unit_verdict(reader(), oid)
    assert (verdict.score, verdict.status, verdict.metric_status, verdict.gate_score,
            verdict.threshold, verdict.complete, verdict.reason, verdict.judge_calls,
            verdict.trace) == (unit.score, unit.status, unit.metric_status, unit.gate_score,
                               unit.threshold, unit.complete, unit.reason, unit.judge_calls,
                               unit.trace)
    assert [(r.score, r.status) for r in verdict.rows] == [(r.score, r.status) for r in unit.rows]
    assert verdict.rows, "expected the judge unit to have invocation rows"
    damage(store, base, "judge_unit")
    with pytest.raises(EvalsnapError) as direct:
        repo.get(reader(), ScoreUnit, oid)
    with pytest.raises(EvalsnapError) as viewed:
        repo.get_unit_verdict(reader(), oid)
    assert type(viewed.value) is type(direct.value) and oid in str(viewed.value)


def test_long_records_are_written_as_the_same_bytes_an_item_at_a_time(base: dict[str, Any]) -> None:
    """A record's and a snapshot's bytes, encoded a unit (case) at a time, are exactly those
    of the whole model as one sorted dict: same objects, same ids, as earlier versions wrote."""
    from evalsnap.records import Snapshot

    s = Store(str(base["store"]))
    record = repo.get(s, EvaluationRecord, base["targets"]["record"])
    snapshot = repo.get_snapshot(s, record.snapshot_oid)
    many = record.model_copy(update={"units": list(record.units) * 10})  # beyond the item-wise limit
    cases = snapshot.model_copy(update={"cases": list(snapshot.cases) * 10})
    rows = snapshot.model_copy(update={"cases": Rows(FrozenCase, list(snapshot.cases) * 10)})
    for model in (record, snapshot, many, cases, rows):
        whole = json.dumps(model.model_dump(mode="json", exclude=set(model.VOLATILE)),
                           sort_keys=True, ensure_ascii=False, allow_nan=False).encode()
        assert model.to_bytes() == whole, f"expected the same bytes for {model.KIND}"
    assert len(many.units) > _base._LONG and len(cases.cases) > _base._LONG
    assert rows.to_bytes() == cases.to_bytes()
    assert isinstance(record.units, Rows) and isinstance(record.inference, Rows)  # read lazily
    assert EvaluationRecord.from_bytes(many.to_bytes()) == many
    again = Snapshot.from_bytes(cases.to_bytes())
    assert isinstance(again.cases, Rows) and again == cases  # read a case at a time
    assert again.to_bytes() == cases.to_bytes() and b"".join(again.iter_bytes()) == cases.to_bytes()


def test_a_snapshot_read_a_case_at_a_time_refuses_what_the_strict_read_refuses(
        base: dict[str, Any]) -> None:
    """Issue 31 (memory): a snapshot's cases are read one at a time into rows; any bytes the
    strict parse refuses are refused with its error, and bytes it takes (other spacing, a
    paired surrogate escape) read as the same snapshot."""
    import re

    from evalsnap.records import Snapshot

    s = Store(str(base["store"]))
    record = repo.get(s, EvaluationRecord, base["targets"]["record"])
    snapshot = repo.get_snapshot(s, record.snapshot_oid)
    good = snapshot.to_bytes()
    assert isinstance(Snapshot.from_bytes(good).cases, Rows)
    spaced = json.dumps(json.loads(good), indent=2).encode()
    assert Snapshot.from_bytes(spaced) == snapshot
    paired = good.replace(b'"eval_id": "', b'"eval_id": "\\ud83d\\ude00', 1)
    assert Snapshot.from_bytes(paired).cases[0].eval_id.startswith("\U0001f600")
    first_case = re.search(rb'"inference_ok": (true|false)', good)
    assert first_case is not None
    bad = {
        "NaN in a case": good[:first_case.start()] + b'"inference_ok": NaN' + good[first_case.end():],
        "a lone surrogate": good.replace(b'"eval_id": "', b'"eval_id": "\\ud800', 1),
        "more after the object": good + b" {}",
        "a case missing": good.replace(b'"case_fingerprint"', b'"case_fingerprint_"', 1),
        "cut short": good[:len(good) // 2],
        "not UTF-8": good.replace(b'"eval_id"', b'"\xff"', 1),
        "a deep value": good.replace(b'"reference": {', b'"reference": {"x": ' + b"[" * 5000
                                     + b"]" * 5000 + b", ", 1),
    }
    for why, data in bad.items():
        with pytest.raises(CorruptRecordError) as lazily:
            Snapshot.from_bytes(data, where="x")
        with pytest.raises(CorruptRecordError) as strictly:
            Snapshot.from_data(_base.parse_stored(data, what="snapshot x"), where="x")
        assert str(lazily.value) == str(strictly.value), why
