"""Auditable reuse at the unit level, through the real CLI (``run``, ``rescore``, ``show``,
``explain``), in the test process (:mod:`tests._cli`; a new process where the hash seed
or ``PYTHONPATH`` matters).

Each test gets a private copy of one prepared store: the example agent's inference for every
case and a baseline record scored without reuse (``evalsnap run``). What a test changes (a
reference answer, a rubric, a threshold, a custom metric's version) must rescore exactly the
units whose key it feeds, say why, and leave the inference objects byte-for-byte unchanged.
Edited eval sets are written into the test's ``shop_copy`` dir, edited configs into its
``tmp_path``; the store is read back through ``evalsnap.records`` only.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from evalsnap.errors import UnsupportedSchemaVersion
from evalsnap.records import (
    EvaluationRecord,
    InferenceRecord,
    RunManifest,
    ScoreUnit,
    Snapshot,
    repo,
)
from tests._cli import run_inproc
from tests.conftest import ROOT, SHOP, CliResult

FIXTURES = Path(__file__).parent / "fixtures" / "records"
Key = tuple[str, str]


def example_eval_set(shop: Path = SHOP) -> dict[str, Any]:
    return json.loads((shop / "shop.evalset.json").read_text("utf-8"))


def example_config(shop: Path = SHOP) -> dict[str, Any]:
    return json.loads((shop / "test_config.json").read_text("utf-8"))


def case_ids(eval_set: dict[str, Any] | None = None) -> list[str]:
    return [c["eval_id"] for c in (eval_set or example_eval_set())["eval_cases"]]


def metrics() -> list[str]:
    return list(example_config()["criteria"])


def with_reference_text(eval_set: dict[str, Any], eval_id: str, text: str) -> dict[str, Any]:
    """A copy of ``eval_set`` whose case ``eval_id`` expects ``text`` as its final answer."""
    data = copy.deepcopy(eval_set)
    for case in data["eval_cases"]:
        if case["eval_id"] == eval_id:
            case["conversation"][-1]["final_response"]["parts"] = [{"text": text}]
    return data


@dataclass
class Out:
    """One CLI command's ``--json`` output and the record it published, read from the store."""

    cli: CliResult
    json: dict[str, Any]
    record_oid: str
    record: EvaluationRecord

    def why(self) -> dict[Key, str]:
        return {(u.eval_id, u.metric_name): u.why for u in self.record.units}

    def scored(self) -> set[Key]:
        return {(u.eval_id, u.metric_name) for u in self.record.units if not u.reused}

    def ref(self, eval_id: str, metric: str) -> Any:
        return next(u for u in self.record.units if (u.eval_id, u.metric_name) == (eval_id, metric))


def _publish_result(url: str, r: CliResult, what: str) -> Out:
    assert r.code in (0, 1, 3), f"expected {what} to publish a record (exit 0, 1 or 3), got " \
                                f"{r.code}: {r.stderr[-3000:]}"
    out = r.json  # an internal error (also exit 3) prints no JSON: this fails then
    oid, record = repo.resolve_record(repo.open_store(url), out["run_id"])
    assert oid == out["record_id"], f"expected {what}'s --json record_id to be the stored record"
    flags = {(c["eval_id"], m): v["reused"] for c in out["cases"] for m, v in c["metrics"].items()}
    assert flags == {(u.eval_id, u.metric_name): u.reused for u in record.units}, \
        f"expected {what}'s --json reused flags to match the stored record"
    return Out(r, out, oid, record)


def cli_run(url: str, agent: Path, evalset: Path, *flags: str, config: Path | None = None,
            env: dict[str, str] | None = None) -> Out:
    args = ["run", str(agent), str(evalset), "--store", url, "--json", *flags]
    if config is not None:
        args += ["--config", str(config)]
    return _publish_result(url, run_inproc(*args, env=env), f"run {' '.join(flags)}")


def cli_rescore(url: str, source: str, *flags: str, config: Path, code_path: Path,
                evalset: Path | None = None, env: dict[str, str] | None = None) -> Out:
    args = ["rescore", source, "--store", url, "--json", "--config", str(config),
            "--code-path", str(code_path), *flags]
    if evalset is not None:
        args += ["--evalset", str(evalset)]
    return _publish_result(url, run_inproc(*args, env=env), f"rescore {' '.join(flags)}")


@dataclass
class Prepared:
    store: Path
    run_id: str
    record_oid: str


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory, golden_demo: Any) -> Prepared:
    """The session's cold run of the demo (``evalsnap run``, no reuse: tests._golden)."""
    _, store, cold = golden_demo.copy(tmp_path_factory.mktemp("prepared"))
    base = _publish_result(str(store), cold, "the baseline run")
    assert base.json["agent_calls"] > 0 and base.json["reused_units"] == 0, \
        "expected the baseline run to run the agent and score everything"
    return Prepared(store, base.json["run_id"], base.record_oid)


class World:
    def __init__(self, prepared: Prepared, shop: Path, tmp: Path) -> None:
        self.tmp, self.shop = tmp, shop
        dst = tmp / "store"
        shutil.copytree(prepared.store, dst)
        self.url = str(dst)
        self.store = repo.open_store(self.url)
        self.base_oid, self.base_run = prepared.record_oid, prepared.run_id
        self.base = repo.get(self.store, EvaluationRecord, self.base_oid)
        self._n = 0

    # inputs
    def eval_set_file(self, data: dict[str, Any] | None = None) -> Path:
        if data is None:
            return self.shop / "shop.evalset.json"
        self._n += 1
        path = self.shop / f"edited{self._n}.evalset.json"  # ignored by the agent identity
        path.write_text(json.dumps(data), "utf-8")
        return path

    def config_file(self, config: dict[str, Any] | None = None) -> Path:
        self._n += 1
        path = self.tmp / f"config{self._n}.json"
        path.write_text(json.dumps(config if config is not None else example_config(self.shop)),
                        "utf-8")
        return path

    # commands
    def rescore(self, eval_set: dict[str, Any] | None = None, config: dict[str, Any] | None = None,
                *flags: str, source: str | None = None, env: dict[str, str] | None = None) -> Out:
        """``rescore`` the baseline run (never calls the agent); ``--reuse`` unless flags say."""
        return cli_rescore(self.url, source or self.base_run, *(flags or ("--reuse",)),
                           config=self.config_file(config), code_path=self.shop.parent,
                           evalset=self.eval_set_file(eval_set), env=env)

    def run(self, eval_set: dict[str, Any] | None = None, *flags: str,
            env: dict[str, str] | None = None) -> Out:
        return cli_run(self.url, self.shop, self.eval_set_file(eval_set), *flags, env=env)

    # store
    def unit(self, out: Out, eval_id: str, metric: str) -> ScoreUnit:
        return repo.find(self.store, ScoreUnit, out.ref(eval_id, metric).unit_oid)

    def incomplete_in_base(self) -> set[Key]:
        units = {(u.eval_id, u.metric_name): repo.find(self.store, ScoreUnit, u.unit_oid)
                 for u in self.base.units}
        return {k for k, u in units.items() if not u.complete}

    def inference_bytes(self) -> dict[str, str]:
        root = Path(self.url)
        files = [p for p in root.rglob("*") if p.is_file() and "inference" in p.parts
                 and "objects" in p.parts]
        assert files, "no inference objects found in the store layout"
        return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


@pytest.fixture
def world(prepared: Prepared, shop_copy: Path, tmp_path: Path) -> World:
    return World(prepared, shop_copy, tmp_path)


def test_explicit_reuse_of_complete_record_makes_no_judge_call(world: World) -> None:
    incomplete = world.incomplete_in_base()
    assert incomplete, "expected the example eval set to have an incomplete unit (null state)"
    r = world.run(None, "--reuse")
    assert r.json["judge_calls"] == 0 and r.record.summary.judge_calls == 0, \
        "expected no judge call when every complete unit is reused"
    assert r.json["agent_calls"] == 0 and r.record.summary.agent_calls == 0, \
        "expected no agent call: every inference is reused"
    for u in r.record.units:
        if (u.eval_id, u.metric_name) in incomplete:
            assert not u.reused and u.why == "incomplete before", \
                f"expected incomplete {u.eval_id}/{u.metric_name} scored again, got {u.why!r}"
        else:
            assert u.reused and u.why == "reused", (u.eval_id, u.metric_name, u.why)
            assert u.reused_from_record == world.base_oid, \
                f"expected {u.eval_id}/{u.metric_name} reused from the baseline record"
            assert u.reused_from_run == world.base.run_id, \
                f"expected {u.eval_id}/{u.metric_name} reused from the baseline run"
    assert r.record.summary.reused_units == len(r.record.units) - len(incomplete), \
        "expected every complete unit counted as reused"


def test_reference_change_rescores_only_that_case(world: World) -> None:
    before = world.inference_bytes()
    edited = with_reference_text(example_eval_set(), "weather_paris",
                                 "Paris is sunny today, 21 degrees.")
    r = world.rescore(edited)
    assert r.scored() - world.incomplete_in_base() == {("weather_paris", m) for m in metrics()}, \
        "expected only weather_paris's units scored again"
    assert {r.why()[("weather_paris", m)] for m in metrics()} == {"reference changed"}, \
        "expected every weather_paris unit to say 'reference changed'"
    assert r.json["agent_calls"] == 0, "expected rescore never to call the agent"
    # the inference outputs did not move: same objects, same fingerprints, same bytes
    old = {c.eval_id: c for c in repo.get_snapshot(world.store, world.base.snapshot_oid).cases}
    new = {c.eval_id: c for c in repo.get_snapshot(world.store, r.record.snapshot_oid).cases}
    assert {k: (c.inference_oid, c.inference_fingerprint) for k, c in old.items()} == {
        k: (c.inference_oid, c.inference_fingerprint) for k, c in new.items()}, \
        "expected the same inference objects and fingerprints in the new snapshot"
    assert old["weather_paris"].case_fingerprint != new["weather_paris"].case_fingerprint, \
        "expected the edited reference to change weather_paris's case fingerprint"
    assert world.inference_bytes() == before, "expected the inference objects byte-for-byte intact"


def test_rubric_change_rescores_only_that_metric(world: World) -> None:
    config = example_config()
    rubric_metric = "rubric_based_final_response_quality_v1"
    config["criteria"][rubric_metric]["rubrics"][0]["rubricContent"]["textProperty"] = (
        "The answer is short.")
    r = world.rescore(None, config)
    assert r.scored() - world.incomplete_in_base() == {
        (c, rubric_metric) for c in case_ids()}, f"expected only {rubric_metric} scored again"
    assert {w for (_, m), w in r.why().items() if m == rubric_metric} == {"rule changed"}, \
        "expected the rubric metric's units to say 'rule changed'"
    assert r.json["judge_calls"] > 0, "expected the judge to be asked about the new rubric"


def test_threshold_change_rescores_only_that_metric_without_judge_calls(world: World) -> None:
    config = example_config()
    config["criteria"]["response_match_score"] = 0.99
    config["criteria"]["final_response_match_v2"]["threshold"] = 0.9
    r = world.rescore(None, config)
    changed = {"response_match_score", "final_response_match_v2"}
    assert r.scored() - world.incomplete_in_base() == {
        (c, m) for c in case_ids() for m in changed}, f"expected only {changed} scored again"
    assert {w for (_, m), w in r.why().items() if m in changed} == {"rule changed"}, \
        "expected the changed metrics' units to say 'rule changed'"
    # a threshold feeds no judge request: every judge answer comes from the ledger
    assert r.json["judge_calls"] == 0, "expected a threshold change to make no judge call"
    assert r.record.summary.reused_judge_samples > 0, "expected judge answers from the ledger"
    stricter = world.unit(r, "weather_two_cities", "response_match_score")
    assert stricter.threshold == 0.99, "expected the unit scored with the new threshold"


def test_custom_metric_version(world: World) -> None:
    config = example_config()
    config["customMetrics"]["response_mentions_city"]["version"] = "2"
    r = world.rescore(None, config)
    assert r.scored() - world.incomplete_in_base() == {
        (c, "response_mentions_city") for c in case_ids()}, \
        "expected only the custom metric scored again after its version bump"
    assert {w for (_, m), w in r.why().items()
            if m == "response_mentions_city"} == {"evaluator version changed"}, \
        "expected 'evaluator version changed'"
    # without a declared version it is never reused, even when asked to, and says why
    del config["customMetrics"]["response_mentions_city"]["version"]
    for i in range(2):
        r = world.rescore(None, config)
        assert {w for (_, m), w in r.why().items()
                if m == "response_mentions_city"} == {"no trusted version"}, \
            f"expected the unversioned metric scored again with 'no trusted version' on " \
            f"--reuse run {i + 1}"


def test_force_scores_everything_and_keeps_both_records(world: World) -> None:
    base_bytes = world.base.to_bytes()
    r = world.rescore(None, None, "--reuse", "--force")
    assert r.record.summary.reused_units == 0, "expected --force to reuse nothing"
    assert set(r.why().values()) == {"forced"}, "expected every unit to say 'forced'"
    assert r.record.parent_record == world.base_oid, "expected the baseline as parent"
    assert r.record.force, "expected the record to say it was forced"
    assert repo.get(world.store, EvaluationRecord, world.base_oid).to_bytes() == base_bytes, \
        "expected the baseline record unchanged"
    runs = {m.run_id for m in repo.list_manifests(world.store)}
    assert {world.base.run_id, r.record.run_id} <= runs, "expected both runs kept"
    ls = run_inproc("ls", "--store", world.url, "--json")
    assert ls.code == 0 and {world.base.run_id, r.record.run_id} <= {
        x["run_id"] for x in ls.json["runs"]}, "expected `ls` to list both runs"
    for u in r.record.units:  # same inputs and deterministic metrics: the very same object
        old = next(b for b in world.base.units
                   if (b.eval_id, b.metric_name) == (u.eval_id, u.metric_name))
        assert u.unit_fingerprint == old.unit_fingerprint and u.unit_oid == old.unit_oid, \
            f"expected {u.eval_id}/{u.metric_name}: same unit key, same unit object (objects " \
            "hold no run id or time, so scoring again gives the same bytes)"


def test_incomplete_units_never_reused_complete_failed_units_are(world: World) -> None:
    base_units = {(u.eval_id, u.metric_name): repo.find(world.store, ScoreUnit, u.unit_oid)
                  for u in world.base.units}
    failed = {k for k, u in base_units.items() if u.complete and u.status == "FAILED"}
    assert failed, "the example eval set is built to have quality failures"
    # judge samples that error make the unit incomplete (a new numSamples: a new rule key)
    config = example_config()
    config["criteria"]["final_response_match_v2"]["judgeModelOptions"]["numSamples"] = 4
    garbled = world.rescore(None, config, "--no-reuse",
                            env={"EVALSNAP_DEMO_JUDGE_GARBLE": "1"})
    v2 = {(c, "final_response_match_v2") for c in case_ids()}
    assert all(not world.unit(garbled, *k).complete for k in v2), \
        "expected garbled judge answers to leave every final_response_match_v2 unit incomplete"
    again = world.rescore(None, config)
    assert v2 <= again.scored(), "expected every incomplete judge unit scored again"
    assert {again.why()[k] for k in v2} == {"incomplete before"}, \
        "expected the judge units to say 'incomplete before'"
    assert all(world.unit(again, *k).complete for k in v2), \
        "expected the judge units complete once the judge answers properly"
    for k in failed - v2:
        ref = again.ref(*k)
        # reused from the latest complete result of that key (the garbled run rescored
        # it without reuse; its FAILED verdict is complete)
        assert ref.reused and ref.reused_from_record in (world.base_oid, garbled.record_oid), \
            f"expected complete FAILED unit {k} reused"
        assert world.unit(again, *k).status == "FAILED", f"expected {k} still FAILED"


def test_failed_inference_is_never_reused(world: World) -> None:
    data = example_eval_set()
    broken = copy.deepcopy(data["eval_cases"][0])
    broken["eval_id"] = "agent_breaks"
    broken["conversation"][0]["user_content"]["parts"] = [{"text": "FAIL_MODEL please"}]
    data["eval_cases"].append(broken)
    first = world.run(data, "--reuse")
    second = world.run(data, "--reuse")
    for i, r in enumerate((first, second)):
        assert r.cli.code == 3, f"expected run {i + 1} with a failed inference to exit 3"
        case = next(c for c in r.json["cases"] if c["eval_id"] == "agent_breaks")
        assert case["inference"] == "failure" and not case["inference_reused"], \
            f"expected run {i + 1} to run the failing case again and record a failure: {case}"
        assert not r.record.summary.complete, f"expected run {i + 1} to be incomplete"
        for m in metrics():
            assert not r.ref("agent_breaks", m).reused, \
                f"expected agent_breaks/{m} never reused (run {i + 1})"
    assert {second.why()[("agent_breaks", m)] for m in metrics()} == {"incomplete before"}, \
        "expected the failed case's units to say 'incomplete before'"


def test_scoring_never_mutates_persisted_inference(world: World) -> None:
    before = world.inference_bytes()
    records = {i.inference_oid: repo.get_inference(world.store, i.inference_oid).model_dump(
        mode="json") for i in world.base.inference}
    world.rescore(with_reference_text(example_eval_set(), "cart_add_two_items", "Done."), None,
                  "--reuse", "--force")
    assert world.inference_bytes() == before, "expected inference objects byte-for-byte intact"
    assert {oid: repo.get_inference(world.store, oid).model_dump(mode="json")
            for oid in records} == records, "expected inference records unchanged"


_ROUND_TRIP = """
import json, sys
sys.path[:0] = [{root!r}]
from evalsnap.records import repo
from evalsnap.records import EvaluationRecord, ScoreUnit
s = repo.open_store({url!r})
rec = repo.get(s, EvaluationRecord, {oid!r})
snap = repo.get_snapshot(s, rec.snapshot_oid)
out = {{"record": rec.to_bytes().decode(), "snapshot": snap.to_bytes().decode(),
        "units": [repo.get(s, ScoreUnit, u.unit_oid).to_bytes().decode() for u in rec.units]}}
print(json.dumps(out))
"""


def test_snapshots_and_records_round_trip_across_processes(world: World) -> None:
    code = _ROUND_TRIP.format(root=str(ROOT), url=world.url, oid=world.base_oid)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONHASHSEED": "12345"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    other = json.loads(proc.stdout.strip().splitlines()[-1])
    snap = repo.get_snapshot(world.store, world.base.snapshot_oid)
    assert other["record"] == world.base.to_bytes().decode(), "expected identical record bytes"
    assert other["snapshot"] == snap.to_bytes().decode(), "expected identical snapshot bytes"
    assert other["units"] == [repo.get(world.store, ScoreUnit, u.unit_oid).to_bytes().decode()
                              for u in world.base.units], "expected identical unit bytes"
    # fingerprints recomputed by the CLI in another process (other hash seed) match the
    # stored ones: rescoring the same inputs freezes the same case and unit keys
    r = world.rescore(None, None, env={"PYTHONHASHSEED": "12345"})
    again = repo.get_snapshot(world.store, r.record.snapshot_oid)
    assert [(c.eval_id, c.case_fingerprint) for c in again.cases] == [
        (c.eval_id, c.case_fingerprint) for c in snap.cases], \
        "expected the same case fingerprints from another process"
    assert {(u.eval_id, u.metric_name): u.unit_fingerprint for u in r.record.units} == {
        (u.eval_id, u.metric_name): u.unit_fingerprint for u in world.base.units}, \
        "expected the same unit fingerprints from another process"


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


# ---- scale: one edited reference among many cases -----------------------------------------

#: Enough cases for the paths a large eval set takes: more than one inference batch (at most
#: 50 cases each) and a cold run that scores enough units to start a scoring process
#: (``EVALSNAP_SCORE_POOL_MIN_UNITS``, 200 by default: 70 cases x 3 metrics = 210 units).
MANY = 70


def test_many_cases_editing_one_reference_rescores_only_its_units(world: World) -> None:
    from evalsnap import settings

    assert MANY > 50 and MANY * 3 >= settings.get().score_pool_min_units
    source = example_eval_set()
    cases = []
    for i in range(MANY):
        case = copy.deepcopy(source["eval_cases"][i % len(source["eval_cases"])])
        case["eval_id"] = f"{case['eval_id']}-{i:03d}"
        cases.append(case)
    big = {"eval_set_id": "shop_many", "eval_cases": cases}
    config: dict[str, Any] = {
        "criteria": {"response_match_score": 0.5, "tool_trajectory_avg_score": 1.0,
                     "final_response_match_v2": {
                         "threshold": 0.5,
                         "judgeModelOptions": {"judgeModel": "offline-judge-v1",
                                               "numSamples": 1}}}}
    plugins = example_config(world.shop).get("evalsnapPlugins")
    if plugins:  # the demo's offline models come in through the config
        config["evalsnapPlugins"] = plugins
    config_path = world.config_file(config)
    first = cli_run(world.url, world.shop, world.eval_set_file(big), config=config_path)
    assert len(first.record.units) == MANY * 3 and first.record.summary.scored_units == MANY * 3, \
        f"expected {MANY * 3} units, all scored"
    assert first.json["judge_calls"] == sum(len(c.get("conversation") or []) for c in cases), \
        "expected one judge call per invocation"

    target = "weather_two_cities-001"
    edited = with_reference_text(big, target, "Both cities are sunny.")
    second = cli_rescore(world.url, first.json["run_id"], "--reuse", config=config_path,
                         code_path=world.shop.parent, evalset=world.eval_set_file(edited))
    assert second.scored() == {(target, m) for m in config["criteria"]}, \
        f"expected only {target}'s units scored again"
    assert second.record.summary.scored_units == 3, "expected 3 units scored"
    assert second.record.summary.reused_units == MANY * 3 - 3, \
        f"expected {MANY * 3 - 3} units reused"
    turns = len(next(c for c in cases if c["eval_id"] == target).get("conversation") or [])
    assert second.json["judge_calls"] == turns == second.record.summary.judge_calls, \
        "expected judge calls only for the edited case's invocations"
    assert {second.why()[(target, m)] for m in config["criteria"]} == {"reference changed"}, \
        "expected 'reference changed'"


# ---- restoring a record never imports code named in it ------------------------------------

_TRAP = """
from pathlib import Path
Path({marker!r}).write_text('imported')
from google.adk.evaluation.eval_metrics import EvalStatus
from google.adk.evaluation.evaluator import EvaluationResult, PerInvocationResult


def metric(metric, actual, expected, scenario):
    rows = [PerInvocationResult(actual_invocation=a, score=1.0, eval_status=EvalStatus.PASSED)
            for a in actual]
    return EvaluationResult(overall_score=1.0, overall_eval_status=EvalStatus.PASSED,
                            per_invocation_results=rows)
"""


def test_restoring_a_record_never_imports_code_named_in_it(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = world.tmp / "code"
    pkg.mkdir()
    marker = world.tmp / "IMPORTED"
    (pkg / "evalsnap_booby_trap.py").write_text(_TRAP.format(marker=str(marker)), "utf-8")
    # an import *would* succeed in every call below: the trap's directory is on sys.path
    # (the in-process CLI forgets user modules per call, so each call would import it afresh)
    monkeypatch.syspath_prepend(str(pkg))
    env: dict[str, str] = {}
    # a run whose live config names the trap (so the record and snapshot name its code)
    trap_config = {"criteria": {"response_match_score": 0.5, "booby_trap": 0.5},
                   "customMetrics": {"booby_trap": {
                       "codeConfig": {"name": "evalsnap_booby_trap.metric"}, "version": "1"}}}
    plugins = example_config(world.shop).get("evalsnapPlugins")
    if plugins:
        trap_config["evalsnapPlugins"] = plugins
    trap = cli_run(world.url, world.shop, world.eval_set_file(), "--case", "weather_paris",
                   config=world.config_file(trap_config), env=env)
    assert "booby_trap" in {u.metric_name for u in trap.record.units}
    assert marker.exists(), "expected the live config to import the trap (the trap is live)"
    marker.unlink()
    trap_run = trap.json["run_id"]

    # rescoring that run with no config: refused, without importing anything
    refused = run_inproc("rescore", trap_run, "--store", world.url, "--json", env=env)
    assert refused.code == 2, f"expected exit 2, got {refused.code}: {refused.stderr[-2000:]}"
    assert "never imports code" in " ".join(refused.stderr.split()), refused.stderr[-2000:]
    assert not marker.exists(), "expected rescore without a config not to import the trap"

    # with a config that lacks the metric: scored with the live config's rules only
    r = cli_rescore(world.url, trap_run, config=world.config_file(), code_path=world.shop.parent,
                    env=env)
    assert "booby_trap" not in {u.metric_name for u in r.record.units}, \
        "expected only the live config's metrics"
    assert not marker.exists(), "expected rescore with the live config not to import the trap"

    for args in (("show", r.json["run_id"], "--json"), ("explain", r.json["run_id"], "--json"),
                 ("show", trap_run, "--json"), ("explain", trap_run, "--json"),
                 ("diff", trap_run, r.json["run_id"], "--json")):
        out = run_inproc(*args, "--store", world.url, env=env)
        assert out.code == 0, f"expected {args[0]} to succeed: {out.stderr[-2000:]}"
        assert not marker.exists(), f"expected `{args[0]}` never to import code named in a record"
