"""Issue 21 items 3 and 6: a result says only what is true.

* a selected case × metric without a unit makes the run incomplete (``unscored``);
* lineage (``reused_from_run`` / ``reused_from_record``) names only runs that published a
  record: units a killed run left behind are *recovered*, not "reused from" a run that
  ``show`` cannot find.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evalsnap.pipeline.publish import RECOVERED
from tests import _packs
from tests._cli import run_inproc
from tests.conftest import copy_agent, copy_shop

CASES = ["--case", "weather_paris", "--case", "cart_add_two_items"]
METRICS = ["--metric", "response_match_score", "--metric", "tool_trajectory_avg_score"]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("honest")
    agent = copy_shop(root / "agents" / "shop_agent")
    return {"agent": agent, "root": root}


def _run(agent: Path, store: Path, *extra: str):
    return run_inproc("run", str(agent), str(agent / "shop.evalset.json"), "--store", str(store),
                   "--json", *CASES, *METRICS, *extra)


def test_a_rescore_with_a_case_it_cannot_score_is_incomplete(base, tmp_path):
    store = tmp_path / "s"
    first = _run(base["agent"], store)
    assert first.code == 0, first.stderr[-3000:]
    data = json.loads((base["agent"] / "shop.evalset.json").read_text())
    keep = [c for c in data["eval_cases"] if c["eval_id"] in ("weather_paris", "cart_add_two_items")]
    added = {**keep[0], "eval_id": "never_inferred"}
    edited = tmp_path / "edited.evalset.json"
    edited.write_text(json.dumps({**data, "eval_cases": [*keep, added]}))
    r = run_inproc("rescore", first.json["run_id"], "--evalset", str(edited), "--store", str(store),
                *METRICS, "--json")
    assert r.code == 3, r.stderr[-3000:]
    assert r.json["complete"] is False and r.json["passed"] is False
    assert r.json["unscored"] == ["never_inferred/*"]
    shown = run_inproc("show", r.json["record_id"], "--store", str(store), "--json")
    assert shown.json["record"]["summary"]["unscored"] == ["never_inferred/*"]


def test_lineage_never_names_a_run_without_a_manifest(base, tmp_path):
    store = tmp_path / "s"
    first = _run(base["agent"], store)
    assert first.code == 0, first.stderr[-3000:]
    killed = first.json["run_id"]
    # as if the run had been killed after scoring, before its manifest (the commit)
    (store / "v1" / "refs" / "runs" / killed).unlink()
    second = _run(base["agent"], store, "--reuse")
    assert second.code == 0, second.stderr[-3000:]
    units = [m for c in second.json["cases"] for m in c["metrics"].values()]
    assert units and all(u["reused"] for u in units)  # nothing was scored again
    assert {u["why"] for u in units} == {RECOVERED}
    assert all(u["reused_from_run"] is None and u["reused_from_record"] is None for u in units)
    explained = run_inproc("explain", second.json["record_id"], "--store", str(store), "--json")
    assert explained.code == 0 and killed not in explained.stdout
    # the next run reuses them from the run that recovered them, which did publish
    third = _run(base["agent"], store, "--reuse")
    units = [m for c in third.json["cases"] for m in c["metrics"].values()]
    assert {u["reused_from_run"] for u in units} == {second.json["run_id"]}
    assert {u["reused_from_record"] for u in units} == {second.json["record_id"]}
    for run_id in {u["reused_from_run"] for u in units}:
        assert run_inproc("show", run_id, "--store", str(store), "--json").code == 0


def test_a_nul_in_the_eval_set_id_leaves_no_temporary_file(base, tmp_path):
    """The ADK history copy is named after the eval set id: a NUL in it is replaced, and a
    write that fails anyway leaves no ``.tmp-*`` file behind."""
    agent = copy_agent(base["agent"], tmp_path / "agents" / "shop_agent")
    data = json.loads((agent / "shop.evalset.json").read_text())
    odd = agent / "odd.evalset.json"
    odd.write_text(json.dumps({**data, "eval_set_id": "shop\u0000odd"}))
    r = run_inproc("run", str(agent), str(odd), "--store", str(tmp_path / "s"), "--json",
                *CASES, *METRICS)
    assert r.code == 0, r.stderr[-3000:]
    history = agent / ".adk" / "eval_history"
    names = [p.name for p in history.iterdir()]
    assert not [n for n in names if n.startswith(".tmp-")], names
    assert [n for n in names if "shop_odd" in n], names
    assert r.json["adk_history_path"].startswith(str(history))


def _object(store: Path, kind: str, oid: str) -> Path:
    hexd = oid.removeprefix("sha256:")
    return store / "v1" / "objects" / kind / hexd[:2] / hexd[2:]


def test_a_damaged_unit_snapshot_or_ledger_entry_is_repaired_by_the_next_run(base, tmp_path):
    """Objects hold no run id or time (VOLATILE fields), so the next run that does the same
    work writes the same bytes, which replace the damaged copy: `verify` passes again."""
    store = tmp_path / "s"
    judged = ["--metric", "final_response_match_v2"]
    first = run_inproc("run", str(base["agent"]), str(base["agent"] / "shop.evalset.json"),
                    "--store", str(store), "--json", *CASES, *METRICS, *judged)
    assert first.code in (0, 1), first.stderr[-3000:]
    shown = run_inproc("show", first.json["record_id"], "--store", str(store), "--json").json
    metrics = shown["cases"][0]["metrics"]
    damaged = [("unit", metrics["response_match_score"]["unit_oid"]),
               ("judge", metrics["final_response_match_v2"]["ledger"][0]["oid"]),
               ("snapshot", shown["record"]["snapshot_oid"])]
    for kind, oid in damaged:
        if kind in ("unit", "judge"):  # their only copy: a member of a scoring task's pack
            _packs.damage_member(_packs.Local(store), kind, oid, '{"damaged": true}')
        else:
            _object(store, kind, oid).write_bytes(b'{"damaged": true}')
    broken = run_inproc("verify", "--store", str(store), "--json")
    assert broken.code == 1
    assert {p["oid"] for p in broken.json["problems"]} >= {oid for _, oid in damaged}
    # verify's advice: --reuse keeps the sound inference, --force scores (and asks the judge)
    # again, so every unit, ledger entry and the snapshot are written again, byte for byte
    assert "--reuse --force" in broken.stdout + json.dumps(broken.json)
    again = run_inproc("run", str(base["agent"]), str(base["agent"] / "shop.evalset.json"),
                    "--store", str(store), "--json", "--reuse", "--force", *CASES, *METRICS,
                    *judged)
    assert again.code == first.code, again.stderr[-3000:]
    fixed = run_inproc("verify", "--store", str(store), "--json")
    assert fixed.code == 0, fixed.json["problems"]
    for kind, oid in damaged:  # the very objects the first run's record names, sound again
        if kind in ("unit", "judge"):  # (member() checks the bytes hash to the id)
            assert _packs.member(_packs.Local(store), kind, oid) != b'{"damaged": true}'
        else:
            assert _object(store, kind, oid).read_bytes() != b'{"damaged": true}'
    assert run_inproc("show", first.json["record_id"], "--store", str(store)).code == 0


@pytest.mark.parametrize("units, missing", [
    ([("a", 0, "m1"), ("a", 0, "m2"), ("b", 0, "m1"), ("b", 0, "m2")], []),
    ([("a", 0, "m1"), ("a", 0, "m2"), ("b", 0, "m1")], ["b#0/m2"]),
    # as many units as pairs, and still one missing: a unit twice does not stand for another
    ([("a", 0, "m1"), ("a", 0, "m2"), ("b", 0, "m1"), ("b", 0, "m1")], ["b#0/m2"]),
    ([("a", 0, "m1"), ("a", 0, "m2"), ("b", 0, "m1"), ("c", 0, "m2")], ["b#0/m2"]),
    ([], ["a#0/m1", "a#0/m2", "b#0/m1", "b#0/m2"]),
])
def test_every_selected_case_metric_pair_without_its_unit_is_unscored(
        units: list[tuple[str, int, str]], missing: list[str]) -> None:
    """Publish counts and sums the units' keys as they pass (no set of 210,000 of them); a
    pair without its unit is still named, whatever else the units hold."""
    from types import SimpleNamespace

    from evalsnap.pipeline import publish

    snapshot = SimpleNamespace(rules=[SimpleNamespace(metric_name="m1"),
                                      SimpleNamespace(metric_name="m2")])
    inference = [SimpleNamespace(eval_id=e, repetition=0) for e in ("a", "b")]
    outcomes = [SimpleNamespace(eval_id=e, repetition=r, metric_name=m) for e, r, m in units]
    have = (len(outcomes), sum(publish._unit_key(*u) for u in units))
    assert publish._unscored(snapshot, inference, outcomes, have,  # type: ignore[arg-type]
                             ["x"]) == ["x/*", *missing]
