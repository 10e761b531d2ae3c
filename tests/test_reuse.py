"""Auditable reuse at the unit level, through the plain stage functions (no Prefect).

Each test gets a private copy of one prepared store: the example agent's inference for every
case and a baseline record scored without reuse. What a test changes (a reference answer, a
rubric, a threshold, a custom metric's version) must rescore exactly the units whose key it
feeds, say why, and leave the inference objects byte-for-byte unchanged.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _pipeline import (
    ROOT,
    Result,
    evaluate,
    example_config,
    example_eval_set,
    infer_all,
    unit_of,
    with_reference_text,
)
from google.adk.evaluation.eval_set import EvalSet

from evalsnap.errors import ConfigError, UnsupportedSchemaVersion
from evalsnap.fingerprint import fingerprint
from evalsnap.pipeline import plan as planning
from evalsnap.pipeline import publish
from evalsnap.pipeline.outcomes import InferenceOutcome
from evalsnap.records import (
    EvaluationRecord,
    EvaluatorIdentity,
    InferenceRecord,
    MetricRule,
    RunManifest,
    ScoreUnit,
    Snapshot,
    repo,
)

FIXTURES = Path(__file__).parent / "fixtures" / "records"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[InferenceOutcome], str]:
    store = tmp_path_factory.mktemp("prepared") / "store"
    outcomes = infer_all(str(store), example_eval_set())
    base = evaluate(str(store), example_eval_set(), example_config(), outcomes, reuse=False,
                    kind="run")
    return store, outcomes, base.record_oid


class World:
    def __init__(self, url: str, outcomes: list[InferenceOutcome], base_oid: str) -> None:
        self.url, self.outcomes, self.base_oid = url, outcomes, base_oid
        self.store = repo.open_store(url)
        self.base = repo.get(self.store, EvaluationRecord, base_oid)

    def run(self, eval_set: EvalSet | None = None, config: dict | None = None, **kw) -> Result:
        return evaluate(self.url, eval_set or example_eval_set(), config or example_config(),
                        self.outcomes, **{"reuse": True, **kw})

    def incomplete_in_base(self) -> set[tuple[str, str]]:
        units = {(u.eval_id, u.metric_name): repo.get(self.store, ScoreUnit, u.unit_oid)
                 for u in self.base.units}
        return {k for k, u in units.items() if not u.complete}

    def inference_bytes(self) -> dict[str, str]:
        root = Path(self.url)
        files = [p for p in root.rglob("*") if p.is_file() and "inference" in p.parts]
        assert files, "no inference objects found in the store layout"
        return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


@pytest.fixture
def world(prepared, tmp_path: Path) -> World:
    src, outcomes, base_oid = prepared
    dst = tmp_path / "store"
    shutil.copytree(src, dst)
    return World(str(dst), outcomes, base_oid)


def metrics() -> list[str]:
    return list(example_config()["criteria"])


def test_explicit_reuse_of_complete_record_makes_no_judge_call(world: World) -> None:
    incomplete = world.incomplete_in_base()
    r = world.run()
    assert r.judge_calls == 0 and r.record.summary.judge_calls == 0
    assert r.record.summary.agent_calls == 0
    for u in r.record.units:
        if (u.eval_id, u.metric_name) in incomplete:
            assert not u.reused and u.why == "incomplete before"
        else:
            assert u.reused and u.why == "reused", (u.eval_id, u.metric_name, u.why)
            assert u.reused_from_record == world.base_oid
            assert u.reused_from_run == world.base.run_id
    assert r.record.summary.reused_units == len(r.record.units) - len(incomplete)


def test_reference_change_rescores_only_that_case(world: World) -> None:
    before = world.inference_bytes()
    edited = with_reference_text(example_eval_set(), "weather_paris",
                                 "Paris is sunny today, 21 degrees.")
    r = world.run(edited)
    assert r.scored() - world.incomplete_in_base() == {("weather_paris", m) for m in metrics()}
    assert {r.why()[("weather_paris", m)] for m in metrics()} == {"reference changed"}
    # the inference outputs did not move: same objects, same fingerprints, same bytes
    old = {c.eval_id: c for c in repo.get_snapshot(world.store, world.base.snapshot_oid).cases}
    new = {c.eval_id: c for c in r.snapshot().cases}
    assert {k: (c.inference_oid, c.inference_fingerprint) for k, c in old.items()} == {
        k: (c.inference_oid, c.inference_fingerprint) for k, c in new.items()}
    assert old["weather_paris"].case_fingerprint != new["weather_paris"].case_fingerprint
    assert world.inference_bytes() == before


def test_rubric_change_rescores_only_that_metric(world: World) -> None:
    config = example_config()
    rubric_metric = "rubric_based_final_response_quality_v1"
    config["criteria"][rubric_metric]["rubrics"][0]["rubricContent"]["textProperty"] = (
        "The answer is short.")
    r = world.run(config=config)
    assert r.scored() - world.incomplete_in_base() == {
        (c.eval_id, rubric_metric) for c in example_eval_set().eval_cases}
    assert {w for (_, m), w in r.why().items() if m == rubric_metric} == {"rule changed"}
    assert r.judge_calls > 0  # the judge sees a new rubric: it must really be asked


def test_threshold_change_rescores_only_that_metric_without_judge_calls(world: World) -> None:
    config = example_config()
    config["criteria"]["response_match_score"] = 0.99
    config["criteria"]["final_response_match_v2"]["threshold"] = 0.9
    r = world.run(config=config)
    changed = {"response_match_score", "final_response_match_v2"}
    assert r.scored() - world.incomplete_in_base() == {
        (c.eval_id, m) for c in example_eval_set().eval_cases for m in changed}
    assert {w for (_, m), w in r.why().items() if m in changed} == {"rule changed"}
    # a threshold feeds no judge request: every judge answer comes from the ledger
    assert r.judge_calls == 0
    assert r.record.summary.reused_judge_samples > 0
    stricter = unit_of(world.url, r.record, "weather_two_cities", "response_match_score")
    assert stricter.threshold == 0.99


def test_custom_metric_version(world: World) -> None:
    config = example_config()
    config["customMetrics"]["response_mentions_city"]["version"] = "2"
    r = world.run(config=config)
    assert r.scored() - world.incomplete_in_base() == {
        (c.eval_id, "response_mentions_city") for c in example_eval_set().eval_cases}
    assert {w for (_, m), w in r.why().items()
            if m == "response_mentions_city"} == {"evaluator version changed"}
    # without a declared version it is never reused, even when asked to, and says why
    del config["customMetrics"]["response_mentions_city"]["version"]
    for _ in range(2):
        r = world.run(config=config)
        assert {w for (_, m), w in r.why().items()
                if m == "response_mentions_city"} == {"no trusted version"}


def test_force_scores_everything_and_keeps_both_records(world: World) -> None:
    r = world.run(force=True)
    assert r.record.summary.reused_units == 0
    assert set(r.why().values()) == {"forced"}
    assert r.record.parent_record == world.base_oid
    assert r.record.force
    assert repo.get(world.store, EvaluationRecord, world.base_oid) == world.base
    runs = {m.run_id for m in repo.list_manifests(world.store)}
    assert {world.base.run_id, r.record.run_id} <= runs
    for u in r.record.units:  # same inputs, so the same unit key, yet a new result object
        old = next(b for b in world.base.units
                   if (b.eval_id, b.metric_name) == (u.eval_id, u.metric_name))
        assert u.unit_fingerprint == old.unit_fingerprint and u.unit_oid != old.unit_oid


def test_incomplete_units_never_reused_complete_failed_units_are(world: World,
                                                                 monkeypatch) -> None:
    base_units = {(u.eval_id, u.metric_name): repo.get(world.store, ScoreUnit, u.unit_oid)
                  for u in world.base.units}
    failed = {k for k, u in base_units.items() if u.complete and u.status == "FAILED"}
    assert failed, "the example eval set is built to have quality failures"
    # judge samples that error make the unit incomplete (a new numSamples: a new rule key)
    config = example_config()
    config["criteria"]["final_response_match_v2"]["judgeModelOptions"]["numSamples"] = 4
    monkeypatch.setenv("EVALSNAP_DEMO_JUDGE_GARBLE", "1")
    garbled = world.run(config=config, reuse=False)
    v2 = {(c.eval_id, "final_response_match_v2") for c in example_eval_set().eval_cases}
    assert all(not unit_of(world.url, garbled.record, *k).complete for k in v2)
    monkeypatch.delenv("EVALSNAP_DEMO_JUDGE_GARBLE")
    again = world.run(config=config)
    assert v2 <= again.scored()
    assert {again.why()[k] for k in v2} == {"incomplete before"}
    assert all(unit_of(world.url, again.record, *k).complete for k in v2)
    for k in failed - v2:
        ref = next(u for u in again.record.units if (u.eval_id, u.metric_name) == k)
        # reused from the latest complete result of that key (the garbled run rescored
        # it without reuse; its FAILED verdict is complete)
        assert ref.reused and ref.reused_from_record in (world.base_oid, garbled.record_oid), k
        assert unit_of(world.url, again.record, *k).status == "FAILED"


def test_failed_inference_is_never_reused(world: World) -> None:
    data = example_eval_set().model_dump(mode="json")
    broken = copy.deepcopy(data["eval_cases"][0])
    broken["eval_id"] = "agent_breaks"
    broken["conversation"][0]["user_content"]["parts"] = [{"text": "FAIL_MODEL please"}]
    data["eval_cases"].append(broken)
    eval_set = EvalSet.model_validate(data)
    outcomes = infer_all(world.url, eval_set, run_id="with-failure")
    assert next(o for o in outcomes if o.eval_id == "agent_breaks").status == "failure"
    first = evaluate(world.url, eval_set, example_config(), outcomes, reuse=True)
    second = evaluate(world.url, eval_set, example_config(), outcomes, reuse=True)
    for r in (first, second):
        assert not r.record.summary.complete
        for m in metrics():
            ref = next(u for u in r.record.units if (u.eval_id, u.metric_name) == (
                "agent_breaks", m))
            assert not ref.reused
    assert {second.why()[("agent_breaks", m)] for m in metrics()} == {"incomplete before"}


def test_scoring_never_mutates_persisted_inference(world: World) -> None:
    before = world.inference_bytes()
    records = {o.oid: repo.get_inference(world.store, o.oid).model_dump(mode="json")
               for o in world.outcomes}
    world.run(with_reference_text(example_eval_set(), "cart_add_two_items", "Done."),
              force=True)
    assert world.inference_bytes() == before
    assert {oid: repo.get_inference(world.store, oid).model_dump(mode="json")
            for oid in records} == records


_ROUND_TRIP = """
import json, sys
sys.path[:0] = [{root!r}]
from evalsnap.records import repo
from evalsnap.records import EvaluationRecord, ScoreUnit
from evalsnap.pipeline.unit import case_fingerprint, unit_fingerprint
s = repo.open_store({url!r})
rec = repo.get(s, EvaluationRecord, {oid!r})
snap = repo.get_snapshot(s, rec.snapshot_oid)
out = {{"record": rec.to_bytes().decode(), "snapshot": snap.to_bytes().decode(),
        "units": [repo.get(s, ScoreUnit, u.unit_oid).to_bytes().decode() for u in rec.units],
        "case_fps": [case_fingerprint(repo.get_inference(s, c.inference_oid), c.reference)
                     for c in snap.cases],
        "unit_fps": [unit_fingerprint(u.case_fingerprint, u.rule_fingerprint)
                     for u in rec.units]}}
print(json.dumps(out))
"""


def test_snapshots_and_records_round_trip_across_processes(world: World) -> None:
    code = _ROUND_TRIP.format(root=str(ROOT), url=world.url, oid=world.base_oid)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONHASHSEED": "12345"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    other = json.loads(proc.stdout.strip().splitlines()[-1])
    snap = repo.get_snapshot(world.store, world.base.snapshot_oid)
    assert other["record"] == world.base.to_bytes().decode()
    assert other["snapshot"] == snap.to_bytes().decode()
    assert other["units"] == [repo.get(world.store, ScoreUnit, u.unit_oid).to_bytes().decode()
                              for u in world.base.units]
    # fingerprints recomputed in another process (other hash seed) match the stored ones
    assert other["case_fps"] == [c.case_fingerprint for c in snap.cases]
    assert other["unit_fps"] == [u.unit_fingerprint for u in world.base.units]


# ---- committed fixtures: every schema version loads, a future one is refused --------------

FIXTURE_MODELS = {
    "inference_v1.json": InferenceRecord,
    "inference_v1_without_state.json": InferenceRecord,
    "snapshot_v1.json": Snapshot,
    "unit_v1.json": ScoreUnit,
    "record_v1.json": EvaluationRecord,
    "manifest_v1.json": RunManifest,
}


@pytest.mark.parametrize("name", sorted(FIXTURE_MODELS))
def test_committed_fixture_loads(name: str) -> None:
    model = FIXTURE_MODELS[name]
    loaded = model.from_bytes((FIXTURES / name).read_bytes(), where=name)
    assert loaded.schema_version == 1
    raw = json.loads((FIXTURES / name).read_text("utf-8"))
    raw["schema_version"] = model.SCHEMA_VERSION + 1
    with pytest.raises(UnsupportedSchemaVersion) as info:
        model.from_data(raw, where=name)
    assert "upgrade evalsnap" in str(info.value)


def test_inference_without_state_keys_loads_with_none_states() -> None:
    raw = json.loads((FIXTURES / "inference_v1_without_state.json").read_text("utf-8"))
    assert "initial_session_state" not in raw and "final_session_state" not in raw
    record = InferenceRecord.from_bytes(json.dumps(raw).encode())
    assert record.initial_session_state is None and record.final_session_state is None
    with_state = InferenceRecord.from_bytes((FIXTURES / "inference_v1.json").read_bytes())
    assert with_state.final_session_state is not None


def test_future_snapshot_fixture_raises_typed_error() -> None:
    with pytest.raises(UnsupportedSchemaVersion) as info:
        Snapshot.from_bytes((FIXTURES / "snapshot_v999_future.json").read_bytes())
    assert info.value.found == 999 and info.value.supported == Snapshot.SCHEMA_VERSION


# ---- scale: one edited reference among 300 cases ------------------------------------------

def test_300_cases_editing_one_reference_rescores_only_its_units(world: World) -> None:
    source = example_eval_set()
    by_id = {o.eval_id: o for o in world.outcomes}
    cases, outcomes = [], []
    for i in range(300):
        case = source.eval_cases[i % len(source.eval_cases)]
        eval_id = f"{case.eval_id}-{i:03d}"
        cases.append(case.model_copy(update={"eval_id": eval_id}))
        # the agent's output for this case, stored as a distinct inference of the new case
        record = repo.get_inference(world.store, by_id[case.eval_id].oid)
        clone = record.model_copy(update={
            "eval_id": eval_id, "inference_fingerprint": fingerprint("test-inference", eval_id)})
        oid = repo.put(world.store, clone)
        outcomes.append(InferenceOutcome(eval_id=eval_id, oid=oid,
                                         fingerprint=clone.inference_fingerprint,
                                         status=clone.status, run_id=clone.run_id))
    big = EvalSet(eval_set_id="shop300", eval_cases=cases)
    config = {"criteria": {"response_match_score": 0.5, "tool_trajectory_avg_score": 1.0,
                           "final_response_match_v2": {
                               "threshold": 0.5,
                               "judgeModelOptions": {"judgeModel": "offline-judge-v1",
                                                     "numSamples": 1}}}}
    first = evaluate(world.url, big, config, outcomes, reuse=False)
    assert len(first.record.units) == 300 * 3 and first.record.summary.scored_units == 900
    assert first.judge_calls == sum(len(c.conversation or []) for c in cases)

    target = "weather_two_cities-001"
    edited = with_reference_text(big, target, "Both cities are sunny.")
    second = evaluate(world.url, edited, config, outcomes, reuse=True)
    assert second.scored() == {(target, m) for m in config["criteria"]}
    assert second.record.summary.scored_units == 3
    assert second.record.summary.reused_units == 897
    turns = len(next(c for c in cases if c.eval_id == target).conversation or [])
    assert second.judge_calls == turns == second.record.summary.judge_calls
    assert {second.why()[(target, m)] for m in config["criteria"]} == {"reference changed"}


# ---- restoring a record never imports code named in it ------------------------------------

def test_restoring_a_record_never_imports_code_named_in_it(world: World, tmp_path: Path,
                                                           monkeypatch) -> None:
    pkg = tmp_path / "code"
    pkg.mkdir()
    marker = tmp_path / "IMPORTED"
    (pkg / "evalsnap_booby_trap.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('imported')\n"
        "def metric(metric, actual, expected, scenario):\n    raise RuntimeError('never')\n")
    monkeypatch.syspath_prepend(str(pkg))  # an import *would* succeed
    base_snapshot = repo.get_snapshot(world.store, world.base.snapshot_oid)
    identity = EvaluatorIdentity(kind="custom_function", name="evalsnap_booby_trap.metric",
                                 version="1")
    trap = MetricRule(metric_name="booby_trap", threshold=0.5,
                      criterion={"threshold": 0.5}, evaluator=identity,
                      rule_fingerprint=fingerprint("rule", {"metric_name": "booby_trap",
                                                            "evaluator": identity}))
    snapshot = base_snapshot.model_copy(update={"rules": [*base_snapshot.rules, trap]})
    snapshot_oid = repo.put(world.store, snapshot)
    publish.publish(world.url, run_id="trap-run", kind="run", snapshot_oid=snapshot_oid,
                    inference=world.outcomes, units=[], reuse=False, force=False)
    repo.resolve_record(world.store, "trap-run")
    # rescoring that run with no config: refused, without importing anything
    with pytest.raises(ConfigError, match="never imports code"):
        planning.plan_rescore("trap-run", world.url, None, None, sys_paths=[str(pkg)])
    # with a config that lacks the metric: scored with the live config's rules only
    config_path = tmp_path / "test_config.json"
    config = example_config()
    config_path.write_text(json.dumps(config))
    plan = planning.plan_rescore("trap-run", world.url, None, str(config_path),
                                 sys_paths=[str(ROOT / "examples")])
    assert "booby_trap" not in plan.metric_names
    r = world.run(plan.selected_eval_set(), config)
    assert "booby_trap" not in {u.metric_name for u in r.record.units}
    from evalsnap.reports.explain import explain
    from evalsnap.reports.show import full_record

    full_record(world.store, r.record_oid, r.record)
    explain(world.store, r.record_oid, r.record)
    assert "evalsnap_booby_trap" not in sys.modules
    assert not marker.exists()
