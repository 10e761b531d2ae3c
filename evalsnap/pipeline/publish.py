"""Publishing a run: record, indexes, ADK history, then the manifest — last."""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict

from evalsnap import startup
from evalsnap.agents.base import now_iso
from evalsnap.errors import EvalsnapError
from evalsnap.exitcodes import FailOn
from evalsnap.pipeline import efficiency
from evalsnap.pipeline.outcomes import InferenceOutcome, UnitOutcome
from evalsnap.records import (
    EvaluationRecord,
    InferenceRef,
    ManifestEntry,
    RunManifest,
    RunSummary,
    Snapshot,
    UnitRef,
    pack,
    repo,
)
from evalsnap.records.record import Baseline, Coverage, ModelPrice, TokenCounts
from evalsnap.records.snapshot import FrozenCase, cases_by_key
from evalsnap.rows import RowGroups, RowList, Rows, Spool
from storage import Store
from storage.ids import PACKED_KINDS, short_key
from storage.keymap import KeyNumbers

if TYPE_CHECKING:
    from evalsnap.pipeline.context import RunContext

logger = logging.getLogger(__name__)


RECOVERED = "recovered: scored by an interrupted run that published no record"


class _UnusableParent(Exception):
    """The previous record cannot be read; it is never used, not even as a parent pointer."""


class _ParentUnits:
    """The previous record's units by (eval id, repetition, metric), each read from the
    record's rows when it is looked up: a key's 16 bytes and its row's number, ~30 bytes a
    unit (a dict of every parsed reference was ~150 MB at 30,000 cases × 7 metrics, held
    through publish by a ``--reuse`` run). The last of a key's units, as a dict's."""

    def __init__(self, units: Sequence[UnitRef]) -> None:
        self._units = units
        self._at = KeyNumbers()
        for i, u in enumerate(units):
            self._at.put_key(_key_bytes(u.eval_id, u.repetition, u.metric_name), i)

    def get(self, key: tuple[str, int, str]) -> UnitRef | None:
        i = self._at.get_key(_key_bytes(*key))
        return None if i is None else self._units[i]


def _parent_view(store: Any, parent_oid: str | None) -> tuple[_ParentUnits, Snapshot | None]:
    if parent_oid is None:
        return _ParentUnits([]), None
    try:
        parent = repo.get(store, EvaluationRecord, parent_oid)
    except EvalsnapError as exc:
        raise _UnusableParent(str(exc)) from exc
    try:
        snap = repo.get_snapshot(store, parent.snapshot_oid) if parent.snapshot_oid else None
    except EvalsnapError as exc:
        logger.warning("snapshot of previous record %s unreadable (%s); explanations will "
                       "say `new`", parent_oid, exc)
        snap = None
    return _ParentUnits(parent.units), snap


class _Cases:
    """A snapshot's frozen cases by (eval id, repetition), built at the first lookup (publish
    explains every changed unit: a dict built per unit would walk every case per case)."""

    def __init__(self, snapshot: Snapshot | None) -> None:
        self.snapshot = snapshot

    @functools.cached_property
    def by_key(self) -> RowGroups[tuple[str, int], FrozenCase]:
        return cases_by_key(self.snapshot)


def explain_change(outcome: UnitOutcome, snapshot: Snapshot,
                   parent_units: _ParentUnits | Mapping[tuple, UnitRef],
                   parent_snapshot: Snapshot | None, *,
                   cases: tuple[_Cases, _Cases] | None = None) -> str:
    """Names the part of the unit key that changed since the previous record."""
    if outcome.why != "new":
        return outcome.why
    before = parent_units.get((outcome.eval_id, outcome.repetition, outcome.metric_name))
    if before is None or parent_snapshot is None:
        return "new"
    if before.rule_fingerprint != outcome.rule_fingerprint:
        try:
            old_rule = parent_snapshot.rule(outcome.metric_name)
            if old_rule.evaluator != snapshot.rule(outcome.metric_name).evaluator:
                return "evaluator version changed"
        except KeyError:
            return "new"
        return "rule changed"
    if before.case_fingerprint != outcome.case_fingerprint:
        then, now = cases or (_Cases(parent_snapshot), _Cases(snapshot))
        old = then.by_key.first((outcome.eval_id, outcome.repetition))
        new = now.by_key.first((outcome.eval_id, outcome.repetition))
        if old is not None and new is not None and old.reference != new.reference:
            return "reference changed"
        return "inference changed"
    return "new"


def inference_ref(store: Store, outcome: InferenceOutcome, run_id: str) -> tuple[InferenceRef, int]:
    """The record's entry for one inference, with ADK's efficiency metrics and the agent's
    tokens (one read of the inference); and how many of this run's agent calls in it have
    no recorded token usage."""
    fresh = outcome.run_id == run_id
    calls = outcome.model_calls if fresh else 0
    ref = InferenceRef(
        eval_id=outcome.eval_id, repetition=outcome.repetition, inference_oid=outcome.oid,
        inference_fingerprint=outcome.fingerprint, status=outcome.status, reused=not fresh,
        model_calls=calls)
    try:
        inference = repo.get_inference(store, outcome.oid)
    except EvalsnapError as exc:
        logger.warning("inference %s unreadable at publish (%s): no efficiency or tokens for "
                       "%s", outcome.oid, exc, outcome.eval_id)
        return ref, calls
    by_model, reported = efficiency.agent_tokens_by_model(inference)
    return ref.model_copy(update={
        "efficiency": efficiency.efficiency_of(inference),
        "tokens": efficiency.total(by_model.values()), "tokens_by_model": by_model,
    }), max(0, calls - reported)


def token_summary(inf_refs: Iterable[InferenceRef], agent_unreported: int,
                  judge_by_model: dict[str, TokenCounts], judge_unreported: int,
                  judge_calls: int, prices: dict[str, ModelPrice] | None) -> dict[str, Any]:
    """The RunSummary fields of tokens and cost: what this run spent, and what the
    inference the record scores cost whoever ran it."""
    agent_by_model: dict[str, TokenCounts] = {}
    agent_calls = 0
    for r in inf_refs:  # one pass (rows: each read as it comes)
        if not r.reused:
            efficiency.merge_by_model(agent_by_model, r.tokens_by_model)
            agent_calls += r.model_calls
    model_tokens = dict(agent_by_model)
    efficiency.merge_by_model(model_tokens, judge_by_model)
    cost, used, note = efficiency.estimate_cost(model_tokens, prices,
                                                agent_unreported + judge_unreported)
    return {
        "agent_tokens": efficiency.ZERO if agent_calls == 0
        else efficiency.total(agent_by_model.values()),
        "judge_tokens": efficiency.ZERO if judge_calls == 0
        else efficiency.total(judge_by_model.values()),
        "inference_tokens": efficiency.total(r.tokens for r in inf_refs),
        "model_tokens": dict(sorted(model_tokens.items())),
        "estimated_cost": cost, "prices": used, "cost_note": note,
    }


class PublishRequest(BaseModel):
    """What the publish task is asked to do."""

    model_config = ConfigDict(frozen=True)

    store_url: str
    run_id: str
    kind: Literal["run", "rescore"]
    snapshot_oid: str
    inference: RowList[InferenceOutcome]
    units: RowList[UnitOutcome]
    """Every unit's outcome: :class:`~evalsnap.rows.Rows` from the scoring tasks (their
    JSON, in a temporary file past a few MB), read a unit at a time."""
    reuse: bool
    force: bool
    source: str | None = None
    skipped_cases: list[str] = []
    uninferred_cases: list[str] = []
    agent_dir: str | None = None
    """Where a local store's ADK history copy goes (``AGENT_DIR/.adk/eval_history``)."""
    prices: dict[str, ModelPrice] | None = None
    """The config's ``evalsnapPrices`` (None: no table), for the estimated cost only."""
    coverage: Coverage | None = None
    """What of the eval set and config the run covers (the plan knows)."""
    baseline: Baseline | None = None
    """The earlier record the run is compared with (``--baseline``), if any."""
    fail_on: FailOn | None = None
    """The run's gate (``--fail-on``), recorded: what makes the run *good* (``last-good``)."""


def _key_bytes(eval_id: str, repetition: int, metric: str) -> bytes:
    return short_key(json.dumps([eval_id, repetition, metric]))


def _unit_key(eval_id: str, repetition: int, metric: str) -> int:
    return int.from_bytes(_key_bytes(eval_id, repetition, metric))


def _unscored(snapshot: Snapshot, inference: Iterable[InferenceOutcome],
              units: Iterable[UnitOutcome], have: tuple[int, int],
              uninferred: list[str]) -> list[str]:
    """What the run selected and has no unit for (a run that scored nothing passes nothing).
    ``have``: how many units the run has, and the sum of their (eval id, repetition, metric)
    keys (:func:`_unit_key`): when every selected pair's key adds up to the same, no pair is
    missing, and ``units`` are not read again for a set of 210,000 keys."""
    def wanted() -> Iterator[tuple[str, int, str]]:
        return ((i.eval_id, i.repetition, r.metric_name) for i in inference
                for r in snapshot.rules)

    n = total = 0
    for key in wanted():
        n, total = n + 1, total + _unit_key(*key)
    if (n, total) == have:
        return [f"{c}/*" for c in uninferred]
    found = {(o.eval_id, o.repetition, o.metric_name) for o in units}
    missing = [f"{e}#{rep}/{m}" for e, rep, m in wanted() if (e, rep, m) not in found]
    if missing:
        logger.warning("%d selected case × metric pairs have no unit (first %s): the run is "
                       "incomplete", len(missing), missing[0])
    return [f"{c}/*" for c in uninferred] + missing


def publish_request(req: PublishRequest, ctx: RunContext) -> tuple[str, EvaluationRecord]:
    """:func:`publish` for a request, with the ADK history copy."""
    from evalsnap.adk.history import history_writer

    return publish(req, ctx, history_writer=history_writer(ctx.store, req.agent_dir))


def publish(req: PublishRequest, ctx: RunContext, *,
            history_writer: Any = None) -> tuple[str, EvaluationRecord]:
    """Writes the record, points indexes at it, then writes the run manifest last (the
    commit, in ``ctx``'s commits); the record's views (the HTML page, Prefect artifacts) are
    the caller's, after the commit."""
    store = ctx.store
    snapshot = repo.get_snapshot(store, req.snapshot_oid)
    unit_packs = _own_packs(store, req.units, req.run_id)
    startup.give_back_freed()  # the packs read (~70 MB of packs and members a batch)
    pack.repair(store)  # a damaged pack whose members this run did again (in any process)
    parent_oid = repo.latest_record_for(store, snapshot.eval_set_id)
    try:
        parent_units, parent_snapshot = _parent_view(store, parent_oid)
    except _UnusableParent as exc:
        logger.warning("previous record %s is unusable (%s); this record names no parent",
                       parent_oid, exc)
        parent_oid, parent_units, parent_snapshot = None, _ParentUnits([]), None
    readable_cache: dict[str, EvaluationRecord | None] = {}

    def provenance(oid: str | None) -> EvaluationRecord | None:
        """A provenance pointer names only a record that can be read (never a damaged one)."""
        if oid is None:
            return None
        if oid not in readable_cache:
            try:
                readable_cache[oid] = repo.get(store, EvaluationRecord, oid)
            except EvalsnapError as exc:
                logger.warning("record %s unusable as provenance: %s", oid, exc)
                readable_cache[oid] = None
        return readable_cache[oid]

    @functools.cache
    def record_of(run: str) -> str | None:
        """The record a run published (one manifest read per run, not per unit)."""
        try:
            return repo.read_manifest(store, run).record_oid
        except EvalsnapError:
            return None

    def published_origin(o: UnitOutcome) -> tuple[str | None, EvaluationRecord | None]:
        """Lineage names only a readable record that its run published (has a manifest): the
        record the reuse named, else the one the unit's run published, else the one the unit
        index names now. None: a killed run scored it (Prefect's cache kept its task)."""
        def indexed() -> str | None:
            entry = repo.unit_index_entry(store, o.unit_fingerprint) or {}
            return entry.get("record_oid") if entry.get("unit_oid") == o.unit_oid else None

        for candidate in (lambda: o.reused_from_record, lambda: record_of(o.run_id), indexed):
            oid = candidate()
            record = provenance(oid)
            if record is not None and record_of(record.run_id) == oid:
                return oid, record
        return None, None

    # One pass over the units (each read from its row as it comes: the scoring tasks keep
    # them as JSON, not as 210,000 models at 30,000 cases): the record's references, and
    # what the summary and the commit need of them
    unit_refs = Rows(UnitRef)  # the record's, as rows (a batch of models at a time)
    batch: list[UnitRef] = []
    repetitions = False
    cases = (_Cases(parent_snapshot), _Cases(snapshot))
    have = 0  # the sum of each unit's (eval id, repetition, metric) key (see _unscored)
    n_units = n_fresh = judge_calls = reused_samples = judge_unreported = 0
    judge_by_model: dict[str, TokenCounts] = {}
    all_passed = all_complete = True
    indexed = Spool()  # the units the index points at, as JSON rows: 8 bytes a unit in memory
    index_batch: list[bytes] = []
    indexed_packs: dict[str, None] = {}
    # the manifest lists a unit only where no pack holds it (a loose unit of an earlier
    # version): a pack the record names is the object of its members, and listing 70,000
    # units made a 10,000-case run's manifest 8 MB, read again by the site and `history`
    loose_units: dict[str, None] = {}
    for o in req.units:
        n_units += 1
        reused = o.run_id != req.run_id
        origin_oid, origin = published_origin(o) if reused else (None, None)
        batch.append(UnitRef(
            eval_id=o.eval_id, repetition=o.repetition, metric_name=o.metric_name,
            unit_oid=o.unit_oid, unit_fingerprint=o.unit_fingerprint,
            case_fingerprint=o.case_fingerprint, rule_fingerprint=o.rule_fingerprint,
            reused=reused, reused_from_run=origin.run_id if origin else None,
            reused_from_record=origin_oid if origin else None,
            why=("reused" if origin else RECOVERED) if reused
            else explain_change(o, snapshot, parent_units, parent_snapshot, cases=cases)))
        if len(batch) >= 256:
            startup.give_back_now_and_then()  # the units read and made before
            unit_refs.extend(batch)
            batch.clear()
            indexed.extend(index_batch)
            index_batch.clear()
        repetitions = repetitions or o.repetition > 0
        have += _unit_key(o.eval_id, o.repetition, o.metric_name)
        all_passed = all_passed and o.status in ("PASSED", "INFORMATIONAL")
        all_complete = all_complete and o.complete
        if not reused:  # this run's work: its spend, and the index points at it
            n_fresh += 1
            judge_calls += o.judge_calls
            reused_samples += o.reused_judge_samples
            judge_unreported += o.judge_unreported
            efficiency.merge_by_model(judge_by_model, o.judge_tokens)
        if not reused or origin is None:  # a recovered unit is indexed as this run's too
            index_batch.append(json.dumps(
                [o.unit_fingerprint, o.complete, o.unit_oid, o.run_id]).encode())
            indexed_packs.update(dict.fromkeys(o.packs))
        if not o.packs:
            loose_units[o.unit_oid] = None
    unit_refs.extend(batch)
    indexed.extend(index_batch)
    del batch, index_batch
    inf_refs, agent_unreported = Rows(InferenceRef), 0  # the record's, as rows
    for i in req.inference:
        startup.give_back_now_and_then()  # the inference records read and parsed before
        ref, unreported = inference_ref(store, i, req.run_id)
        inf_refs.extend((ref,))
        agent_unreported += unreported
    unscored = _unscored(snapshot, req.inference, req.units, (n_units, have),
                         req.uninferred_cases or [])
    complete = (not unscored and all_complete
                and all(i.status == "success" for i in req.inference))
    summary = RunSummary(
        complete=complete, unscored=unscored,
        passed=complete and all_passed,
        agent_calls=sum(r.model_calls for r in inf_refs), judge_calls=judge_calls,
        reused_units=n_units - n_fresh, scored_units=n_fresh,
        reused_judge_samples=reused_samples,
        **token_summary(inf_refs, agent_unreported, judge_by_model, judge_unreported,
                        judge_calls, req.prices))
    req.units.clear()
    frozen = {c.inference_oid for c in snapshot.cases}
    packs = unit_packs + (snapshot.packs if snapshot.packs and all(
        i.inference_oid in frozen for i in inf_refs) else _inference_packs(store, inf_refs))
    record = EvaluationRecord(
        run_id=req.run_id, kind=req.kind, eval_set_id=snapshot.eval_set_id,  # type: ignore[arg-type]
        app_name=snapshot.app_name, snapshot_oid=req.snapshot_oid, parent_record=parent_oid,
        source=req.source, reuse=req.reuse, force=req.force,
        inference=inf_refs, units=unit_refs,  # type: ignore[arg-type]
        skipped_cases=req.skipped_cases or [], uninferred_cases=req.uninferred_cases or [],
        summary=summary, created_at=now_iso(), coverage=req.coverage, baseline=req.baseline,
        packs=packs, fail_on=req.fail_on)
    if complete and repetitions:
        record = _gated(store, record)
    startup.give_back_freed()  # the units' rows read, before the ADK history copy reads
    if history_writer is not None:
        try:
            record = record.model_copy(update={"adk_history_path": history_writer(record)})
        except Exception as exc:  # noqa: BLE001 - the interop copy must not lose the run
            logger.warning("could not write the ADK history copy: %s", exc)
    with ctx.commits.committing():  # a signal waits for the commit to end (evalsnap.cli.signals)
        record_oid = repo.put(store, record)
        repo.index_units(store, (tuple(json.loads(row)) for row in indexed), record_oid,
                         req.run_id, packs=list(indexed_packs))
        repo.set_latest_record(store, snapshot.eval_set_id, record_oid, req.run_id)
        objects = [ManifestEntry(kind="record", oid=record_oid),
                   ManifestEntry(kind="snapshot", oid=req.snapshot_oid)]
        objects += [ManifestEntry(kind="inference", oid=i.inference_oid) for i in inf_refs]
        objects += [ManifestEntry(kind="unit", oid=u) for u in loose_units]
        objects += [ManifestEntry(kind=pack.KIND, oid=p) for p in packs]
        repo.write_manifest(store, RunManifest(
            run_id=req.run_id, eval_set_id=snapshot.eval_set_id, app_name=snapshot.app_name,
            kind=req.kind, record_oid=record_oid, snapshot_oid=req.snapshot_oid,  # type: ignore[arg-type]
            objects=objects, passed=summary.passed, complete=summary.complete,
            created_at=record.created_at, full=record.full))
        ctx.commits.mark_published(snapshot.eval_set_id, record_oid, req.run_id)
    return record_oid, record


def _gated(store: Store, record: EvaluationRecord) -> EvaluationRecord:
    """With repetitions, whether the run passed is its repetition gate's verdict per case ×
    metric (default: AgentEvaluator's mean over the repetitions), not every unit's: the
    stored flag is what ``history``, ``diff`` and the run events read."""
    from evalsnap.aggregates import aggregates, gate_passed

    units = repo.unit_verdicts(store, record)
    passed = gate_passed(aggregates(record, units))
    return record.model_copy(update={"summary": record.summary.model_copy(
        update={"passed": passed})})


def _own_packs(store: Store, units: Iterable[UnitOutcome], run_id: str) -> list[str]:
    """The packs the units name, in first-seen order; the packs this run's scoring tasks
    wrote (perhaps in a scoring process) are read now, a batch at a time, so that what
    publish, the report and the ADK history copy read of those units comes from a few packs,
    not object by object: each unit's verdict is kept (the summary's), and the members'
    bytes go to the read cache (as many as it holds), not the packs' own."""
    names: dict[str, None] = {}
    own: dict[str, None] = {}
    for o in units:  # one pass: each unit is read from its row
        names.update(dict.fromkeys(o.packs))
        if o.run_id == run_id:
            own.update(dict.fromkeys(o.packs))
    # the members kept in the read cache as far as it has room: past that (a large run) the
    # packs read one after another only pushed each other out, and what reads a unit later
    # opens its pack again
    for kind, oid, data in pack.members_of(store, list(own), spare=True):
        startup.give_back_now_and_then()  # the packs read before (~8 MB and its members each)
        if kind == "unit":
            repo.remember_verdict(store, oid, data)
        if kind not in PACKED_KINDS:  # a unit or entry is found in its pack (open_packs)
            store.written_elsewhere(kind, oid, data)
    return list(names)


def _inference_packs(store: Store, inf_refs: Iterable[InferenceRef]) -> list[str]:
    """Packs of the run's inference records (their bytes are in memory: read or written by
    this run), written unless identical ones are there: one at a time, each let go once
    written (a run of 10,000 cases held every pack at once, and a written pack's bytes in
    the read cache pushed out the records the next pack holds)."""
    members = (("inference", data) for ref in inf_refs
               if (data := store.remembered("inference", ref.inference_oid)) is not None)
    return pack.write_packs(store, members)
