"""Index segments: a batch's index entries in one ref, not one ref per key.

The unit and judge indexes (which complete unit answers a unit key, which ledger entry
answers a judge sample) were one small ref per key: 1,942 of a 210-case cold run's 4,904
requests on a bucket, which bills and waits per request. They are now written as
*segments*: one immutable ref per batch (a publish's new units, a scoring chunk's judge
answers), named by its content, under ``v1/refs/index/segments/``::

    {"schema": "evalsnap.index-segment/1", "run_id": ..., "record_oid": ... | null,
     "created_at": ..., "units": [[key hex, unit oid, complete, run id | null], ...],
     "judge": [[sample ref, entry oid], ...], "packs": [pack oid, ...]}

``packs`` (absent in segments of earlier versions) names the packs that may hold what the
segment indexes (:mod:`evalsnap.records.pack`: a scoring task's units and ledger entries
are written only as packs); a lookup tells the store (:meth:`storage.Store.locate`).

A run lists the segments once, when it first looks a key of a kind up, and reads that
kind's segments together (``units-…`` or ``judge-…``; a scoring task lists again when it
starts, for what was written since); a segment it writes itself is known to its lookups.
Lookups then cost no request. Which entry answers a key is what the per-key refs said: the
newest complete unit, an incomplete one only if no complete one is indexed (so an
incomplete unit never hides a complete one, and no entry has to be read before one is
written); the newest judge answer. Candidates come best first, so a unit gc
removed falls back to an older one.

Like every index, a segment is a hint: one that does not parse or has the wrong shape counts
as absent (logged; ``verify`` reports it) and costs recomputation, never a wrong result — the
reuse authority verifies every object a hint names. The per-key refs of stores written by
earlier versions (``v1/refs/index/unit|judge/<key>``) are still read, after the segments,
for the keys one listing shows there.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import json
import logging
import threading
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from evalsnap.errors import CorruptRecordError
from evalsnap.records._base import parse_stored
from storage import Store, TooLarge
from storage.ids import OID_PATTERN, short_key
from storage.keymap import KeyNumbers

__all__ = ["NAMESPACE", "SCHEMA", "judge_entry", "parse_segment", "refresh", "unit_entries",
           "write_segment"]

logger = logging.getLogger(__name__)

NAMESPACE = "index/segments"
SCHEMA = "evalsnap.index-segment/1"
#: Entries of one segment at most (a 30,000-case cold run writes several, each read whole).
SEGMENT_ENTRIES = 20_000
_MEMO = "index segments"
_ADVICE = ("it counts as absent (what it indexes is computed again); delete it, or let "
           "`evalsnap gc` remove it")


@dataclass(frozen=True)
class Segment:
    """A parsed segment."""

    run_id: str
    record_oid: str | None
    created_at: str
    units: list[tuple[str, str, bool, str]]
    """(key hex, unit oid, complete, run id) per unit."""
    judge: list[tuple[str, str]]
    """(sample ref, ledger entry oid) per judge answer."""
    packs: tuple[str, ...] = ()
    """The packs that may hold what it indexes."""

    def oids(self) -> set[str]:
        """Every object id it names (what gc keeps it for)."""
        named = {oid for _, oid, _, _ in self.units} | {oid for _, oid in self.judge}
        return named | set(self.packs) | ({self.record_oid} if self.record_oid else set())


def _is_hex(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(
        c in "0123456789abcdef" for c in value)


def _is_oid(value: Any) -> bool:
    return isinstance(value, str) and bool(OID_PATTERN.match(value))


def parse_segment(data: bytes, *, where: str) -> Segment:
    """The segment ``data``; ``CorruptRecordError`` if it is not one, exactly as written."""
    raw = parse_stored(data, what=f"index segment {where}", advice=_ADVICE)

    def bad(why: str) -> CorruptRecordError:
        return CorruptRecordError(f"index segment {where} is not an {SCHEMA} segment ({why}); "
                                  f"{_ADVICE}.")

    if not isinstance(raw, dict) or raw.get("schema") != SCHEMA:
        raise bad("no such schema")
    run_id, record_oid, created = raw.get("run_id"), raw.get("record_oid"), raw.get("created_at")
    if not isinstance(run_id, str) or not isinstance(created, str) \
            or not (record_oid is None or _is_oid(record_oid)):
        raise bad("run_id, record_oid or created_at")
    units_raw, judge_raw = raw.get("units", []), raw.get("judge", [])
    if not isinstance(units_raw, list) or not isinstance(judge_raw, list):
        raise bad("units and judge must be lists")
    units: list[tuple[str, str, bool, str]] = []
    for item in units_raw:
        if not (isinstance(item, list) and len(item) == 4 and _is_hex(item[0])
                and _is_oid(item[1]) and isinstance(item[2], bool)
                and (item[3] is None or isinstance(item[3], str))):
            raise bad(f"unit entry {str(item)[:80]}")
        units.append((item[0], item[1], item[2], item[3] or run_id))
    judge: list[tuple[str, str]] = []
    for item in judge_raw:
        if not (isinstance(item, list) and len(item) == 2 and _is_hex(item[0])
                and _is_oid(item[1])):
            raise bad(f"judge entry {str(item)[:80]}")
        judge.append((item[0], item[1]))
    packs = raw.get("packs", [])
    if not isinstance(packs, list) or not all(_is_oid(p) for p in packs):
        raise bad("packs must be a list of object ids")
    return Segment(run_id, record_oid, created, units, judge, tuple(packs))


def _encode(run_id: str, record_oid: str | None, created_at: str,
            units: list[list[Any]], judge: list[list[str]], packs: list[str]) -> bytes:
    body: dict[str, Any] = {"schema": SCHEMA, "run_id": run_id, "record_oid": record_oid,
                            "created_at": created_at}
    if units:
        body["units"] = units
    if judge:
        body["judge"] = judge
    if packs:
        body["packs"] = packs
    return json.dumps(body, separators=(",", ":"), allow_nan=False).encode()


#: Segments written at once (one concurrent batch on a bucket): what is held at a time.
_WRITE_BATCH = 4
#: Bytes of the segments an instance wrote that it keeps for a lookup of their kind in the
#: same run (past this it reads them back, if one comes: after a publish none does).
_PENDING_BYTES = 8 << 20


def write_segment(store: Store, *, run_id: str, record_oid: str | None = None,
                  units: Iterable[tuple[str, str, bool, str]] = (),
                  judge: Iterable[tuple[str, str]] = (),
                  packs: Sequence[str] = ()) -> list[str]:
    """Writes the entries as segments (concurrent batches on a bucket; a segment of units
    and one of judge answers, more only past :data:`SEGMENT_ENTRIES` each, made and written
    a few at a time as ``units`` come), known to this store's later lookups. ``units``:
    (key hex, unit oid, complete, run id); ``judge``: (sample ref, entry oid); ``packs``:
    the packs that may hold what they name. Returns the segments' names."""
    pack_list = list(dict.fromkeys(packs))
    created = dt.datetime.now(dt.UTC).isoformat(timespec="microseconds")
    unit_rows: Iterator[list[Any]] = ([key, oid, complete, None if run == run_id else run]
                                      for key, oid, complete, run in units)
    judge_rows: Iterator[list[Any]] = ([name, oid] for name, oid in judge)
    names: list[str] = []
    pages: dict[str, bytes] = {}
    for rows, is_units in ((unit_rows, True), (judge_rows, False)):
        while chunk := list(itertools.islice(rows, SEGMENT_ENTRIES)):
            data = _encode(run_id, record_oid, created, chunk if is_units else [],
                           [] if is_units else chunk, pack_list)
            del chunk
            pages[f"{UNITS if is_units else JUDGE}-{hashlib.sha256(data).hexdigest()}"] = data
            if len(pages) >= _WRITE_BATCH:
                names += _write_pages(store, pages)
                pages = {}
    if pages:
        names += _write_pages(store, pages)
    return names


def _write_pages(store: Store, pages: dict[str, bytes]) -> list[str]:
    store.put_refs(NAMESPACE, pages)
    catalog = _catalog(store)
    for name, data in pages.items():
        with catalog.lock:
            loaded = _prefix(name) in catalog.loaded
            # parsed if a lookup of its kind comes (after a publish, none does); past a few
            # MB read back from the store instead
            if not loaded and sum(map(len, catalog.pending.values())) + len(data) \
                    <= _PENDING_BYTES:
                catalog.pending[name] = data
        if loaded:
            catalog.add(name, parse_segment(data, where=f"{NAMESPACE}/{name}"))
    return list(pages)


# ---- lookups ---------------------------------------------------------------------------------

#: Name prefixes of the segments of units and of judge answers: a lookup reads only its kind's.
UNITS, JUDGE = "units", "judge"


def _prefix(name: str) -> str:
    return name.split("-", 1)[0]


def _order(segment: Segment, name: str) -> tuple[str, str]:
    return (segment.created_at, name)


class _JudgeIndex:
    """The judge index a store instance has read: each sample ref's ledger entry (its oid)
    and the packs of the newest segment naming it, ~100 bytes an entry (the ref's 16-byte
    key, the oid's 32-byte digest, the segment's number) where a dict of tuples took ~360
    (69,300 entries at 10,000 cases, in the flow's process and in every scoring process).
    Its oids are ``sha256:`` ids, as :func:`parse_segment` lets through."""

    __slots__ = ("_at", "_digests", "_segment_of", "_segments")

    def __init__(self) -> None:
        self._at = KeyNumbers()  # the ref's short key → its row
        self._digests = bytearray()  # a row's oid digest, 32 bytes a row
        self._segment_of = array("I")  # a row's segment: its number in _segments
        self._segments: list[tuple[tuple[str, str], tuple[str, ...]]] = []  # (order, packs)

    def segment(self, order: tuple[str, str], packs: tuple[str, ...]) -> int:
        """The number of a segment's entries (one per segment added)."""
        self._segments.append((order, packs))
        return len(self._segments) - 1

    def put(self, ref: str, oid: str, segment: int) -> None:
        """``ref`` names ``oid`` in ``segment``: kept unless a newer segment names it."""
        digest = bytes.fromhex(oid.removeprefix("sha256:"))
        if len(digest) != 32:
            raise ValueError(f"not a sha256 object id: {oid[:80]}")
        key = short_key(ref)
        row = self._at.get_key(key)
        if row is None:
            self._at.put_key(key, len(self._segment_of))
            self._digests += digest
            self._segment_of.append(segment)
        elif self._segments[self._segment_of[row]][0] < self._segments[segment][0]:
            self._digests[row * 32:row * 32 + 32] = digest
            self._segment_of[row] = segment

    def get(self, ref: str) -> tuple[str, tuple[str, ...]] | None:
        """The oid ``ref`` names and the packs of the segment naming it, or None."""
        row = self._at.get_key(short_key(ref))
        if row is None:
            return None
        return ("sha256:" + self._digests[row * 32:row * 32 + 32].hex(),
                self._segments[self._segment_of[row]][1])

    def __len__(self) -> int:
        return len(self._at)


@dataclass
class _Catalog:
    """What this store instance knows of the segments (in its per-run memo)."""

    loaded: set[str] = field(default_factory=set)
    """The prefixes whose segments were listed and read (:data:`UNITS`, :data:`JUDGE`)."""
    seen: set[str] = field(default_factory=set)
    units: dict[str, list[tuple[tuple[str, str], bool, dict[str, Any]]]] = \
        field(default_factory=dict)
    judge: _JudgeIndex = field(default_factory=_JudgeIndex)
    legacy: dict[str, set[str]] | None = None
    pending: dict[str, bytes] = field(default_factory=dict)
    """Segments this instance wrote before it read their kind's (name → bytes)."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, name: str, segment: Segment) -> None:
        with self.lock:
            if name in self.seen:
                return
            self.seen.add(name)
            order = _order(segment, name)
            for key, oid, complete, run in segment.units:
                # the record that indexed it: a unit recovered from a killed run (its own
                # run published nothing) is named by the record that recovered it
                entry = {"unit_oid": oid, "run_id": run, "complete": complete,
                         "record_oid": segment.record_oid, "packs": segment.packs}
                found = self.units.setdefault(key, [])
                found.append((order, complete, entry))
                # complete before incomplete, then newest first
                found.sort(key=lambda c: (c[1], c[0]), reverse=True)
                del found[4:]
            if segment.judge:
                number = self.judge.segment(order, tuple(segment.packs))
                for ref, oid in segment.judge:
                    self.judge.put(ref, oid, number)


def _catalog(store: Store) -> _Catalog:
    found = store.run_memo.get(_MEMO)
    if not isinstance(found, _Catalog):
        found = store.run_memo.setdefault(_MEMO, _Catalog())
    return found  # type: ignore[no-any-return]


def refresh(store: Store, *, only_if_listed: bool = False,
            prefixes: tuple[str, ...] = (UNITS, JUDGE)) -> None:
    """Lists the segments and reads those of ``prefixes`` this store instance has not seen
    (one listing, then one concurrent batch of reads). ``only_if_listed``: only the kinds
    it read before in this run (a scoring task refreshes what an earlier lookup loaded)."""
    catalog = _catalog(store)
    with catalog.lock:
        kinds = {p for p in prefixes if not only_if_listed or p in catalog.loaded}
    if not kinds:
        return
    names = [n for n in store.list_refs(NAMESPACE)
             if _prefix(n) in kinds and n not in catalog.seen]
    with catalog.lock:
        pending = {n: d for n, d in catalog.pending.items() if _prefix(n) in kinds}
    got: dict[str, bytes | None | TooLarge] = dict(pending)
    got.update(store.get_refs(NAMESPACE, [n for n in names if n not in pending]))
    with catalog.lock:  # from now on this instance's new segments of these kinds are added
        catalog.loaded |= kinds
        got.update({n: catalog.pending.pop(n) for n in list(catalog.pending)
                    if _prefix(n) in kinds})
    for name, data in got.items():
        if data is None:
            continue  # removed since the listing
        try:
            if isinstance(data, TooLarge):
                raise data
            catalog.add(name, parse_segment(data, where=f"{NAMESPACE}/{name}"))
        except (CorruptRecordError, TooLarge) as exc:
            logger.warning("%s", exc)
            with catalog.lock:
                catalog.seen.add(name)


def _loaded(store: Store, prefix: str) -> _Catalog:
    catalog = _catalog(store)
    if prefix not in catalog.loaded:
        with _LOAD_LOCK:
            if prefix not in catalog.loaded:
                refresh(store, prefixes=(prefix,))
    return catalog


_LOAD_LOCK = threading.Lock()


def _legacy(store: Store, namespace: str, name: str) -> bytes | None | TooLarge:
    """The per-key ref ``namespace/name`` an earlier evalsnap wrote, if one listing (taken
    once per run) shows it; else None without a request."""
    catalog = _catalog(store)
    with _LOAD_LOCK:
        if catalog.legacy is None:
            catalog.legacy = {}
        if namespace not in catalog.legacy:
            catalog.legacy[namespace] = set(store.list_refs(namespace))
    if name not in catalog.legacy[namespace]:
        return None
    try:
        return store.get_ref(namespace, name)
    except TooLarge as exc:
        return exc


def unit_entries(store: Store, key_hex: str) -> list[dict[str, Any]]:
    """The unit index's candidates for ``key_hex``, best first (see the module's rules):
    each ``{"unit_oid", "run_id", "record_oid", "complete"}``."""
    catalog = _loaded(store, UNITS)
    with catalog.lock:
        found = [dict(entry) for _, _, entry in catalog.units.get(key_hex, [])]
    for candidate in found:
        store.locate([candidate["unit_oid"]], candidate.pop("packs"))
    if found and found[0]["complete"]:
        return found
    from evalsnap.records import repo

    entry = repo._usable_entry("index/unit", key_hex, _legacy(store, "index/unit", key_hex))
    if entry is None:
        return found
    return [entry, *found] if entry.get("complete") else [*found, entry]


def judge_entry(store: Store, ref: str) -> str | None:
    """The ledger entry oid the judge index names for sample ``ref``, if any."""
    catalog = _loaded(store, JUDGE)
    with catalog.lock:
        found = catalog.judge.get(ref)
    if found is not None:
        store.locate([found[0]], found[1])
        return found[0]
    from evalsnap.records import repo

    entry = repo._usable_entry("index/judge", ref, _legacy(store, "index/judge", ref))
    return str(entry["oid"]) if entry else None
