"""Every reuse rule of DESIGN.md ("Reuse rules", "Storage", "Prefect"), end to end through the
real CLI, as one table.

A module-scoped store is prepared once: ``run`` and then ``run --reuse`` of the offline example
agent on a few cases and metrics (so that Prefect's task cache under ``<store>/v1/prefect/``
holds both inference and scoring results, as it does in production after the first reuse).
Each scenario gets a private copy of that store and of the agent dir (``shop_copy``), changes
one thing (a config edit, a damaged object, a planted cache file), runs ``evalsnap run`` and
checks, per (case, metric), whether the unit was reused or scored again — in the ``--json``
output *and* in what the store holds: a unit scored again was written by that run, a reused
unit names the earlier run that wrote it. After every scenario ``evalsnap verify`` runs.

Only the public path is used: the CLI (in the test process, :mod:`tests._cli`; a scenario
that needs code importable puts its directory on ``sys.path``), and the store read through
``evalsnap.records`` and its files. Nothing imports the pipeline, tasks or flows.

The store's files are reached through :class:`StoreFiles` (fsspec, by store-relative path),
so the same table runs on local disk (this module) and in a moto S3 bucket
(``tests/test_reuse_rules_s3.py``, which imports the table and :func:`play`).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fsspec.spec import AbstractFileSystem

from evalsnap.records import EvaluationRecord, ScoreUnit, repo
from tests import _packs
from tests._cli import run_inproc, score_status
from tests.conftest import CliResult, copy_shop

CASES = ("weather_paris", "cart_add_two_items", "greeting_then_weather",
         "weather_paris_stale_reference")
"""Base cases: one and two turns, with and without a session state, and one whose reference
is stale (quality FAILED units, which are complete and so reusable). No unit here is
NOT_EVALUATED, so the base runs exit 1 (a quality failure) and an internal error (exit 3)
cannot pass unnoticed."""
INCOMPLETE_CASE = "out_of_scope_flight"
"""Its ``final_session_state`` is an explicit ``null`` in the eval set: no expectation, so
``final_state_match`` is NOT_EVALUATED there (an incomplete unit)."""
RMS = "response_match_score"
JUDGE = "final_response_match_v2"
STATE = "final_state_match"
CUSTOM = "response_mentions_city"
METRICS = (RMS, JUDGE, STATE, CUSTOM)

Key = tuple[str, str]  # (eval_id, metric)


# ---- the store's files, on local disk or in a bucket -------------------------------------------

@dataclass(frozen=True)
class StoreFiles:
    """A store (``url``, what ``--store`` and ``repo.open_store`` take) and its files by
    store-relative path (``v1/objects/<kind>/<hex[:2]>/<hex[2:]>``, ``v1/refs/runs/<run>``,
    ``v1/prefect/<key>``), read and written through an fsspec filesystem: the same calls on
    local disk and in a bucket."""

    url: str
    fs: AbstractFileSystem = field(repr=False)
    root: str
    """The store's root as ``fs`` names it (a directory, or ``BUCKET/PREFIX``)."""
    env: dict[str, str] = field(default_factory=dict)
    """What a CLI call against this store needs in its environment (a bucket's endpoint)."""

    @classmethod
    def local(cls, path: Path) -> StoreFiles:
        fs = fsspec.filesystem("file")
        return cls(str(path), fs, fs._strip_protocol(str(path)))

    def at(self, rel: str) -> str:
        return f"{self.root}/{rel}"

    def read(self, rel: str) -> bytes:
        data: bytes = self.fs.cat_file(self.at(rel))
        return data

    def write(self, rel: str, data: bytes) -> None:
        self.fs.pipe_file(self.at(rel), data)

    def delete(self, rel: str) -> None:
        self.fs.rm_file(self.at(rel))

    def is_file(self, rel: str) -> bool:
        return bool(self.fs.isfile(self.at(rel)))

    def files(self, rel: str) -> list[str]:
        """Every file under ``rel`` (store-relative, sorted); none if there is no ``rel``."""
        return sorted(self._rel(p) for p in self.fs.find(self.at(rel)))

    def names(self, rel: str) -> list[str]:
        """The names of the files directly in ``rel`` (sorted)."""
        return sorted(self._rel(e["name"]).rsplit("/", 1)[-1]
                      for e in self.fs.ls(self.at(rel), detail=True) if e["type"] == "file")

    def copy_into(self, dest: StoreFiles) -> None:
        """Every file of this store copied to the same place in ``dest`` (same filesystem):
        in a bucket, one server-side copy per object. The paths are listed once and given
        to ``copy`` as lists (``copy(root, ..., recursive=True)`` expands them again, path
        by path: 3 s instead of 1 s for the prepared store's 107 objects on moto)."""
        sources = self.fs.find(self.root)
        assert sources, f"expected files to copy under {self.root}"
        self.fs.copy(sources, [dest.at(self._rel(p)) for p in sources])

    def open(self) -> Any:
        """A new :class:`storage.Store` on the store, as a reader of it opens one."""
        return repo.open_store(self.url)

    def _rel(self, path: str) -> str:
        path = self.fs._strip_protocol(path)
        assert path.startswith(self.root + "/"), f"expected {path} under {self.root}"
        return path[len(self.root) + 1:]


# ---- helpers ----------------------------------------------------------------------------------

def run_args(agent: Path, store: StoreFiles, *flags: str, cases: tuple[str, ...] = CASES,
             metrics: tuple[str, ...] = METRICS) -> list[str]:
    args = ["run", str(agent), str(agent / "shop.evalset.json"), "--store", store.url,
            "--json", *flags]
    for c in cases:
        args += ["--case", c]
    for m in metrics:
        args += ["--metric", m]
    return args


def object_key(kind: str, oid: str) -> str:
    """Where object ``oid`` of ``kind`` lives in a store (layout v1), store-relative."""
    hexd = oid.removeprefix("sha256:")
    return f"v1/objects/{kind}/{hexd[:2]}/{hexd[2:]}"


def manifests(store: StoreFiles) -> dict[str, dict[str, Any]]:
    runs = "v1/refs/runs"
    return {name: json.loads(store.read(f"{runs}/{name}")) for name in store.names(runs)}


def prefect_files(store: StoreFiles) -> list[str]:
    return store.files("v1/prefect")


def units_of(result: dict[str, Any]) -> dict[Key, dict[str, Any]]:
    return {(c["eval_id"], m): v for c in result["cases"] for m, v in c["metrics"].items()}


def edit_config(agent: Path, change: Callable[[dict[str, Any]], None]) -> None:
    path = agent / "test_config.json"
    config = json.loads(path.read_text("utf-8"))
    change(config)
    path.write_text(json.dumps(config, indent=2), "utf-8")


def stored_record(store: StoreFiles, run_id: str) -> tuple[str, EvaluationRecord]:
    return repo.resolve_record(store.open(), run_id)


def stored_unit(store: StoreFiles, oid: str) -> ScoreUnit:
    return repo.find(store.open(), ScoreUnit, oid)


# ---- the prepared store -----------------------------------------------------------------------

@dataclass
class Base:
    agent: Path
    store: StoreFiles
    first: dict[str, Any]
    first_code: int
    reuse: dict[str, Any]


def prepare(root: Path, store: StoreFiles) -> Base:
    """The prepared store (``run``, then ``run --reuse``) in ``store``; its agent dir under
    ``root``."""
    agent = copy_shop(root / "agents" / "shop_agent")
    env = store.env
    first = run_inproc(*run_args(agent, store), env=env)
    assert first.code in (0, 1), f"expected the base run to finish (exit 0/1), got {first.code}: " \
                                 f"{first.stderr[-3000:]}"
    again = run_inproc(*run_args(agent, store, "--reuse"), env=env)
    assert again.code == first.code, f"expected the base --reuse run to exit {first.code}, got " \
                                     f"{again.code}: {again.stderr[-3000:]}"
    assert again.json["scored_units"] == 0 and again.json["agent_calls"] == 0, \
        f"expected the base --reuse run to reuse everything: {again.stdout[-2000:]}"
    # whatever its layout, Prefect's task cache now holds results for the planted scenarios
    assert prefect_files(store), "expected Prefect result storage files under v1/prefect/"
    verify = run_inproc("verify", "--store", store.url, "--json", env=env)
    assert verify.code == 0, f"expected the prepared store to verify clean: {verify.stdout}"
    return Base(agent, store, first.json, first.code, again.json)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Base:
    root = tmp_path_factory.mktemp("reuse_rules")
    return prepare(root, StoreFiles.local(root / "store"))


@dataclass
class World:
    """One scenario's private copy of the prepared store, with its own agent dir."""

    base: Base
    agent: Path
    store: StoreFiles
    tmp: Path
    env: dict[str, str] = field(default_factory=dict)
    syspath: list[str] = field(default_factory=list)
    """Directories put on ``sys.path`` for the scenario's runs (the CLI runs in this process)."""
    runs_before_damage: set[str] | None = None
    damaged: dict[str, str] = field(default_factory=dict)
    """oid → kind of each object this scenario damaged or deleted on purpose."""
    notes: dict[str, Any] = field(default_factory=dict)

    def base_unit_oid(self, key: Key) -> str:
        _, record = stored_record(self.store, self.base.first["run_id"])
        return next(u.unit_oid for u in record.units if (u.eval_id, u.metric_name) == key)

    def base_inference_oid(self, eval_id: str) -> str:
        _, record = stored_record(self.store, self.base.first["run_id"])
        return next(i.inference_oid for i in record.inference if i.eval_id == eval_id)

    def start_damage(self) -> None:
        self.runs_before_damage = set(manifests(self.store))


# ---- what each scenario does before its checked runs ------------------------------------------

def drop_custom_version(w: World) -> None:
    edit_config(w.agent, lambda c: c["customMetrics"][CUSTOM].pop("version"))


def bump_custom_version(w: World) -> None:
    def change(c: dict[str, Any]) -> None:
        assert c["customMetrics"][CUSTOM]["version"] == "1", "expected the example at version 1"
        c["customMetrics"][CUSTOM]["version"] = "2"
    edit_config(w.agent, change)


def rms_threshold(w: World) -> None:
    edit_config(w.agent, lambda c: c["criteria"].__setitem__(RMS, 0.99))


def judge_threshold(w: World) -> None:
    edit_config(w.agent, lambda c: c["criteria"][JUDGE].__setitem__("threshold", 0.9))


def judge_four_samples(w: World) -> None:
    # a new numSamples is a new rule key: the garbled first run cannot fall back on the
    # prepared store's complete units of the old key
    edit_config(w.agent, lambda c: c["criteria"][JUDGE]["judgeModelOptions"].__setitem__(
        "numSamples", 4))


DAMAGED_UNIT: Key = ("weather_paris", RMS)
DELETED_UNIT: Key = ("cart_add_two_items", JUDGE)
DAMAGED_INFERENCE = "greeting_then_weather"


def damage_units(w: World) -> None:
    """A scoring task writes its units only as packs: one unit's text in its pack is damaged
    (the pack no longer hashes to its name; its other members still match their ids), and
    the pack holding another unit is deleted (every unit it held is gone)."""
    w.start_damage()
    damaged, deleted = w.base_unit_oid(DAMAGED_UNIT), w.base_unit_oid(DELETED_UNIT)
    damaged_pack = _packs.pack_of(w.store, "unit", damaged)
    w.notes["damaged_pack"] = _pack_oid(damaged_pack)
    _packs.damage_member(w.store, "unit", damaged)
    gone = _packs.pack_of(w.store, "unit", deleted)
    assert gone != damaged_pack, "expected the two units in packs of their own metrics"
    held = {m["oid"] for m in json.loads(w.store.read(gone))["members"] if m["kind"] == "unit"}
    w.store.delete(gone)
    _, record = stored_record(w.store, w.base.first["run_id"])
    w.notes["lost"] = {(u.eval_id, u.metric_name) for u in record.units if u.unit_oid in held}
    assert DELETED_UNIT in w.notes["lost"]
    w.damaged = {damaged: "unit", **dict.fromkeys(held, "unit"),
                 _pack_oid(damaged_pack): "pack", _pack_oid(gone): "pack"}


def _pack_oid(rel: str) -> str:
    """The id of the pack at store-relative path ``rel``."""
    return "sha256:" + "".join(rel.removeprefix("v1/objects/pack/").split("/"))


def damage_inference(w: World) -> None:
    w.start_damage()
    oid = w.base_inference_oid(DAMAGED_INFERENCE)
    key = object_key("inference", oid)
    assert w.store.is_file(key), \
        f"expected the inference object of {DAMAGED_INFERENCE} at {w.store.at(key)}"
    original = w.store.read(key)
    w.store.write(key, original.replace(b"Berlin", b"Bxrlin"))
    assert w.store.read(key) != original, "expected the inference bytes to be damaged"
    w.damaged = {oid: "inference"}


DAMAGED_JUDGE_CASE = "weather_paris"


def damage_judge_entry(w: World) -> None:
    """A stricter judge threshold (the judge's answers come from the ledger) and one ledger
    entry of the judge metric damaged: ``verify`` names it at once."""
    judge_threshold(w)
    w.start_damage()
    unit = stored_unit(w.store, w.base_unit_oid((DAMAGED_JUDGE_CASE, JUDGE)))
    assert unit.ledger, f"expected ledger entries on the {JUDGE} unit of {DAMAGED_JUDGE_CASE}"
    oid = unit.ledger[0]
    held_by = _packs.pack_of(w.store, "judge", oid)
    _packs.damage_member(w.store, "judge", oid)
    w.damaged = {oid: "judge", _pack_oid(held_by): "pack"}
    found = run_inproc("verify", "--store", w.store.url, "--json", env=w.env)
    assert found.code == 1 and oid in {p["oid"] for p in found.json["problems"]}, \
        f"expected verify to name the damaged judge entry {oid}: {found.stdout[-2000:]}"


def damage_outcomes(w: World) -> None:
    """Every ``outcomes`` object (a scoring task's rows, which Prefect's cached result names:
    issue 31) damaged — a status flipped, so that using one would show — or deleted."""
    w.start_damage()
    objects = w.store.files("v1/objects/outcomes")
    assert objects, "expected the prepared store's cached scoring results to name outcomes"
    deleted = set()
    for n, rel in enumerate(objects):
        oid = "sha256:" + "".join(rel.removeprefix("v1/objects/outcomes/").split("/"))
        if n % 2:
            w.store.delete(rel)
            deleted.add(oid)
            continue
        w.damaged[oid] = "outcomes"
        original = w.store.read(rel)
        flipped = original.replace(b'"PASSED"', b'"FAILED"')
        assert flipped != original, f"expected a PASSED unit in {rel}"
        w.store.write(rel, flipped)
    assert deleted and w.damaged, objects
    w.notes["deleted"] = deleted
    # verify names each, damaged or gone, at once (a deleted one through the cached result
    # naming it; once the run below caches sound rows, nothing names it any more)
    found = run_inproc("verify", "--store", w.store.url, "--json", env=w.env)
    messages = " ".join(p["message"] for p in found.json["problems"])
    named = {p["oid"] for p in found.json["problems"]}
    assert found.code == 1 and set(w.damaged) <= named and all(o in messages for o in deleted), \
        f"expected verify to name every damaged or deleted outcomes object: {found.stdout[-3000:]}"


def outcomes_not_used(w: World, runs: list[CliResult]) -> None:
    """What the damaged rows said was not used: the run's results are the base run's, and
    each cached scoring result now names a sound object."""
    out = runs[-1].json
    assert score_status(out) == score_status(w.base.reuse), \
        "expected the results of the base --reuse run, not those of the damaged rows"
    store = w.store.open()
    for name in store.list_task_results():
        result = json.loads(json.loads(store.get_task_result(name) or b"")["result"])
        if isinstance(result, dict):
            assert result["outcomes"] not in {*w.damaged, *w.notes["deleted"]} and \
                _sound(w, result["outcomes"], "outcomes"), result
    _assert_new_manifests_name_no_damaged_object(w)


class _PickleBomb:
    """Unpickling this creates the marker file (``open(marker, "w")``)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.marker, "w"))


def _pickle_record(metadata: dict[str, Any], marker: Path) -> bytes:
    from prefect.serializers import PickleSerializer

    serializer = PickleSerializer()
    return json.dumps({"metadata": {**metadata, "serializer": serializer.model_dump(mode="json")},
                       "result": serializer.dumps(_PickleBomb(marker)).decode()}).encode()


def _trap_module(directory: Path, name: str, marker: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.py").write_text(
        "from pathlib import Path\n"
        f"Path({str(marker)!r}).write_text('imported by a Prefect result file')\n"
        "class Trap(dict):\n    pass\n", "utf-8")


def _json_record(metadata: dict[str, Any], module: str) -> bytes:
    from prefect.serializers import JSONSerializer

    serializer = JSONSerializer()
    payload = [{"__class__": f"{module}.Trap", "data": {}}]
    return json.dumps({"metadata": {**metadata, "serializer": serializer.model_dump(mode="json")},
                       "result": serializer.dumps(payload).decode()}).encode()


def _assert_live(data: bytes, probe: Path) -> None:
    """The planted record runs code when Prefect itself loads it: the test can fail."""
    from prefect._internal.result_records import ResultRecord

    try:
        ResultRecord.deserialize(data)
    except Exception:  # noqa: BLE001 - only the side effect matters
        pass
    assert probe.exists(), "expected the planted record to run code when Prefect loads it " \
                           "(the test's bomb must be live)"
    probe.unlink()


def _replace_prefect_files(w: World, build: Callable[[dict[str, Any]], bytes]) -> None:
    files = prefect_files(w.store)
    assert files, "expected Prefect result files under v1/prefect/ to replace"
    for rel in files:
        real = json.loads(w.store.read(rel))
        assert set(real) == {"metadata", "result"} and "serializer" in real["metadata"], \
            f"expected Prefect's result record shape {{metadata, result}} in {rel}: {real}"
        planted = build(real["metadata"])
        w.store.write(rel, planted)
        assert w.store.read(rel) == planted, f"expected the planted record in place at {rel}"
    w.notes["planted"] = len(files)


def plant_pickle(w: World) -> None:
    marker = w.tmp / "PICKLE_EXECUTED"
    w.notes["marker"] = marker
    _assert_live(_pickle_record({}, w.tmp / "probe"), w.tmp / "probe")
    _replace_prefect_files(w, lambda metadata: _pickle_record(metadata, marker))


def plant_json_class(w: World) -> None:
    import sys

    marker = w.tmp / "JSON_CLASS_IMPORTED"
    w.notes["marker"] = marker
    code = w.tmp / "planted_code"
    _trap_module(code, "evalsnap_planted_trap", marker)
    _trap_module(code, "evalsnap_planted_probe", w.tmp / "probe")
    sys.path.insert(0, str(code))
    try:
        _assert_live(_json_record({}, "evalsnap_planted_probe"), w.tmp / "probe")
    finally:
        sys.path.remove(str(code))
        sys.modules.pop("evalsnap_planted_probe", None)
    # the import *would* succeed in the CLI's calls: the trap's directory is on sys.path
    # for the scenario's runs (the in-process CLI imports user code afresh for each call)
    w.syspath.append(str(code))
    _replace_prefect_files(w, lambda metadata: _json_record(metadata, "evalsnap_planted_trap"))


# ---- extra checks -----------------------------------------------------------------------------

def marker_absent(w: World, r: CliResult) -> None:
    marker: Path = w.notes["marker"]
    assert not marker.exists(), \
        f"expected no code from Prefect's result storage to run, but {marker.name} was " \
        f"created (the run exited {r.code})"


def all_from_index(w: World, runs: list[CliResult]) -> None:
    out = runs[-1].json
    assert out["agent_calls"] == 0 and out["judge_calls"] == 0, \
        f"expected every inference and judge answer from evalsnap's own index, got " \
        f"agent_calls={out['agent_calls']} judge_calls={out['judge_calls']}"


def no_judge_calls(w: World, runs: list[CliResult]) -> None:
    out = runs[-1].json
    assert out["judge_calls"] == 0, \
        f"expected a threshold-only change to make no judge call, got {out['judge_calls']}"
    assert out["reused_judge_samples"] > 0, \
        "expected the judge answers to come from the ledger (reused_judge_samples > 0)"
    assert {u["threshold"] for (_, m), u in units_of(out).items() if m == JUDGE} == {0.9}, \
        "expected the new threshold 0.9 on every judge unit"


def judge_asked_again_for_the_damaged_entry(w: World, runs: list[CliResult]) -> None:
    """The damaged entry is never an answer: its one sample goes to the judge again, every
    other sample comes from the ledger."""
    out = runs[-1].json
    assert out["judge_calls"] == 1, \
        f"expected one judge call (the damaged entry's sample), got {out['judge_calls']}"
    assert out["reused_judge_samples"] > 0, "expected the other answers from the ledger"
    _assert_new_manifests_name_no_damaged_object(w)
    [oid] = [o for o, kind in w.damaged.items() if kind == "judge"]
    assert _sound(w, oid, "judge"), "expected the judge's same answer to repair the entry"
    assert all(_sound(w, o, kind) for o, kind in w.damaged.items()), \
        "expected the pack that held the entry rebuilt whole (its other members were sound)"


def new_rms_threshold(w: World, runs: list[CliResult]) -> None:
    out = runs[-1].json
    assert {u["threshold"] for (_, m), u in units_of(out).items() if m == RMS} == {0.99}, \
        f"expected the new threshold 0.99 on every {RMS} unit"
    assert out["agent_calls"] == 0 and out["judge_calls"] == 0, \
        "expected a deterministic threshold change to call neither the agent nor the judge"


def incomplete_stays_incomplete(w: World, runs: list[CliResult]) -> None:
    for r in runs:
        u = units_of(r.json)[(INCOMPLETE_CASE, STATE)]
        assert u["status"] == "NOT_EVALUATED" and not u["complete"], \
            f"expected {INCOMPLETE_CASE}/{STATE} to stay NOT_EVALUATED, got {u}"
        assert not r.json["complete"], "expected the run to report itself incomplete"


def garbled_then_complete(w: World, runs: list[CliResult]) -> None:
    first, again = w.notes["pre"][0].json, runs[-1].json
    for c in CASES:
        assert not units_of(first)[(c, JUDGE)]["complete"], \
            f"expected the garbled run to leave {c}/{JUDGE} incomplete"
        assert units_of(again)[(c, JUDGE)]["complete"], \
            f"expected {c}/{JUDGE} complete once the judge answers properly"
    assert again["judge_calls"] > 0, "expected the judge to be asked again for the errored samples"


def units_rescored_cleanly(w: World, runs: list[CliResult]) -> None:
    _assert_new_manifests_name_no_damaged_object(w)
    # scored again on the same inputs, a deterministic unit is the same bytes: its pack,
    # whose other members were sound, is rebuilt whole (repaired)
    assert _sound(w, w.base_unit_oid(DAMAGED_UNIT), "unit"), \
        f"expected the damaged unit of {DAMAGED_UNIT} repaired by the run that scored it again"
    assert _sound(w, w.notes["damaged_pack"], "pack"), \
        "expected the pack that held the damaged unit rebuilt whole by the run"


def inference_rerun_for_one_case(w: World, runs: list[CliResult]) -> None:
    out = runs[-1].json
    base_calls = w.base.first["agent_calls"]
    assert 0 < out["agent_calls"] < base_calls, \
        f"expected the agent to run again for {DAMAGED_INFERENCE} only: 0 < agent_calls < " \
        f"{base_calls}, got {out['agent_calls']}"
    reused = {c["eval_id"]: c["inference_reused"] for c in out["cases"]}
    assert reused == {c: c != DAMAGED_INFERENCE for c in CASES}, \
        f"expected only {DAMAGED_INFERENCE}'s inference to be run again, got {reused}"
    _, record = stored_record(w.store, out["run_id"])
    new_oid = next(i.inference_oid for i in record.inference if i.eval_id == DAMAGED_INFERENCE)
    assert new_oid not in w.damaged, "expected the new record to name a sound inference object"
    _assert_new_manifests_name_no_damaged_object(w)


def forced(w: World, runs: list[CliResult]) -> None:
    out = runs[-1].json
    assert out["reused_units"] == 0, f"expected --force to reuse no unit, got {out['reused_units']}"
    _, record = stored_record(w.store, out["run_id"])
    assert record.force and record.reuse, "expected the record to say reuse and force"
    assert record.parent_record == w.base.reuse["record_id"], \
        "expected the forced record's parent to be the latest earlier record"
    # both records are kept
    assert {w.base.first["run_id"], w.base.reuse["run_id"], out["run_id"]} <= set(
        manifests(w.store)), "expected every earlier run to stay in the store"


def _sound(w: World, oid: str, kind: str) -> bool:
    """Whether ``oid`` is there, whole, for every reader: a pack that hashes to its name; a
    unit or judge entry that every record naming it (through its units' ledgers) can read
    (from the packs it names, or a loose copy); any other object by its id."""
    from evalsnap.reports.verify import RECORD_TYPES

    if kind in ("pack", "outcomes"):
        rel = object_key(kind, oid)
        return w.store.is_file(rel) and \
            "sha256:" + hashlib.sha256(w.store.read(rel)).hexdigest() == oid
    try:
        if kind not in ("unit", "judge"):
            repo.get(w.store.open(), RECORD_TYPES[kind], oid)
            return True
        for run_id in manifests(w.store):
            store = w.store.open()
            _, record = repo.resolve_record(store, run_id)
            for ref in record.units:
                if kind == "unit" and ref.unit_oid == oid:
                    repo.get(store, ScoreUnit, oid)
                elif kind == "judge":
                    try:
                        ledger = repo.get(store, ScoreUnit, ref.unit_oid).ledger
                    except Exception:  # noqa: BLE001 - its unit is another finding
                        continue
                    if oid in ledger:
                        repo.get(store, RECORD_TYPES[kind], oid)
    except Exception:  # noqa: BLE001 - any failure to read it is "not sound"
        return False
    return True


def _assert_new_manifests_name_no_damaged_object(w: World) -> None:
    assert w.runs_before_damage is not None
    new = {k: m for k, m in manifests(w.store).items() if k not in w.runs_before_damage}
    assert new, "expected a manifest written after the damage"
    for run_id, m in new.items():
        named = {e["oid"] for e in m["objects"]} | {m["record_oid"]}
        _, record = stored_record(w.store, run_id)
        named |= {u.unit_oid for u in record.units} | {i.inference_oid for i in record.inference}
        # a damaged object the run did again is the same object, sound again (repaired)
        still = {oid for oid in named & set(w.damaged) if not _sound(w, oid, w.damaged[oid])}
        assert not still, \
            f"expected run {run_id} (written after the damage) to name no damaged or deleted " \
            f"object, but it names {sorted(still)}"
        packs = [e["oid"] for e in m["objects"] if e["kind"] == "pack"]
        held = {mem["oid"] for p in packs if w.store.is_file(object_key("pack", p))
                for mem in json.loads(w.store.read(object_key("pack", p)))["members"]}
        for entry in m["objects"]:
            assert w.store.is_file(object_key(entry["kind"], entry["oid"])) or (
                entry["kind"] in ("unit", "judge") and entry["oid"] in held), \
                f"expected {entry['kind']} object {entry['oid']} named by run {run_id} to exist"


# ---- the table --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Scenario:
    name: str
    scored: Callable[[World], set[Key]]
    """Units expected to be scored again in every checked run; every other unit is reused."""
    setup: Callable[[World], None] = lambda w: None
    pre_runs: tuple[tuple[str, ...], ...] = ()
    """Unchecked runs after ``setup`` (their flags); each must exit as ``pre_code`` says."""
    pre_env: dict[str, str] = field(default_factory=dict)
    pre_code: int | None = None
    checked: int = 1
    """How many checked ``run`` commands follow."""
    flags: tuple[str, ...] = ("--reuse",)
    cases: tuple[str, ...] = CASES
    code: int | None = None
    """Expected exit code of the checked runs; None: the base run's."""
    why: dict[str, str] = field(default_factory=dict)
    """metric → expected ``why`` of its scored units (where the README documents it)."""
    guard: Callable[[World, CliResult], None] = lambda w, r: None
    """Checked right after each run, before anything else (the most important check)."""
    extra: Callable[[World, list[CliResult]], None] = lambda w, runs: None
    damage: bool = False
    """The scenario damaged objects that only earlier manifests name (see ``check_verify``)."""


def per_metric(*metrics: str, cases: tuple[str, ...] = CASES) -> Callable[[World], set[Key]]:
    return lambda w: {(c, m) for c in cases for m in metrics}


def units(*keys: Key) -> Callable[[World], set[Key]]:
    return lambda w: set(keys)


SCENARIOS = [
    # Without a declared version a custom metric is never reused automatically: not on the
    # first --reuse run, not on the second, when Prefect's task cache holds a result for it.
    Scenario("unversioned_custom_metric", per_metric(CUSTOM), setup=drop_custom_version,
             pre_runs=((),), checked=2, why={CUSTOM: "no trusted version"}),
    Scenario("versioned_custom_metric", units()),
    # NOT_EVALUATED (no expectation for the final state) is incomplete: scored again by
    # every --reuse run, never reused — also when Prefect cached the task that produced it
    Scenario("incomplete_not_evaluated_unit", units((INCOMPLETE_CASE, STATE)),
             pre_runs=(("--reuse",),), pre_code=3, checked=2, code=3,
             cases=(*CASES, INCOMPLETE_CASE), why={STATE: "incomplete before"},
             extra=incomplete_stays_incomplete),
    # errored judge samples make a unit incomplete: scored again, never reused
    Scenario("incomplete_garbled_judge_unit", per_metric(JUDGE), setup=judge_four_samples,
             pre_runs=(("--reuse",),), pre_env={"EVALSNAP_DEMO_JUDGE_GARBLE": "1"},
             pre_code=3, why={JUDGE: "incomplete before"}, extra=garbled_then_complete),
    # a damaged object counts as absent for reuse: the work is done again, the run succeeds
    Scenario("damaged_unit_object", lambda w: {DAMAGED_UNIT, *w.notes["lost"]},
             setup=damage_units, extra=units_rescored_cleanly, damage=True),
    Scenario("damaged_inference_object", units(), setup=damage_inference,
             extra=inference_rerun_for_one_case, damage=True),
    # a cached scoring result whose rows are damaged or gone is absent: the task runs (its
    # units all reused from the unit index) and caches sound rows
    Scenario("damaged_outcomes_object", units(), setup=damage_outcomes,
             extra=outcomes_not_used, damage=True),
    # a damaged judge entry is never an answer from the ledger: that sample is asked again
    # (verify names the entry before the run; the judge's same answer repairs it, so verify
    # is clean after)
    Scenario("damaged_judge_entry", per_metric(JUDGE), setup=damage_judge_entry,
             why={JUDGE: "rule changed"}, extra=judge_asked_again_for_the_damaged_entry),
    Scenario("changed_threshold_deterministic", per_metric(RMS), setup=rms_threshold,
             why={RMS: "rule changed"}, extra=new_rms_threshold),
    Scenario("changed_threshold_judge", per_metric(JUDGE), setup=judge_threshold,
             why={JUDGE: "rule changed"}, extra=no_judge_calls),
    Scenario("changed_evaluator_version", per_metric(CUSTOM), setup=bump_custom_version,
             why={CUSTOM: "evaluator version changed"}),
    Scenario("force_with_reuse", per_metric(*METRICS), flags=("--reuse", "--force"),
             why={m: "forced" for m in METRICS}, extra=forced),
    # nothing read from Prefect's result storage may import or execute code
    Scenario("planted_pickle_in_prefect_storage", units(), setup=plant_pickle,
             guard=marker_absent, extra=all_from_index),
    Scenario("planted_json_class_in_prefect_storage", units(), setup=plant_json_class,
             guard=marker_absent, extra=all_from_index),
]


@pytest.fixture
def world(prepared: Base, shop_copy: Path, tmp_path: Path) -> World:
    store = tmp_path / "store"
    shutil.copytree(prepared.store.root, store)
    return World(prepared, shop_copy, StoreFiles.local(store), tmp_path)


def check_run(w: World, s: Scenario, r: CliResult, label: str) -> None:
    code = w.base.first_code if s.code is None else s.code
    assert r.code == code, f"{label}: expected exit {code}, got {r.code}; " \
                           f"stderr: {r.stderr[-3000:]}"
    out = r.json
    got = units_of(out)
    expected_keys = {(c, m) for c in s.cases for m in METRICS}
    assert set(got) == expected_keys, f"{label}: expected units {sorted(expected_keys)}, " \
                                      f"got {sorted(got)}"
    scored = s.scored(w)
    want = {k: k not in scored for k in expected_keys}
    have = {k: u["reused"] for k, u in got.items()}
    wrong = {k: f"reused={have[k]} (expected {'reused' if want[k] else 'scored again'}, "
                f"why={got[k]['why']!r})" for k in expected_keys if have[k] != want[k]}
    assert not wrong, f"{label}: expected only {sorted(scored)} scored again, " \
                      f"all else reused; wrong: {wrong}"
    assert out["scored_units"] == len(scored), \
        f"{label}: expected scored_units == {len(scored)}, got {out['scored_units']}"
    assert out["reused_units"] == len(expected_keys) - len(scored), \
        f"{label}: expected reused_units == {len(expected_keys) - len(scored)}, " \
        f"got {out['reused_units']}"
    for k in scored:
        metric = k[1]
        if metric in s.why:
            assert got[k]["why"] == s.why[metric], \
                f"{label}: expected why {s.why[metric]!r} for {k}, got {got[k]['why']!r}"
    # what the store says: a reused unit is one the earlier run it names published (the
    # record its manifest names has it), and it is complete; objects hold no run id
    oid, record = stored_record(w.store, out["run_id"])
    assert oid == out["record_id"], f"{label}: expected the store's record of the run"
    for ref in record.units:
        k = (ref.eval_id, ref.metric_name)
        unit = stored_unit(w.store, ref.unit_oid)
        assert unit.run_id == "", f"{label}: a stored unit names no run, got {unit.run_id!r}"
        if want[k]:
            assert ref.reused and ref.reused_from_run and ref.reused_from_run != out["run_id"], \
                f"{label}: expected {k} reused from an earlier run, got {ref}"
            store = w.store.open()
            earlier = repo.get(store, EvaluationRecord,
                               repo.read_manifest(store, ref.reused_from_run).record_oid)
            listed = {u.unit_oid for u in earlier.units}
            assert ref.unit_oid in listed and unit.complete, \
                f"{label}: expected {k}'s unit published by run {ref.reused_from_run} and " \
                f"complete, got listed={ref.unit_oid in listed}, complete={unit.complete}"
        else:
            assert not ref.reused, \
                f"{label}: expected {k} scored by this run {out['run_id']} (reused={ref.reused})"


def check_verify(w: World, s: Scenario) -> None:
    """``evalsnap verify`` after the scenario.

    Clean scenarios: exit 0. Damage scenarios: the damaged and deleted objects stay as the
    test left them (a unit scored again, or an inference run again, is a new object: its run
    id and timestamps differ), and the prepared runs' manifests still name them, so verify
    does report them (exit 1) — that is correct, since those runs really can no longer be
    reproduced. What must hold is that these are the *only* findings, every finding is about
    one of those objects, any manifest finding is about a run from before the damage, and no
    manifest written after the damage names them (checked in the scenario's extra check).
    """
    r = run_inproc("verify", "--store", w.store.url, "--json", env=w.env)
    report = r.json
    if not s.damage:
        assert r.code == 0 and report["ok"], \
            f"expected verify to exit 0 with nothing wrong, got {r.code}: {report['problems']}"
        return
    assert w.runs_before_damage is not None
    problems = report["problems"]
    if all(_sound(w, oid, kind) for oid, kind in w.damaged.items()):
        # the runs did every damaged object again byte for byte: repaired, nothing to report
        assert r.code == 0 and report["ok"], \
            f"expected verify clean once every damaged object was repaired, got {problems}"
        _assert_new_manifests_name_no_damaged_object(w)
        return
    assert r.code == 1 and problems, \
        f"expected verify to report the deliberately damaged objects (exit 1), got {r.code}"
    stray = [p for p in problems if p["oid"] not in w.damaged]
    assert not stray, f"expected findings only about the damaged objects " \
                      f"{sorted(w.damaged)}, also got: {stray}"
    # a damaged object the run did again byte for byte is repaired (objects hold no run id);
    # one it did differently (judge answers now taken from the ledger) stays damaged
    unsound = {oid for oid, kind in w.damaged.items() if not _sound(w, oid, kind)}
    assert {p["oid"] for p in problems} == unsound, \
        f"expected verify to name every damaged or deleted object still unsound " \
        f"{sorted(unsound)}, got {sorted({p['oid'] for p in problems})}"
    late = [p for p in problems if p["kind"] == "manifest"
            and p["run_id"] not in w.runs_before_damage]
    assert not late, f"expected no manifest written after the damage to name a damaged " \
                     f"object, got: {late}"
    _assert_new_manifests_name_no_damaged_object(w)


def play(w: World, s: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    """Scenario ``s`` in the private store of ``w``: setup, the runs, every check."""
    s.setup(w)
    for directory in w.syspath:
        monkeypatch.syspath_prepend(directory)
    pre = []
    for flags in s.pre_runs:
        r = run_inproc(*run_args(w.agent, w.store, *flags, cases=s.cases),
                    env={**w.env, **s.pre_env})
        code = w.base.first_code if s.pre_code is None else s.pre_code
        assert r.code == code, f"preparatory run {flags}: expected exit {code}, got {r.code}; " \
                               f"stderr: {r.stderr[-3000:]}"
        pre.append(r)
    w.notes["pre"] = pre
    runs = []
    for i in range(s.checked):
        r = run_inproc(*run_args(w.agent, w.store, *s.flags, cases=s.cases), env=w.env)
        runs.append(r)
        s.guard(w, r)
        check_run(w, s, r, f"{s.name}: checked run {i + 1} of {s.checked} ({' '.join(s.flags)})")
    s.extra(w, runs)
    check_verify(w, s)


@pytest.mark.parametrize("s", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_reuse_rule(world: World, s: Scenario, monkeypatch: pytest.MonkeyPatch) -> None:
    play(world, s, monkeypatch)
