"""The judge ledger in the store: entries in, the reuse index, answers out.

* ``v1/objects/judge/…``                  one LedgerEntry per judge sample attempt
* judge index (:mod:`evalsnap.records.segments`): sha256(request key # sample index) → the
  entry that answered it (only successful, parsed ones), a segment per batch of entries
"""

from __future__ import annotations

import logging

from evalsnap.agents.base import now_iso
from evalsnap.errors import EvalsnapError
from evalsnap.pipeline.judge import JudgeRecorder, LedgerAnswer, LedgerSource, sample_ref
from evalsnap.records import FrozenCase, LedgerEntry, MetricRule, repo, segments
from storage import Store

logger = logging.getLogger(__name__)


def entries_for(recorder: JudgeRecorder, rule: MetricRule, frozen: FrozenCase,
                run_id: str) -> list[LedgerEntry]:
    """One entry per recorded call, in call order."""
    created = now_iso()
    out = []
    for call in recorder.calls:
        view = call.request
        out.append(LedgerEntry(
            metric_name=rule.metric_name, eval_id=frozen.eval_id, repetition=frozen.repetition,
            invocation_index=call.invocation_index, role=call.role,
            sample_index=call.sample_index, attempt=call.attempt, request_key=call.request_key,
            judge_model={"model": view.get("model"), "class": call.judge_class},
            generation_config=view.get("config"), request={"contents": view.get("contents")},
            raw_response=call.raw_response, error=call.error, parsed=call.parsed,
            parse_ok=call.parse_ok, usage_metadata=call.usage_metadata,
            model_version=call.model_version, evaluator=recorder.adapter.evaluator_path,
            aggregation_version=recorder.adapter.aggregation_version,
            source="model" if call.live else "ledger",
            reused_from=None if call.live else call.reused_from,
            run_id=run_id, created_at=created))
    return out


def write_entries(store: Store | repo.WriteBatch, entries: list[LedgerEntry]) -> list[str]:
    """Stores the entries and points the judge index at each successful, parsed answer
    (into a :class:`repo.WriteBatch` if given one: written when it is flushed; else one
    index segment now)."""
    oids, indexed = [], []
    for entry in entries:
        oid = store.put(entry) if isinstance(store, repo.WriteBatch) else repo.put(store, entry)
        oids.append(oid)
        # An answer from the ledger is indexed already (by the entry it came from).
        if not entry.failed and entry.source == "model":
            indexed.append((sample_ref(entry.request_key, entry.sample_index), oid))
    if isinstance(store, repo.WriteBatch):
        for name, oid in indexed:
            store.index_judge(name, oid)
    elif indexed:
        segments.write_segment(store, run_id=entries[0].run_id, judge=indexed)
    return oids


def load_entry(store: Store, oid: str) -> LedgerEntry | None:
    try:
        return repo.get(store, LedgerEntry, oid)
    except EvalsnapError as exc:  # damaged, missing or not an entry: absent
        logger.warning("judge ledger entry %s unusable (%s)", oid, exc)
        return None


def _answer(oid: str, entry: LedgerEntry) -> LedgerAnswer:
    return LedgerAnswer(oid=entry.reused_from or oid, raw_response=entry.raw_response,
                        error=entry.error, judge_class=str(entry.judge_model.get("class", "")))


def reuse_source(store: Store) -> LedgerSource:
    """``--reuse``: any earlier successful answer to the same (request key, sample index)."""

    def lookup(key: str, sample: int) -> LedgerAnswer | None:
        oid = segments.judge_entry(store, sample_ref(key, sample))
        if oid is None:
            return None
        entry = load_entry(store, oid)
        if entry is None or entry.failed or entry.request_key != key \
                or entry.sample_index != sample:
            return None
        return _answer(oid, entry)

    return LedgerSource(lookup=lookup)


def replay_source(store: Store, ledger: list[str]) -> tuple[LedgerSource, list[LedgerEntry]]:
    """Replay: only this unit's entries, the last attempt of each sample; nothing else."""
    last: dict[tuple[str, int], tuple[str, LedgerEntry]] = {}
    entries = []
    for oid in ledger:
        entry = repo.get(store, LedgerEntry, oid)
        entries.append(entry)
        key = (entry.request_key, entry.sample_index)
        if key not in last or entry.attempt >= last[key][1].attempt:
            last[key] = (oid, entry)
    answers = {key: LedgerAnswer(oid=oid, raw_response=e.raw_response, error=e.error,
                                 judge_class=str(e.judge_model.get("class", "")))
               for key, (oid, e) in last.items()}

    def lookup(key: str, sample: int) -> LedgerAnswer | None:
        return answers.get((key, sample))

    return LedgerSource(lookup=lookup, strict=True), entries
