"""Issue 31: a scoring task's units and judge ledger entries are written only as packs.

* a cold run leaves no loose unit or judge entry: the packs its record names hold them, each
  unit with its ledger entries; every reader finds them there (``show``, ``verify``, reuse);
* a store as the previous evalsnap wrote it (units and entries loose, packs as copies,
  index segments that name no pack) is read as before: a ``--reuse`` run reuses every unit,
  also when the packs are gone and only the loose objects are left;
* ``gc`` keeps a kept run's packs and removes those of a removed run.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from evalsnap.records import EvaluationRecord, ScoreUnit, repo, segments
from storage import Store
from tests import _packs
from tests._cli import run_inproc

METRICS = ["--metric", "response_match_score", "--metric", "final_response_match_v2"]
CASES = ["--case", "weather_paris", "--case", "cart_add_two_items", "--case",
         "greeting_then_weather"]


def _run(golden: dict[str, Any], store: Path, *flags: str) -> Any:
    agent = golden["agent"]
    r = run_inproc("run", str(agent), str(agent / "shop.evalset.json"), "--store", str(store),
                   "--json", *CASES, *METRICS, *flags)
    assert r.code in (0, 1), r.stderr[-3000:]
    return r


@pytest.fixture(scope="module")
def cold(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from tests.conftest import copy_shop

    root = tmp_path_factory.mktemp("packs_only")
    golden = {"agent": copy_shop(root / "agents" / "shop_agent"), "root": root}
    store = root / "store"
    golden["store"] = store
    golden["cold"] = _run(golden, store)
    return golden


def _loose(store: Path, kind: str) -> list[Path]:
    base = store / "v1" / "objects" / kind
    return [p for p in base.rglob("*") if p.is_file()] if base.is_dir() else []


def test_a_cold_run_leaves_units_and_entries_only_in_the_packs_its_record_names(
        cold: dict[str, Any]) -> None:
    store = cold["store"]
    assert _loose(store, "unit") == [] and _loose(store, "judge") == []
    s = Store(str(store))
    record = repo.get(s, EvaluationRecord, cold["cold"].json["record_id"])
    held: dict[str, str] = {}
    for pack_oid in record.packs:
        for m in json.loads(s.get_object("pack", pack_oid))["members"]:
            held[m["oid"]] = m["kind"]
    units = [repo.get(s, ScoreUnit, u.unit_oid) for u in record.units]
    assert {u.unit_oid for u in record.units} <= {o for o, k in held.items() if k == "unit"}
    ledger = {e for u in units for e in u.ledger}
    assert ledger and ledger <= {o for o, k in held.items() if k == "judge"}
    # the judge index's segments name the packs holding the entries they index
    names = [n for n in s.list_refs(segments.NAMESPACE) if n.startswith("judge-")]
    parsed = [segments.parse_segment(s.get_ref(segments.NAMESPACE, n) or b"", where=n)
              for n in names]
    assert parsed and all(set(p.packs) <= set(record.packs) and p.packs for p in parsed)
    # every reader finds them: show (a new process's view), verify
    shown = run_inproc("show", cold["cold"].json["run_id"], "--store", str(store), "--json")
    assert shown.code == 0, shown.stderr[-2000:]
    judged = [m for c in shown.json["cases"] for m in c["metrics"].values() if m.get("ledger")]
    assert judged and all(e["raw_response"] is not None for m in judged for e in m["ledger"])
    verify = run_inproc("verify", "--store", str(store), "--json")
    assert verify.code == 0, verify.json["problems"]


def _as_previous_version(store: Path) -> None:
    """The store as the evalsnap before packs-only wrote it: every unit and judge entry also
    loose (the packs were copies), index segments without their packs."""
    s = Store(str(store))
    for pack_oid in s.iter_objects("pack"):
        for m in json.loads(s.get_object("pack", pack_oid))["members"]:
            if m["kind"] in ("unit", "judge"):
                assert s.put_object(m["kind"], m["text"].encode()) == m["oid"]
    folder = store / "v1" / "refs" / "index" / "segments"
    for path in folder.iterdir():
        body = json.loads(path.read_bytes())
        body.pop("packs", None)
        data = json.dumps(body, separators=(",", ":")).encode()
        segments.parse_segment(data, where=path.name)
        path.write_bytes(data)


def test_a_store_of_the_previous_version_is_reused_whole(cold: dict[str, Any],
                                                         tmp_path: Path) -> None:
    store = tmp_path / "store"
    shutil.copytree(cold["store"], store)
    _as_previous_version(store)
    again = _run(cold, store, "--reuse")
    assert again.json["scored_units"] == 0 and again.json["judge_calls"] == 0
    assert run_inproc("verify", "--store", str(store)).code == 0


def test_loose_units_without_their_packs_are_still_found(cold: dict[str, Any],
                                                         tmp_path: Path) -> None:
    """Units and entries only loose (as before packs existed): readers fall back to them."""
    store = tmp_path / "store"
    shutil.copytree(cold["store"], store)
    _as_previous_version(store)
    s = Store(str(store))
    unit_packs = [p for p in s.iter_objects("pack") if any(
        m["kind"] == "unit" for m in json.loads(s.get_object("pack", p))["members"])]
    assert unit_packs
    for p in unit_packs:
        hexd = p.removeprefix("sha256:")
        (store / "v1" / "objects" / "pack" / hexd[:2] / hexd[2:]).unlink()
    again = _run(cold, store, "--reuse")
    assert again.json["scored_units"] == 0 and again.json["judge_calls"] == 0
    shown = run_inproc("show", cold["cold"].json["run_id"], "--store", str(store), "--json")
    assert shown.code == 0, shown.stderr[-2000:]


def test_repo_find_looks_in_every_pack(cold: dict[str, Any]) -> None:
    s = Store(str(cold["store"]))
    record = repo.get(Store(str(cold["store"])), EvaluationRecord,
                      cold["cold"].json["record_id"])
    oid = record.units[0].unit_oid
    with pytest.raises(Exception, match="not in store"):
        repo.get(s, ScoreUnit, oid)  # nothing said which pack holds it, and none is loose
    assert repo.find(s, ScoreUnit, oid).unit_fingerprint == record.units[0].unit_fingerprint
    assert _packs.member(_packs.Local(cold["store"]), "unit", oid)


def test_gc_keeps_a_kept_runs_packs_and_removes_a_removed_runs(cold: dict[str, Any],
                                                              tmp_path: Path) -> None:
    store = tmp_path / "store"
    shutil.copytree(cold["store"], store)
    first = cold["cold"].json
    # a second run scores again (no --reuse): the same content, so the same packs
    second = _run(cold, store)
    s = Store(str(store))
    packs_before = set(s.iter_objects("pack"))
    gc = run_inproc("gc", "--store", str(store), "--keep-last", "1", "--grace", "0", "--json")
    assert gc.code == 0, gc.stderr[-2000:]
    assert first["run_id"] in {r["run_id"] for r in gc.json["runs_removed"]}
    kept = repo.get(Store(str(store)), EvaluationRecord, second.json["record_id"])
    left = set(Store(str(store)).iter_objects("pack"))
    assert set(kept.packs) <= left <= packs_before
    assert run_inproc("verify", "--store", str(store)).code == 0
    assert run_inproc("show", second.json["run_id"], "--store", str(store)).code == 0
