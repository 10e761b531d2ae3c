"""What a store holds for gc, and what each file names (see :mod:`evalsnap.records.gc`).

Stored bytes are parsed as data (:func:`evalsnap.records._base.parse_stored`), never as code,
and by field, not by type: a record of a newer schema, or one that does not validate, is
followed through every object id it holds, so that gc keeps too much rather than too little.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from evalsnap.errors import CorruptRecordError, EvalsnapError, NotFoundError
from evalsnap.records import RunManifest, outcomes, repo, segments
from evalsnap.records._base import parse_stored
from evalsnap.records.repo import UNREADABLE_MANIFEST
from storage import InvalidId, ObjectNotFound, Store
from storage.gc import StoredFile
from storage.ids import OBJECT_KINDS, OID_PATTERN

OID = re.compile(OID_PATTERN.pattern.strip("^$"))
#: The folders of ``v1/refs/`` that gc never removes a file from, and their kinds:
#: pins, acceptances and tombstones (:mod:`evalsnap.records.marks`).
MARKS = {"pins": "pin", "accepted": "accepted", "tombstones": "tombstone"}
#: The index namespaces: per-key entries (:data:`repo.INDEXES`) and segments.
INDEX_KINDS = (*repo.INDEXES, segments.NAMESPACE)

@dataclass
class Listing:
    """The store's files by what they are."""

    objects: dict[str, StoredFile] = field(default_factory=dict)  # "kind oid" → file
    kinds_of: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    runs: dict[str, StoredFile] = field(default_factory=dict)
    refs: list[tuple[str, str, StoredFile]] = field(default_factory=list)  # (kind, name, file)
    temporary: list[StoredFile] = field(default_factory=list)


def classify(files: Iterable[StoredFile]) -> Listing:
    out = Listing()
    for f in files:
        parts = f.rel.split("/")
        if len(parts) < 3 or parts[1] not in ("objects", "refs", "prefect", "reports"):
            continue  # v1/STORE, or nothing of ours
        if parts[-1].startswith("."):
            out.temporary.append(f)
        elif parts[1] == "objects":
            if len(parts) == 5 and parts[2] in OBJECT_KINDS \
                    and OID.fullmatch(f"sha256:{parts[3]}{parts[4]}"):
                oid = f"sha256:{parts[3]}{parts[4]}"
                out.objects[f"{parts[2]} {oid}"] = f
                out.kinds_of[oid].append(parts[2])
            else:
                out.temporary.append(f)  # what verify calls a stray file
        elif parts[1] == "prefect" and len(parts) == 3:
            out.refs.append(("prefect result", parts[2], f))
        elif parts[1] == "reports" and len(parts) == 3:
            out.refs.append(("report", parts[2], f))
        elif parts[1] == "refs" and parts[2] == "runs" and len(parts) == 4:
            out.runs[parts[3]] = f
        elif parts[1] == "refs" and parts[2] == "index" and len(parts) == 5 \
                and f"index/{parts[3]}" in INDEX_KINDS:
            out.refs.append((f"index/{parts[3]}", parts[4], f))
        elif parts[1] == "refs" and parts[2] == "reports" and len(parts) == 4:
            out.refs.append(("report", parts[3], f))
        elif parts[1] == "refs" and parts[2] == "adk_history" and len(parts) == 5:
            out.refs.append(("adk history", parts[4], f))
        elif parts[1] == "refs" and parts[2] in MARKS and len(parts) >= 4:
            out.refs.append((MARKS[parts[2]], "/".join(parts[3:]), f))
    return out


def oids_in(value: Any) -> set[str]:
    """Every object id anywhere in parsed JSON (for what cannot be read as its type)."""
    if isinstance(value, str):
        return {value} if OID.fullmatch(value) else set()
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else []
    return set().union(*(oids_in(v) for v in items)) if items else set()


def _outcome_ids(items: list[Any]) -> set[str]:
    """What a task's outcomes name: an inference's record, a unit's object."""
    return {o for i in items if isinstance(i, dict) for k in ("oid", "unit_oid")
            if isinstance(o := i.get(k), str)}


def _links(kind: str, raw: Any) -> tuple[set[str], str | None]:
    """What an object of ``kind`` names (its ids) and, for a record, its ADK history copy.
    A shape this evalsnap does not write is followed everywhere (keeping too much is safe)."""
    def get(d: Any, key: str) -> Any:
        return d.get(key) if isinstance(d, dict) else None

    if kind == outcomes.KIND and isinstance(raw, list):  # a cached scoring result's rows
        return _outcome_ids(raw), None
    if not isinstance(raw, dict) or raw.get("schema_version") != 1:
        return oids_in(raw), None
    if kind == "record":
        named = {get(i, "inference_oid") for i in raw.get("inference") or []}
        named |= {get(u, "unit_oid") for u in raw.get("units") or []}
        named.add(raw.get("snapshot_oid"))
        packs = raw.get("packs")  # copies of what it names, for fast reads
        named |= {p for p in packs if isinstance(p, str)} if isinstance(packs, list) else set()
        path = raw.get("adk_history_path")
        return {o for o in named if isinstance(o, str)}, path if isinstance(path, str) else None
    if kind == "snapshot":
        packs = raw.get("packs")  # copies of its inference records
        return {o for c in raw.get("cases") or [] if isinstance(o := get(c, "inference_oid"), str)
                } | ({p for p in packs if isinstance(p, str)} if isinstance(packs, list)
                     else set()), None
    if kind == "unit":
        return {o for o in raw.get("ledger") or [] if isinstance(o, str)}, None
    if kind == "judge":
        src = raw.get("reused_from")
        return ({src} if isinstance(src, str) else set()), None
    return set(), None


class Marker:
    """The marked set, grown breadth-first from roots, reading objects concurrently."""

    def __init__(self, store: Store, listing: Listing, pool: ThreadPoolExecutor) -> None:
        self.store, self.listing, self.pool = store, listing, pool
        self.marked: set[str] = set()
        self.history: set[str] = set()
        self.damaged: list[str] = []

    def _read(self, kind: str, oid: str) -> set[str]:
        if kind in ("inference", "pack"):
            return set()  # names nothing (a pack holds copies of objects named elsewhere)
        try:
            raw = parse_stored(self.store.get_object(kind, oid), what=f"{kind} {oid}")
        except ObjectNotFound:
            return set()
        except EvalsnapError as exc:
            self.damaged.append(f"{kind} {oid}: {exc}")
            return set()
        named, history = _links(kind, raw)
        if history:
            self.history.add(history.rstrip("/").rsplit("/", 1)[-1])
        return named

    def mark(self, roots: Iterable[str]) -> None:
        frontier = {o for o in roots if isinstance(o, str) and OID.fullmatch(o)} - self.marked
        while frontier:
            self.marked |= frontier
            jobs = [(k, o) for o in frontier for k in self.listing.kinds_of.get(o, [])]
            found: set[str] = set().union(*self.pool.map(lambda j: self._read(*j), jobs)) \
                if jobs else set()
            frontier = {o for o in found if OID.fullmatch(o)} - self.marked


def ref_target(kind: str, data: bytes | None, where: str) -> set[str] | None:
    """The ids an index entry or Prefect result names; None if it is damaged or not ours."""
    if kind not in INDEX_KINDS and kind != "prefect result":
        return set()
    if data is None:
        return set()  # gone since the listing
    try:
        if kind == segments.NAMESPACE:
            return segments.parse_segment(data, where=where).oids() or None
        if kind == "prefect result":
            record = parse_stored(data, what=where)
            result = record.get("result") if isinstance(record, dict) else None
            meta = record.get("metadata") if isinstance(record, dict) else None
            serializer = meta.get("serializer") if isinstance(meta, dict) else None
            if not isinstance(result, str) or not isinstance(serializer, dict) \
                    or serializer.get("type") != "evalsnap-ids":
                return None
            items = parse_stored(result.encode(), what=where)
            if isinstance(items, dict):  # a scoring result: its outcomes object, which names
                oid = items.get(outcomes.KIND)  # the units (followed as it is marked)
                return {oid} if isinstance(oid, str) and OID.fullmatch(oid) else None
            return (_outcome_ids(items) if isinstance(items, list) else set()) or None
        entry = repo.parse_index_entry(kind, data, where=where)
    except CorruptRecordError:
        return None
    return {str(entry.get("unit_oid") or entry.get("oid") or entry.get("record_oid"))}


def read_ref(store: Store, kind: str, name: str) -> bytes | None:
    """The bytes of an index entry or Prefect result (b"" for what gc need not read; None
    if it is gone; b"\\0" — damaged — if its name is not one evalsnap writes)."""
    try:
        if kind == "prefect result":
            return store.get_task_result(name)
        return store.get_ref(kind, name) if kind in INDEX_KINDS else b""
    except InvalidId:
        return b"\0"


def read_run(store: Store, name: str) -> RunManifest | set[str] | bool | None:
    """The manifest; else the ids its bytes name (unreadable, kept); False if they do not
    even parse; None if it is gone."""
    try:
        return repo.read_manifest(store, name)
    except NotFoundError:
        return None
    except UNREADABLE_MANIFEST:
        data = store.get_ref("runs", name)
        if data is None:
            return None
        try:
            return oids_in(parse_stored(data, what=f"runs/{name}"))
        except CorruptRecordError:
            return False
