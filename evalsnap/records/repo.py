"""Typed access to the store: records in, records out, indexes, manifests.

Layout (under the store URL, see README "Store layout"):

* ``v1/objects/<kind>/…``            content-addressed, write-once records
* ``v1/refs/runs/<run_id>``           run manifests (written last)
* ``v1/refs/index/inference/<hex>``   inference fingerprint → latest successful record
* ``v1/refs/index/segments/<name>``   unit fingerprint → latest complete unit, judge request
                                      key # sample → the ledger entry answering it: one
                                      segment per batch (:mod:`evalsnap.records.segments`;
                                      ``index/unit|judge/<hex>``, one ref per key, are what
                                      earlier versions wrote, still read)
* ``v1/refs/index/evalset/<id>``      eval set → latest record (parent of the next)
* ``v1/refs/accepted|pins|tombstones/…``  marks of runs (:mod:`evalsnap.records.marks`)

Every read goes through one parse (:func:`evalsnap.records._base.parse_stored`), so stored
bytes that are wrong in any way are a typed error, never a crash. Indexes are only hints:
an entry that does not parse, or is not the shape its index has (:data:`INDEXES`), counts
as absent (logged), so one bad entry costs a recomputation, never a run. A manifest that
cannot be read is skipped by ``latest`` and ``ls`` and reported by ``verify``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from evalsnap import settings
from evalsnap.errors import (
    CorruptRecordError,
    EvalsnapError,
    NotFoundError,
    UnsupportedSchemaVersion,
)
from evalsnap.records import (
    EvaluationRecord,
    InferenceRecord,
    LedgerEntry,
    RunManifest,
    ScoreUnit,
    Snapshot,
    StoredModel,
    UnitVerdict,
    pack,
    segments,
)
from evalsnap.records._base import first_problem, parse_stored
from evalsnap.rows import Spool
from storage import CorruptObjectError, ObjectNotFound, Store, TooLarge, oid_of
from storage.ids import OID_PATTERN, PACKED_KINDS, short_key
from storage.keymap import KeyNumbers

logger = logging.getLogger(__name__)
M = TypeVar("M", bound=StoredModel)
_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,100}$")
#: A manifest that cannot be used as one: damaged, newer, or deleted since it was listed.
UNREADABLE_MANIFEST = (CorruptRecordError, CorruptObjectError, UnsupportedSchemaVersion,
                       NotFoundError)


def open_store(url: str, storage_options: dict[str, str] | None = None, *,
               timeout: float | None = None) -> Store:
    """A new Store for ``url`` (a run's comes from its run context,
    :class:`evalsnap.pipeline.context.RunContext`); options, else the backend's env chains."""
    # fsyncs are batched: each task flushes what it wrote, and the run manifest (a commit)
    # flushes before it is written; see Store.flush
    return Store(url, storage_options=storage_options or None, durability="batch",
                 timeout=settings.get().store_timeout if timeout is None else timeout)


def hexof(fp: str) -> str:
    return fp.split(":", 1)[-1]


def ref_name(value: str) -> str:
    """A key-safe name for an arbitrary id (eval set ids come from user files)."""
    if _SAFE.match(value) and ".." not in value:
        return value
    return "h-" + hashlib.sha256(value.encode()).hexdigest()[:40]


def put(store: Store, record: StoredModel) -> str:
    if record.is_long():  # a record, a snapshot of many cases: written as its bytes are made
        return store.put_object_streamed(record.KIND, record.iter_bytes())
    return store.put_object(record.KIND, record.to_bytes())


class WriteBatch:
    """Objects and judge index entries written together instead of one request at a time
    from inside an event loop: the units and judge ledger entries as packs only (each unit
    in one pack with its ledger entries, :mod:`evalsnap.records.pack`), other objects one
    concurrent batch per kind, then the index segment that names them. Nothing is visible
    before :meth:`flush`."""

    def __init__(self, store: Store, run_id: str) -> None:
        self.store = store
        self.run_id = run_id
        self._objects: dict[str, dict[str, bytes]] = {}
        self._ledgers: dict[str, list[str]] = {}
        self._judge: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def put(self, record: StoredModel) -> str:
        data = record.to_bytes()
        oid = "sha256:" + hashlib.sha256(data).hexdigest()
        with self._lock:
            self._objects.setdefault(record.KIND, {})[oid] = data
            if isinstance(record, ScoreUnit):
                self._ledgers[oid] = list(record.ledger)
        self.store.remember(record.KIND, oid, data)
        return oid

    def index_judge(self, sample: str, oid: str) -> None:
        """Judge sample ``sample`` is answered by ledger entry ``oid`` (see
        :mod:`evalsnap.records.segments`)."""
        with self._lock:
            self._judge.append((sample, oid))

    def flush(self) -> dict[str, list[str]]:
        """Writes what the batch holds; returns the packs holding each unit and entry
        written (oid → pack oids)."""
        with self._lock:
            objects, judge, ledgers = self._objects, self._judge, self._ledgers
            self._objects, self._judge, self._ledgers = {}, [], {}
        for kind, items in objects.items():
            if kind not in PACKED_KINDS:
                self.store.put_objects(kind, list(items.values()))
        holders = self._write_packs(objects.get("unit", {}), objects.get("judge", {}), ledgers)
        if judge:
            segments.write_segment(self.store, run_id=self.run_id, judge=judge,
                                   packs=list(dict.fromkeys(
                                       p for _, oid in judge for p in holders.get(oid, []))))
        return holders

    def _write_packs(self, units: dict[str, bytes], entries: dict[str, bytes],
                     ledgers: dict[str, list[str]]) -> dict[str, list[str]]:
        """Each unit with its ledger entries (an entry written earlier is read into its
        unit's pack too: a pack is whole, gc keeps or removes it as one), entries of no unit
        last, in id order."""
        left = dict(entries)
        groups: list[list[tuple[str, bytes]]] = []
        # in the units' id order, not the order they finished in: the same units make the
        # same packs (a run that scores a lost pack's units again writes that pack again)
        for oid, data in sorted(units.items()):
            group: list[tuple[str, bytes]] = []
            for entry in ledgers.get(oid, []):
                body = left.pop(entry, None) or entries.get(entry)
                if body is None:
                    body = self.store.get_object("judge", entry)
                group.append(("judge", body))
            groups.append([*group, ("unit", data)])
        if left:
            groups.append([("judge", body) for _, body in sorted(left.items())])
        by_oid = {oid_of(body): (kind, body) for group in groups for kind, body in group}
        holders: dict[str, list[str]] = {}
        for data, held in pack.pack_groups(groups):
            pack_oid = self.store.put_objects(pack.KIND, [data])[0]
            self.store.let_go(pack.KIND, pack_oid)
            self.store.hold_members(pack_oid, {(by_oid[oid][0], oid): by_oid[oid][1]
                                               for oid in held}, checked=True)
            for oid in held:
                holders.setdefault(oid, []).append(pack_oid)
        return holders


def get(store: Store, cls: type[M], oid: str) -> M:
    try:  # a record or snapshot parsed as its bytes are read (a part at a time on disk)
        value = cls.from_parts(lambda: store.get_object_parts(cls.KIND, oid), where=oid) \
            if cls.ROWS else cls.from_bytes(store.get_object(cls.KIND, oid), where=oid)
    except ObjectNotFound as exc:
        raise NotFoundError(f"{cls.KIND} {oid} is not in store {store.url}: {exc}") from exc
    if isinstance(value, EvaluationRecord):
        locate_units(store, value)
    return value


def locate_units(store: Store, record: EvaluationRecord) -> None:
    """Tells ``store`` that the record's units (and with them their ledger entries) may be
    held only by the record's packs (:meth:`storage.Store.locate`): every reader of a
    record's units calls it (a record read by :func:`get` is located already)."""
    if record.packs:
        store.locate((ref.unit_oid for ref in record.units), record.packs)


def find(store: Store, cls: type[M], oid: str) -> M:
    """:func:`get` for an object known by its id alone (inspection, tests): a unit or judge
    entry whose pack no record or segment read before names is looked for in every pack of
    the store (each read at most once), after its loose object. Runs never need this."""
    try:
        return get(store, cls, oid)
    except NotFoundError:
        if cls.KIND not in PACKED_KINDS:
            raise
    store.locate([oid], store.iter_objects(pack.KIND))
    return get(store, cls, oid)


class _Parsed:
    """Parsed immutable objects of one store instance, bounded (oldest forgotten first)."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._items: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, oid: str, parse: Any) -> Any:
        with self._lock:
            if oid in self._items:
                self._items.move_to_end(oid)
                return self._items[oid]
        value = parse()
        self.put(oid, value)
        return value

    def put(self, oid: str, value: Any) -> None:
        with self._lock:
            self._items[oid] = value
            while len(self._items) > self._size:
                self._items.popitem(last=False)

    def peek(self, oid: str) -> Any:
        """The parsed value of ``oid`` if it is here, else None (nothing is read)."""
        with self._lock:
            return self._items.get(oid)


def _parsed(store: Store, what: str, size: int) -> _Parsed:
    """The store's memo of parsed ``what`` (in its per-run scratch: a new run starts empty)."""
    memo = store.run_memo.get(f"parsed {what}")
    if memo is None:
        memo = store.run_memo.setdefault(f"parsed {what}", _Parsed(size))
    return memo  # type: ignore[no-any-return]


def get_snapshot(store: Store, oid: str) -> Snapshot:
    """Snapshots are immutable: parsed once per run (each metric task reads the same one)."""
    return _parsed(store, "snapshots", 64).get(  # type: ignore[no-any-return]
        oid, lambda: get(store, Snapshot, oid))


def remember_snapshot(store: Store, oid: str, snapshot: Snapshot) -> None:
    """A snapshot this process has just written (``oid``), kept as a read of it parses it
    (its volatile ``created_at`` empty, its cases the same rows): publish and the pages
    find it here instead of reading it back (~66 MB read and parsed at 30,000 cases)."""
    _parsed(store, "snapshots", 64).put(oid, snapshot.model_copy(update={"created_at": ""}))


def get_unit_shared(store: Store, oid: str) -> ScoreUnit:
    """A score unit parsed once per run, for readers that never modify it (reports, the
    ADK history copy): a run's summary, history and artifacts read every unit."""
    return _parsed(store, "units", 4096).get(  # type: ignore[no-any-return]
        oid, lambda: get(store, ScoreUnit, oid))


def get_ledger_shared(store: Store, oid: str) -> LedgerEntry:
    """A judge ledger entry parsed once per run while among the last 2,048 parsed, for
    readers that never modify it: the pages of a run show the entries of the cases they
    detail (at most ``EVALSNAP_REPORT_DETAIL_CASES``), which the CLI reads ahead while
    Prefect's temporary API starts (:func:`evalsnap.reports.html.read_ahead`)."""
    return _parsed(store, "judge entries", 2048).get(  # type: ignore[no-any-return]
        oid, lambda: get(store, LedgerEntry, oid))


def get_unit_verdict(store: Store, oid: str) -> UnitVerdict:
    """A unit's verdict (:class:`UnitVerdict`), read and checked as :func:`get` does, once
    per run: what a run's summary, aggregates and pages read of each of its units, kept
    packed (:class:`_Verdicts`)."""
    memo = _verdicts(store)
    found = memo.get(oid)
    if found is None:
        shared = _parsed(store, "units", 4096).peek(oid)
        found = UnitVerdict.of(shared if shared is not None else get(store, ScoreUnit, oid))
        memo.put(oid, found)
    return found


class RecordVerdicts(Mapping[str, UnitVerdict]):
    """The verdicts of a record's units by unit oid, each read (:func:`get_unit_verdict`)
    when it is looked up: a dict of 210,000 verdicts at 30,000 cases is not made."""

    def __init__(self, store: Store, record: EvaluationRecord) -> None:
        self._store, self._record = store, record

    def __getitem__(self, oid: str) -> UnitVerdict:
        return get_unit_verdict(self._store, oid)

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys(ref.unit_oid for ref in self._record.units))

    def __len__(self) -> int:
        return sum(1 for _ in self)


def unit_verdicts(store: Store, record: EvaluationRecord) -> RecordVerdicts:
    """The verdicts of a record's units by unit oid (:func:`get_unit_verdict`)."""
    locate_units(store, record)
    return RecordVerdicts(store, record)


class _Verdicts:
    """Unit verdicts by unit oid, packed (:meth:`UnitVerdict.packed`) as rows (past a few
    MB in a temporary file: :class:`~evalsnap.rows.Spool`), each found by its 16-byte key
    (:class:`~storage.keymap.KeyNumbers`: its row's number): ~50 bytes a unit in memory
    where the verdict objects by oid took ~400 (210,000 units at 30,000 cases). Past
    ``size`` units it starts again empty."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._rows = Spool()
        self._at = KeyNumbers()
        self._lock = threading.Lock()

    def get(self, oid: str) -> UnitVerdict | None:
        with self._lock:
            at = self._at.get_key(short_key(oid))
            data = None if at is None else self._rows[at]
        return None if data is None else UnitVerdict.unpacked(data)

    def has(self, oid: str) -> bool:
        with self._lock:
            return self._at.get_key(short_key(oid)) is not None

    def put(self, oid: str, verdict: UnitVerdict) -> None:
        data, key = verdict.packed(), short_key(oid)
        with self._lock:
            if self._at.get_key(key) is not None:
                return
            if len(self._at) >= self._size:
                self._rows, self._at = Spool(), KeyNumbers()
            self._at.put_key(key, len(self._rows))
            self._rows.extend((data,))


def _verdicts(store: Store) -> _Verdicts:
    memo = store.run_memo.get("unit verdicts")
    if memo is None:
        memo = store.run_memo.setdefault("unit verdicts", _Verdicts(1 << 20))
    return memo  # type: ignore[no-any-return]


def remember_verdict(store: Store, oid: str, data: bytes) -> None:
    """Keeps the verdict of unit ``oid`` from ``data``, bytes already checked to hash to
    ``oid`` (a pack member this run wrote): the run's summary then reads nothing for it."""
    memo = _verdicts(store)
    if not memo.has(oid):
        try:
            memo.put(oid, UnitVerdict.of(ScoreUnit.from_bytes(data, where=oid)))
        except EvalsnapError:  # not a unit after all: read (and judged) as the object, later
            pass


def get_inference(store: Store, oid: str) -> InferenceRecord:
    """An inference record, parsed once per run while it is among the last 512 parsed:
    reuse, freeze, publish, the report and the ADK history copy each read every case's."""
    return _parsed(store, "inferences", 512).get(  # type: ignore[no-any-return]
        oid, lambda: get(store, InferenceRecord, oid))


def _inference_run_id(store: Store, oid: str) -> str:
    try:
        raw = parse_stored(store.get_object(InferenceRecord.KIND, oid), what=f"inference {oid}")
    except (ObjectNotFound, CorruptRecordError):
        raw = None
    run_id = raw.get("run_id") if isinstance(raw, dict) else None
    if not isinstance(run_id, str):
        run_id = get_inference(store, oid).run_id  # the typed error, or the validated value
    return run_id


def inference_run_id(store: Store, oid: str) -> str:
    """The run that made an inference, read without validating the whole conversation (a
    rescore's plan needs it for every case). Objects are immutable, so it is remembered per
    run; a missing or unreadable object gets the same typed error as :func:`get_inference`."""
    return _parsed(store, "inference run ids", 65536).get(  # type: ignore[no-any-return]
        oid, lambda: _inference_run_id(store, oid))


# ---- indexes: small JSON refs, hints only ---------------------------------------------------

#: The most bytes an index entry can have (they hold a few ids).
MAX_INDEX_ENTRY_BYTES = 64 * 1024
_Oid = Annotated[str, Field(pattern=OID_PATTERN.pattern)]


class _IndexEntry(BaseModel):
    """An index entry as read: exactly the types written, other keys ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)


class InferenceIndexEntry(_IndexEntry):
    oid: _Oid
    run_id: str


class UnitIndexEntry(_IndexEntry):
    unit_oid: _Oid
    run_id: str
    record_oid: _Oid
    complete: bool


class EvalSetIndexEntry(_IndexEntry):
    record_oid: _Oid
    run_id: str


class JudgeIndexEntry(_IndexEntry):
    oid: _Oid


#: Every index namespace and the shape of its entries.
INDEXES: dict[str, type[_IndexEntry]] = {
    "index/inference": InferenceIndexEntry,
    "index/unit": UnitIndexEntry,
    "index/evalset": EvalSetIndexEntry,
    "index/judge": JudgeIndexEntry,
}


def parse_index_entry(namespace: str, data: bytes, *, where: str) -> dict[str, Any]:
    """The entry ``data`` of index ``namespace`` as a dict; ``CorruptRecordError`` if it
    does not parse or is not the shape of that index's entries."""
    advice = "it counts as absent; delete it, or let the next run that computes it replace it"
    raw = parse_stored(data, what=f"index entry {where}", limit=MAX_INDEX_ENTRY_BYTES,
                       advice=advice)
    try:
        return INDEXES[namespace].model_validate(raw).model_dump()
    except ValidationError as exc:
        raise CorruptRecordError(
            f"index entry {where} is not a {namespace} entry ({first_problem(exc)}); {advice}."
        ) from exc


def read_index_entry(store: Store, namespace: str, name: str) -> dict[str, Any] | None:
    """The entry ``name`` of index ``namespace``, or None if there is none or it is unusable
    (logged): an index is a hint, and a bad hint is no hint."""
    try:
        data: bytes | None | TooLarge = store.get_ref(namespace, name)
    except TooLarge as exc:
        data = exc
    return _usable_entry(namespace, name, data)


def _usable_entry(namespace: str, name: str, data: bytes | None | TooLarge
                  ) -> dict[str, Any] | None:
    """The entry ``data`` (as :meth:`Store.get_refs` gives it) parsed, or None (logged)."""
    if data is None:
        return None
    try:
        if isinstance(data, TooLarge):
            raise data
        return parse_index_entry(namespace, data, where=f"{namespace}/{name}")
    except (CorruptRecordError, TooLarge) as exc:
        logger.warning("%s", exc)
        return None


def index_entry_bytes(namespace: str, value: dict[str, Any]) -> bytes:
    """The bytes :func:`write_index_entry` writes for ``value`` (checked against the shape of
    the index first): what a listing's MD5 can prove an entry holds, without reading it."""
    entry = INDEXES[namespace].model_validate(value)
    return json.dumps(entry.model_dump(), sort_keys=True).encode()


def write_index_entry(store: Store, namespace: str, name: str, value: dict[str, Any]) -> None:
    """Replaces the entry ``name`` of index ``namespace`` (checked against its shape first)."""
    store.put_ref(namespace, name, index_entry_bytes(namespace, value))


# ---- inference index -------------------------------------------------------------------------

def inference_index_entry(store: Store, fingerprint: str) -> dict[str, Any] | None:
    """The inference index entry for ``fingerprint`` (whether to use it is
    :mod:`evalsnap.pipeline.reuse`'s business)."""
    return read_index_entry(store, "index/inference", hexof(fingerprint))


def index_inference(store: Store, record: InferenceRecord, oid: str) -> None:
    if record.ok:
        write_index_entry(store, "index/inference", hexof(record.inference_fingerprint),
                          {"oid": oid, "run_id": record.run_id})


# ---- unit index ------------------------------------------------------------------------------

def unit_index_entries(store: Store, unit_fingerprint: str) -> list[dict[str, Any]]:
    """The unit index's candidates for a unit key, best first (newest complete, then newest
    incomplete; :mod:`evalsnap.records.segments`)."""
    return segments.unit_entries(store, hexof(unit_fingerprint))


def unit_index_entry(store: Store, unit_fingerprint: str) -> dict[str, Any] | None:
    """The unit index's best entry for a unit key, if any."""
    found = unit_index_entries(store, unit_fingerprint)
    return found[0] if found else None


def load_unit(store: Store, oid: str) -> ScoreUnit | None:
    """The unit, read and verified now (reuse decides on what the store holds, not on an
    earlier read), or None if it is damaged, missing or not a unit."""
    try:
        return get(store, ScoreUnit, oid)
    except EvalsnapError as exc:  # damaged, missing or not a unit: absent
        logger.warning("score unit %s unusable (%s); scoring again", oid, exc)
        return None


def index_units(store: Store, items: Iterable[tuple[str, bool, str, str]], record_oid: str,
                run_id: str, packs: list[str] | None = None) -> None:
    """Points each unit key (fingerprint, complete, unit oid, run id) at this result: one
    index segment written by run ``run_id`` (an incomplete unit never hides a complete one:
    :mod:`evalsnap.records.segments` prefers complete ones, so nothing is read first);
    ``packs``: those that hold the units."""
    segments.write_segment(store, run_id=run_id, record_oid=record_oid,
                           units=((hexof(fp), oid, complete, run)
                                  for fp, complete, oid, run in items), packs=packs or ())


# ---- runs, records, eval set history ---------------------------------------------------------

def manifest_checksum(manifest: RunManifest) -> str:
    """sha256 of the manifest without its ``checksum`` field."""
    body = manifest.model_copy(update={"checksum": ""}).to_bytes()
    return "sha256:" + hashlib.sha256(body).hexdigest()


def write_manifest(store: Store, manifest: RunManifest) -> None:
    sealed = manifest.model_copy(update={"checksum": manifest_checksum(manifest)})
    store.put_ref("runs", manifest.run_id, sealed.to_bytes(), commit=True)


def read_manifest(store: Store, run_id: str, data: bytes | None = None) -> RunManifest:
    """The manifest of ``run_id`` (``data``: its bytes, read already), its checksum verified:
    ``NotFoundError`` if there is none, ``CorruptRecordError`` / ``CorruptObjectError`` /
    ``UnsupportedSchemaVersion`` if it cannot be used."""
    data = data if data is not None else store.get_ref("runs", ref_name(run_id))
    if data is None:
        raise NotFoundError(f"run {run_id!r} is not in store {store.url}; "
                            "list runs with `evalsnap ls`.")
    manifest = RunManifest.from_bytes(data, where=f"runs/{run_id}")
    actual = manifest_checksum(manifest)
    if manifest.checksum != actual:
        raise CorruptObjectError(f"{store.url}/v1/refs/runs/{run_id}", manifest.checksum, actual)
    return manifest


def list_manifests(store: Store) -> list[RunManifest]:
    """All readable manifests, newest first by when the store wrote them (unreadable ones are
    logged and skipped: they are `verify`'s business)."""
    out = []
    for name in _newest_first(store):
        try:
            out.append(read_manifest(store, name))
        except UNREADABLE_MANIFEST as exc:
            logger.warning("skipping run %s: %s", name, exc)
    return out


def _newest_first(store: Store) -> list[str]:
    """Run names, newest first by the store's own clock (S3 ``LastModified``, GCS ``updated``,
    file mtime): a manifest's ``created_at`` is what the file claims of itself, and one dated
    2099 must not become ``latest`` (ties, within a listing's resolution: the run id, which
    starts with its UTC start time)."""
    return [name for name, _ in sorted(store.list_refs_dated("runs"),
                                       key=lambda item: (item[1], item[0]), reverse=True)]


def _head(store: Store, name: str) -> tuple[str | None, bool, bytes | None]:
    """A manifest's eval set id and whether its record is full, read without validating it
    (None / True where it says nothing), and its bytes."""
    try:
        data = store.get_ref("runs", name)
    except UNREADABLE_MANIFEST:
        return None, True, None  # read_manifest says why, if it comes to that
    try:
        raw = parse_stored(data, what=f"manifest runs/{name}") if data is not None else None
    except CorruptRecordError:
        return None, True, data
    raw = raw if isinstance(raw, dict) else {}
    eval_set, full = raw.get("eval_set_id"), raw.get("full")
    return (eval_set if isinstance(eval_set, str) else None), full is not False, data


def latest_manifest(store: Store, *, eval_set_id: str | None = None,
                    exclude_run: str | None = None, fallback: bool = True) -> RunManifest | None:
    """The newest readable manifest of a *full* run (of ``eval_set_id`` if given, never
    ``exclude_run``); with ``fallback``, the newest run at all when none is full (a warning
    says so). A baseline asks without ``fallback``: it must be a full run.

    Newest by when the store wrote the manifest (:func:`_newest_first`), read lazily: runs
    are looked at newest first until one is found (a manifest lists every object of its run,
    ~240 KB at 300 cases; reading a year of nightly runs to find the newest would cost a
    request and ~20 ms each).
    """
    partial: list[str] = []
    for name in _newest_first(store):
        if name == exclude_run:
            continue
        set_id, full, data = _head(store, name)
        if eval_set_id is not None and set_id not in (None, eval_set_id):
            continue
        if not full:
            partial.append(name)
            continue
        found = _readable(store, name, eval_set_id, data)
        if found is not None:
            return found
    for name in partial if fallback else []:
        found = _readable(store, name, eval_set_id)
        if found is not None:
            logger.warning("no full run in store %s%s; `latest` is run %s, which covers only "
                           "part of its eval set or config", store.url,
                           f" for eval set {eval_set_id}" if eval_set_id else "", name)
            return found
    return None


def full_runs(store: Store, eval_set_id: str, *,
              exclude_run: str | None = None) -> Iterator[RunManifest]:
    """The readable manifests of the *full* runs of ``eval_set_id`` (never ``exclude_run``),
    newest first as :func:`latest_manifest` orders them, read lazily: a caller that stops
    at the first it wants reads only those before it."""
    for name in _newest_first(store):
        if name == exclude_run:
            continue
        set_id, full, data = _head(store, name)
        if set_id not in (None, eval_set_id) or not full:
            continue
        found = _readable(store, name, eval_set_id, data)
        if found is not None and found.full is not False:
            yield found


def _readable(store: Store, name: str, eval_set_id: str | None,
              data: bytes | None = None) -> RunManifest | None:
    try:
        manifest = read_manifest(store, name, data)
    except UNREADABLE_MANIFEST as exc:
        logger.warning("skipping run %s: %s", name, exc)
        return None
    return manifest if eval_set_id is None or manifest.eval_set_id == eval_set_id else None


def latest_record_for(store: Store, eval_set_id: str) -> str | None:
    entry = read_index_entry(store, "index/evalset", ref_name(eval_set_id))
    return entry.get("record_oid") if entry else None


def set_latest_record(store: Store, eval_set_id: str, record_oid: str, run_id: str) -> None:
    write_index_entry(store, "index/evalset", ref_name(eval_set_id),
                      {"record_oid": record_oid, "run_id": run_id})


def resolve_record(store: Store, ref: str) -> tuple[str, EvaluationRecord]:
    """A record by run id, record id (``sha256:…`` or a unique hex prefix ≥ 8), or ``latest``
    (the newest run that covers its whole eval set and config; the newest run if none does)."""
    if ref == "latest":
        manifest = latest_manifest(store)
        if manifest is None and store.list_refs("runs"):
            raise NotFoundError(f"no run in store {store.url} can be read (each is named "
                                "above); run `evalsnap verify` to list what is damaged.")
        if manifest is None:
            raise NotFoundError(f"store {store.url} holds no runs yet; run `evalsnap run` first.")
        oid = manifest.record_oid
        return oid, get(store, EvaluationRecord, oid)
    if store.get_ref("runs", ref_name(ref)) is not None:
        oid = read_manifest(store, ref).record_oid
        return oid, get(store, EvaluationRecord, oid)
    hex_part = hexof(ref).lower()
    if len(hex_part) >= 8 and re.fullmatch(r"[0-9a-f]+", hex_part):
        matches = [o for o in store.iter_objects("record") if hexof(o).startswith(hex_part)]
        if len(matches) == 1:
            return matches[0], get(store, EvaluationRecord, matches[0])
        if len(matches) > 1:
            raise NotFoundError(f"record prefix {ref!r} is ambiguous; give more characters.")
    raise NotFoundError(_removed_by_gc(store, ref) or f"no run or record {ref!r} in store "
                        f"{store.url}; list them with `evalsnap ls`.")


def _removed_by_gc(store: Store, ref: str) -> str | None:
    """Why ``ref`` is not in the store, if gc removed it (its tombstone says when)."""
    from evalsnap.records import marks

    try:
        grave = marks.tombstone(store, ref)
    except (CorruptRecordError, TooLarge) as exc:
        return (f"no run or record {ref!r} in store {store.url}; a tombstone of it is there "
                f"but cannot be read ({exc})")
    if grave is None:
        return None
    return (f"run {grave.run_id} (eval set {grave.eval_set_id}, record {grave.record_id}) was "
            f"removed by gc on {grave.removed_at}; it cannot be shown or compared with any "
            "more. To keep a run from gc, pin it (`evalsnap pin RUN`) or accept it "
            "(`evalsnap accept RUN`); gc also keeps the last-good run of each eval set.")
