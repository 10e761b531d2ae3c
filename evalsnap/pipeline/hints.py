"""What the previous run of an eval set lets this one prove with a handful of requests.

The reuse authority (:mod:`evalsnap.pipeline.reuse`) decides from an index entry and the
object it names. Read one by one, that is two GETs per unit and per inference: 12,392
requests for a no-op rerun of 210 cases on S3. The previous record of the eval set says
which entries and objects a rerun will most likely ask for, so :func:`prime` proves them in
bulk, with the same result the one-by-one reads would give:

* the record's packs (:mod:`evalsnap.records.pack`) hold the bytes of its units, inference
  records and judge entries, each checked against its id when the pack is read: a unit or
  entry a pack holds is in the store, whole (its pack is its only copy);
* one listing per object kind proves the loose objects are in the store, whole (inference
  records, and units of stores written by earlier versions: a bucket lists each object's
  MD5; elsewhere each is read and re-hashed);
* for inferences, one listing of the inference index proves each entry holds exactly the
  bytes the record implies (same MD5), so the entry says what a read would say; a unit the
  record names for its key needs no index entry (the record is what the index points at).

What is proved becomes a *hint*: fingerprint → (oid, the entry). A fingerprint without a
hint is decided the usual way (the index, then the object); a hint never says more than the
store does. Hints live in the store's per-run memo.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from evalsnap.errors import EvalsnapError
from evalsnap.records import EvaluationRecord, ScoreUnit, repo
from storage import Store

__all__ = ["Hints", "hints_of", "prime"]

logger = logging.getLogger(__name__)

_MEMO = "reuse.hints"
#: Packs :func:`prime` reads at once (each up to 8 MiB; on a bucket, concurrently).
PACKS_AT_ONCE = 8


@dataclass
class Hints:
    """Index entries proved in this run: fingerprint → (oid the entry names, the entry)."""

    units: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    """Complete and incomplete ones (an incomplete unit is scored again: its proved entry
    spares the read that says so)."""
    inferences: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    committed_inferences: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    """fingerprint → an inference the previous (committed) record names, proved intact in the
    store, with the index entry that would name it: what the index is rebuilt from when its
    entry names an object no committed run does (a killed run's, removed by gc)."""
    primed: set[str] = field(default_factory=set)


def hints_of(store: Store) -> Hints:
    hints = store.run_memo.get(_MEMO)
    if not isinstance(hints, Hints):
        hints = store.run_memo[_MEMO] = Hints()
    return hints


def prime(store: Store, eval_set_id: str) -> Hints:
    """Proves what the latest record of ``eval_set_id`` implies, once per run and eval set."""
    hints = hints_of(store)
    if eval_set_id in hints.primed:
        return hints
    hints.primed.add(eval_set_id)
    record_oid = repo.latest_record_for(store, eval_set_id)
    if record_oid is None:
        return hints
    try:
        record = repo.get(store, EvaluationRecord, record_oid)
    except EvalsnapError as exc:
        logger.warning("previous record %s unreadable (%s); reuse reads one by one",
                       record_oid, exc)
        return hints
    proved = _proved_members(store, record)
    # a unit no readable pack holds (a damaged pack, a record older than packs): the record
    # still names it, so it is read (one concurrent batch) rather than looked up key by key
    unpacked = [u.unit_oid for u in record.units if u.unit_oid not in proved["unit"]]
    if unpacked:
        proved["unit"] |= {oid for oid, got in store.get_objects("unit", unpacked).items()
                           if isinstance(got, bytes)}
    _prove_units(store, record_oid, record, proved["unit"], hints)
    _prove_inferences(store, record, proved["inference"], hints)
    return hints


def _proved_members(store: Store, record: EvaluationRecord) -> dict[str, set[str]]:
    """The units and inference records the record's packs hold that the store holds intact
    (the store then knows which pack holds each: :meth:`storage.Store.packs_holding`). The
    packs are opened :data:`PACKS_AT_ONCE` at a time and let go of once their members are
    proved: opened all at once, a no-op rerun of 30,030 cases held every pack's members
    (~2 GB of units, judge entries and inference records) and peaked at 3,079 MiB. A pack
    that cannot be used is skipped (logged by the store: its objects are looked for one by
    one, a loose copy or none: recomputed). Judge entries need no proof here: a judge
    sample is looked up when it is asked again, from the pack the store knows holds it."""
    proved: dict[str, set[str]] = {"unit": set(), "inference": set()}
    packs = list(dict.fromkeys(record.packs))
    for start in range(0, len(packs), PACKS_AT_ONCE):
        opened = store.open_packs(packs[start:start + PACKS_AT_ONCE])
        for found in opened.values():
            if isinstance(found, Exception):
                continue
            for kind, got in proved.items():
                got |= store.prove_objects(kind, {oid: data for (k, oid), data in found.items()
                                                  if k == kind})
        del opened  # before the next batch is read, not after
    return proved


def _prove_units(store: Store, record_oid: str, record: EvaluationRecord, proved: set[str],
                 hints: Hints) -> None:
    """Each unit of the record the store holds intact is a hint: the record names it for
    its key, as the unit index would (a reused unit only if complete: an incomplete one is
    never reused, so the record's copy says nothing of it)."""
    for ref in record.units:
        if ref.unit_oid not in proved:
            continue
        try:
            unit = repo.get(store, ScoreUnit, ref.unit_oid)  # the read cache, else its pack
        except EvalsnapError:
            continue
        if unit.unit_fingerprint != ref.unit_fingerprint or (ref.reused and not unit.complete):
            continue
        # a unit the record recovered from a killed run (reused, from no published record)
        # is named by this record, as its index entry names it
        recovered = ref.reused and ref.reused_from_record is None
        entry = {"unit_oid": ref.unit_oid,
                 "run_id": (ref.reused_from_run or unit.run_id) if ref.reused else record.run_id,
                 "record_oid": record_oid if recovered or not ref.reused
                 else ref.reused_from_record,
                 "complete": unit.complete}
        hints.units[ref.unit_fingerprint] = (ref.unit_oid, entry)


def _prove_inferences(store: Store, record: EvaluationRecord, proved: set[str],
                      hints: Hints) -> None:
    expected: dict[str, tuple[str, str, dict[str, Any]]] = {}
    for ref in record.inference:
        if ref.inference_oid not in proved or ref.status != "success":
            continue
        try:
            inference = repo.get_inference(store, ref.inference_oid)
        except EvalsnapError:
            continue
        if not inference.ok or inference.inference_fingerprint != ref.inference_fingerprint:
            continue
        entry = {"oid": ref.inference_oid, "run_id": inference.run_id}
        expected[repo.hexof(ref.inference_fingerprint)] = (
            ref.inference_fingerprint, ref.inference_oid, entry)
    proved_names = _proved_entries(store, "index/inference", expected)
    for name, (fp, oid, entry) in expected.items():
        hints.committed_inferences[fp] = (oid, entry)
        if name in proved_names:
            hints.inferences[fp] = (oid, entry)


def _proved_entries(store: Store, namespace: str,
                    expected: dict[str, tuple[str, str, dict[str, Any]]]) -> set[str]:
    if not expected:
        return set()
    contents = {name: repo.index_entry_bytes(namespace, entry)
                for name, (_, _, entry) in expected.items()}
    return store.prove_refs(namespace, contents)
