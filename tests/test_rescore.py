"""``evalsnap rescore`` end to end: frozen inference, edited references, force, bad input.

Every rescore below starts from a copy of the session's one cold ``evalsnap run`` of the demo
(:mod:`tests._golden`), and runs in this process against the session's Prefect server
(:mod:`tests._cli`). Bad-input cases fail before any flow starts, so they run through
typer's runner directly.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evalsnap.records import EvaluationRecord, Snapshot, repo
from tests._cli import run_inproc, score_status
from tests.conftest import SHOP


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory, golden_demo) -> dict:
    """A copy of the session's cold demo run (tests._golden)."""
    agent, store, result = golden_demo.copy(tmp_path_factory.mktemp("rescore"))
    assert result.code in (0, 1, 3), result.stderr[-3000:]
    return {"agent": agent, "store": str(store), "run": result.json,
            "config": str(agent / "test_config.json")}


def _incomplete(result: dict) -> set[tuple[str, str]]:
    return {(c["eval_id"], m) for c in result["cases"] for m, v in c["metrics"].items()
            if not v["complete"]}


def test_rescore_edited_eval_set_never_calls_the_agent(base: dict, tmp_path: Path) -> None:
    data = json.loads((base["agent"] / "shop.evalset.json").read_text("utf-8"))
    cases = {c["eval_id"]: c for c in data["eval_cases"]}
    cases["weather_paris"]["conversation"][-1]["final_response"]["parts"] = [
        {"text": "Paris: sunny, 21 degrees."}]
    new_case = json.loads(json.dumps(cases["weather_paris"]))
    new_case["eval_id"] = "brand_new_case"
    data["eval_cases"] = [c for c in data["eval_cases"] if c["eval_id"] != "cart_add_then_show"]
    data["eval_cases"].append(new_case)
    edited = tmp_path / "edited.evalset.json"
    edited.write_text(json.dumps(data), "utf-8")

    r = run_inproc("rescore", base["run"]["run_id"], "--evalset", str(edited), "--config",
                base["config"], "--store", base["store"], "--reuse", "--json")
    assert r.code in (0, 1, 3), r.stderr[-3000:]
    out = r.json
    assert out["kind"] == "rescore" and out["agent_calls"] == 0
    assert out["skipped_cases"] == ["cart_add_then_show"]
    assert out["uninferred_cases"] == ["brand_new_case"]
    assert out["parent_record"] == base["run"]["record_id"]
    ids = {c["eval_id"] for c in out["cases"]}
    assert "cart_add_then_show" not in ids and "brand_new_case" not in ids
    metrics = {m for c in base["run"]["cases"] for m in c["metrics"]}
    scored = {(c["eval_id"], m) for c in out["cases"] for m, v in c["metrics"].items()
              if not v["reused"]}
    assert scored - _incomplete(base["run"]) == {("weather_paris", m) for m in metrics}
    for c in out["cases"]:
        for v in c["metrics"].values():
            if v["reused"]:
                assert v["reused_from_record"] == base["run"]["record_id"]
                assert v["reused_from_run"] == base["run"]["run_id"]
            elif c["eval_id"] == "weather_paris":
                assert v["why"] == "reference changed"
    # the inference is the base run's, untouched
    store = repo.open_store(base["store"])
    snap = repo.get_snapshot(store, out["snapshot_id"])
    base_snap = repo.get_snapshot(store, base["run"]["snapshot_id"])
    old = {c.eval_id: c.inference_oid for c in base_snap.cases}
    assert {c.eval_id: c.inference_oid for c in snap.cases} == {
        k: v for k, v in old.items() if k != "cart_add_then_show"}


def test_force_after_editing_and_deleting_the_eval_set_scores_identically(
        base: dict) -> None:
    evalset = base["agent"] / "shop.evalset.json"
    data = json.loads(evalset.read_text("utf-8"))
    data["eval_cases"][0]["conversation"][-1]["final_response"]["parts"] = [{"text": "edited"}]
    evalset.write_text(json.dumps(data), "utf-8")
    evalset.unlink()  # edited, then gone: the snapshot alone must be enough

    r = run_inproc("rescore", base["run"]["snapshot_id"], "--config", base["config"],
                "--store", base["store"], "--force", "--json")
    assert r.code in (0, 1, 3), r.stderr[-3000:]
    out = r.json
    assert out["agent_calls"] == 0 and out["reused_units"] == 0
    assert out["scored_units"] == sum(len(c["metrics"]) for c in base["run"]["cases"])
    assert all(v["why"] == "forced" for c in out["cases"] for v in c["metrics"].values())
    assert score_status(out) == score_status(base["run"])
    store = repo.open_store(base["store"])
    new = repo.get(store, EvaluationRecord, out["record_id"])
    old = repo.get(store, EvaluationRecord, base["run"]["record_id"])  # both records remain
    assert new.force and new.parent_record is not None and new.parent_record != out["record_id"]
    assert old.run_id == base["run"]["run_id"]
    runs = {m.run_id for m in repo.list_manifests(store)}
    assert {base["run"]["run_id"], out["run_id"]} <= runs
    # same frozen inputs → same case fingerprints as the base snapshot
    a = repo.get_snapshot(store, base["run"]["snapshot_id"])
    b = repo.get_snapshot(store, out["snapshot_id"])
    assert [c.case_fingerprint for c in a.cases] == [c.case_fingerprint for c in b.cases]


# ---- bad input: exit 2 and a message that says what to do ----------------------------------

def _invoke(*args: str):
    from evalsnap.cli import app

    return CliRunner().invoke(app, list(args))


@pytest.mark.parametrize("command", ["rescore", "explain", "show"])
def test_unknown_record_exits_2(base: dict, command: str) -> None:
    r = _invoke(command, "deadbeefdeadbeef", "--store", base["store"])
    assert r.exit_code == 2, r.output
    assert "deadbeefdeadbeef" in r.output and "evalsnap ls" in r.output


def test_future_schema_snapshot_exits_2(base: dict) -> None:
    store = repo.open_store(base["store"])
    snap = repo.get_snapshot(store, base["run"]["snapshot_id"])
    raw = snap.model_dump(mode="json")
    raw["schema_version"] = Snapshot.SCHEMA_VERSION + 1
    oid = store.put_object("snapshot", json.dumps(raw, sort_keys=True).encode())
    r = _invoke("rescore", oid, "--config", base["config"], "--store", base["store"])
    assert r.exit_code == 2, r.output
    assert "schema_version" in r.output and "upgrade evalsnap" in r.output


def test_colliding_eval_ids_exit_2(base: dict, tmp_path: Path) -> None:
    data = json.loads((SHOP / "shop.evalset.json").read_text("utf-8"))
    data["eval_cases"].append(data["eval_cases"][0])
    dup = tmp_path / "dup.evalset.json"
    dup.write_text(json.dumps(data), "utf-8")
    r = _invoke("rescore", base["run"]["run_id"], "--evalset", str(dup), "--config",
                base["config"], "--store", base["store"])
    assert r.exit_code == 2, r.output
    assert "duplicate eval_id" in r.output and data["eval_cases"][0]["eval_id"] in r.output


def test_snapshot_with_custom_metric_and_no_config_exits_2(base: dict) -> None:
    r = _invoke("rescore", base["run"]["run_id"], "--store", base["store"])
    assert r.exit_code == 2, r.output
    assert "--config" in r.output
