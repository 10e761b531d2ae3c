"""Issue 9: two ``evalsnap run`` processes on the same eval set and store at the same time.

Both must succeed (a verdict, never a usage/storage error), print valid JSON, publish valid
records; content-addressed objects are written once (the store holds exactly the objects the
two manifests name, and every one of them verifies), and no temporary file is left behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from evalsnap.records import ScoreUnit, repo
from evalsnap.reports.verify import verify_store
from storage import OBJECT_KINDS, Store
from tests._cli import run_inproc
from tests.conftest import ROOT, CliResult, copy_shop

CASES = ["weather_paris", "cart_add_two_items", "cart_add_then_show"]
CONFIG = {"criteria": {"tool_trajectory_avg_score": 1.0, "response_match_score": 0.5,
                       "final_response_match_v2": {"threshold": 0.5, "judgeModelOptions": {
                           "judgeModel": "offline-judge-v1", "numSamples": 1}}}}


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("concurrent")
    agent = copy_shop(base / "agents" / "shop_agent")
    config = base / "test_config.json"
    config.write_text(json.dumps(CONFIG))
    store = base / "store"
    args = [sys.executable, "-m", "evalsnap.cli", "run", str(agent),
            str(agent / "shop.evalset.json"), "--config", str(config), "--store", str(store),
            "--json", *[a for c in CASES for a in ("--case", c)]]
    # Latency keeps the two runs overlapping through inference, scoring and publishing.
    env = {**os.environ, "EVALSNAP_DEMO_LATENCY_MS": "150"}
    procs = [subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=300)
        results.append(CliResult(subprocess.CompletedProcess(args, proc.returncode, stdout,
                                                             stderr)))
    return {"store": store, "agent": agent, "runs": results}


def test_both_runs_succeed_with_one_json_object_each(both: dict[str, Any]) -> None:
    for run in both["runs"]:
        assert run.code in (0, 1, 3), run.stderr[-3000:]
        out = run.json
        assert out["complete"] is True, out
        assert {c["eval_id"] for c in out["cases"]} == set(CASES)
    first, second = (r.json for r in both["runs"])
    assert first["run_id"] != second["run_id"]
    assert first["record_id"] != second["record_id"]
    scores = [{(c["eval_id"], m): (v["score"], v["status"]) for c in out["cases"]
               for m, v in c["metrics"].items()} for out in (first, second)]
    assert scores[0] == scores[1]


def test_both_records_are_valid_and_shown(both: dict[str, Any]) -> None:
    for run in both["runs"]:
        shown = run_inproc("show", run.json["run_id"], "--store", str(both["store"]), "--json")
        assert shown.code == 0, shown.stderr[-3000:]
        assert shown.json["record_id"] == run.json["record_id"]
        assert shown.json["record"]["run_id"] == run.json["run_id"]
        assert {c["eval_id"] for c in shown.json["cases"]} == set(CASES)


def test_objects_are_written_once_and_all_verify(both: dict[str, Any]) -> None:
    store = Store(str(both["store"]))
    assert store.verify() == []
    report = verify_store(store)
    assert report.ok and report.runs == 2, report.findings
    assert list(Path(both["store"]).rglob(".tmp-*")) == []
    assert list(Path(both["agent"]).rglob(".tmp-*")) == []
    named: dict[str, set[str]] = {kind: set() for kind in OBJECT_KINDS}
    for run_id in store.list_refs("runs"):
        manifest = json.loads(store.get_ref("runs", run_id) or b"{}")
        for entry in manifest["objects"]:
            named[entry["kind"]].add(entry["oid"])
        # a unit a listed pack holds is named by the record alone (the manifest lists packs)
        assert all(e["kind"] != "unit" for e in manifest["objects"]), manifest["objects"]
        record = json.loads(store.get_object("record", manifest["record_oid"]))
        named["unit"].update(u["unit_oid"] for u in record["units"])
    # a scoring task's units and judge entries live only in packs (the manifests list those)
    held: dict[str, dict[str, bytes]] = {"unit": {}, "judge": {}}
    for oid in named["pack"]:
        for m in json.loads(store.get_object("pack", oid))["members"]:
            if m["kind"] in held:
                held[m["kind"]][m["oid"]] = m["text"].encode()
    for name in store.list_task_results():  # a cached scoring result names its outcomes
        result = json.loads(json.loads(store.get_task_result(name) or b"")["result"])
        if isinstance(result, dict):
            named["outcomes"].add(result["outcomes"])
    assert named["outcomes"], "expected the scoring tasks' cached results to name outcomes"
    # both runs scored each metric under one cache key: the cached result of the run that
    # wrote last names its outcomes; the other run's are gc's (named by nothing)
    stored = set(store.iter_objects("outcomes"))
    assert named["outcomes"] <= stored and len(stored) <= 2 * len(named["outcomes"]), stored
    named["outcomes"] = stored
    for oid in named["unit"]:  # judge ledger entries are named by their units
        named["judge"].update(json.loads(held["unit"][oid])["ledger"])
    assert named["judge"], "the judge metric wrote no ledger entry"
    for kind in OBJECT_KINDS:
        stored = list(store.iter_objects(kind))
        assert len(stored) == len(set(stored)), kind
        # Exactly what the manifests name: an object both runs produced is stored once,
        # and no run left an orphan copy of anything.
        if kind in held:
            assert stored == [] and set(held[kind]) == named[kind], \
                (kind, stored, set(held[kind]) ^ named[kind])
        else:
            assert set(stored) == named[kind], (kind, set(stored) ^ named[kind])


def test_indexes_point_at_sound_objects(both: dict[str, Any]) -> None:
    store = Store(str(both["store"]))
    for name in store.list_refs("index/inference"):
        entry = json.loads(store.get_ref("index/inference", name) or b"")
        store.get_object("inference", entry["oid"])  # raises if missing or corrupt
    for name in store.list_refs("index/unit"):
        entry = json.loads(store.get_ref("index/unit", name) or b"")
        repo.find(store, ScoreUnit, entry["unit_oid"])
        store.get_object("record", entry["record_oid"])
