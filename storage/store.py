"""The evalsnap store: content-addressed objects and mutable refs behind one fsspec URL.

Layout: see :mod:`storage._layout`. Objects are created only if absent (object stores: one
conditional PUT, ``pipe_file(mode="create")``; local disk: temp file + fsync + ``os.link``),
so writing an existing object is a no-op and retries are idempotent; every read re-hashes.
Refs are replaced whole (object stores: one PUT; local disk: temp file + fsync +
``os.replace``). Nothing is renamed on an object store, and nothing is built there with
``open('wb')``: the bytes are complete before the single write. Local fsyncs can be
batched (``durability="batch"``, see :meth:`Store.flush`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from storage import _local
from storage._backend import OVERSIZE, FileInfo, RequestCounts, open_backend
from storage._layout import (
    LAYOUT_VERSION,
    MARKER,
    SITE,
    as_bytes,
    check_content,
    object_rel,
    oid_from_rel,
    ref_rel,
    site_rel,
)
from storage.errors import (
    CorruptObjectError,
    ObjectNotFound,
    StorageError,
    StoreUnavailable,
    TooLarge,
)
from storage.ids import (
    ID_PATTERN,
    MAX_ID_LENGTH,
    OBJECT_KINDS,
    PACKED_KINDS,
    oid_of,
    validate_id,
    validate_kind,
)
from storage.keymap import KeyMap
from storage.readcache import ReadCache, SlabLRU

__all__ = ["LAYOUT_VERSION", "Problem", "Store"]

logger = logging.getLogger(__name__)

_VERIFY_BATCH = 64
#: Bytes of verified objects a store instance keeps in memory (objects are immutable: a run
#: reads each once; least recently used ones are dropped beyond this).
READ_CACHE_BYTES = 128 * 2**20
#: Of which judge ledger entries (~8 KB each, the largest objects of a run by count) may take
#: at most this many, least recently used dropped first: after scoring only a report's
#: detailed cases read them again, and at 10,000 cases they filled the whole cache (measured:
#: 192 MB of a 1.5 GB peak) and pushed out the units and inference records read again.
READ_CACHE_JUDGE_BYTES = 32 * 2**20
#: Prefect's task results a run keeps in mind (Prefect reads a cache hit twice, right after
#: it asked for it the first time): the most recent, up to this many bytes (one result of
#: at most a quarter of it: a metric task of ~10,000 units).
TASK_RESULTS_BYTES = 32 * 2**20
#: The most bytes read of one stored file: a planted huge file is refused after this many
#: bytes, never downloaded or parsed whole (refs: run manifests, reports; objects: records).
MAX_REF_BYTES = 256 * 2**20
MAX_OBJECT_BYTES = 1024 * 2**20
#: The kind of objects that hold other objects (see :meth:`Store.open_packs`).
PACK_KIND = "pack"
#: A metric's unit outcomes, which a cached scoring result names (evalsnap/records/outcomes.py).
OUTCOMES_KIND = "outcomes"
#: Packs opened at once when reads ask for their members (each is up to a few MB; the one
#: that holds what is asked is usually known, so one at a time).
PACK_OPEN_BATCH = 1
#: Objects whose packs a store instance keeps in mind across runs, at most (a long-lived
#: process serving many runs forgets them all past this; ~100 bytes each).
_MAX_HOLDERS = 1_000_000

#: How a pack's bytes become its members, ``(kind, oid) → bytes``, each checked against its
#: oid (raising on bytes that are not a pack): given by the layer that writes packs
#: (:mod:`evalsnap.records.pack`), so that this package knows no record format.
Unpacker = Callable[[bytes, str], Mapping[tuple[str, str], bytes]]
_unpacker: Unpacker | None = None


def set_unpacker(unpack: Unpacker) -> None:
    """Sets how packs are read (:data:`Unpacker`)."""
    global _unpacker
    _unpacker = unpack


def _kept(kind: str, data: bytes) -> bytes | None:
    """What the read cache keeps of an object just written: not a pack's bytes (its writer
    keeps its members, :meth:`Store.hold_members`, and lets go of the pack at once), nor a
    metric's outcomes (its writer holds them; a later run reads them)."""
    return None if kind in (PACK_KIND, OUTCOMES_KIND) else data


def _read_cache() -> ReadCache:
    return ReadCache(READ_CACHE_BYTES, READ_CACHE_JUDGE_BYTES, f"{LAYOUT_VERSION}/objects/judge/")


@dataclass(frozen=True)
class Problem:
    """One finding of :meth:`Store.verify`."""

    path: str
    """URL of the offending file."""
    kind: str
    """Object kind whose area the file is in."""
    message: str
    """What is wrong and what to do about it."""


class Store:
    """Content-addressed objects and mutable refs in one location given by a URL.

    ``url`` is a local path (relative or absolute), ``file://PATH``, ``s3://BUCKET/PREFIX``,
    ``gs://BUCKET/PREFIX`` or ``memory://NAME``. Credentials and endpoints come from each
    backend's standard chain (``AWS_*`` variables incl. ``AWS_ENDPOINT_URL``;
    ``STORAGE_EMULATOR_HOST`` or Application Default Credentials), or from
    ``storage_options`` for the fsspec filesystem. Every remote call has a deadline
    (``timeout`` seconds; more for big transfers and listings), so a dead store raises
    :class:`StoreUnavailable` instead of hanging. The first call probes the store once.
    """

    url: str
    """The normalized store URL (a plain absolute path for local stores); no credentials."""

    def __init__(
        self,
        url: str,
        storage_options: Mapping[str, str] | None = None,
        *,
        timeout: float = 10.0,
        durability: str = "each",
    ) -> None:
        if durability not in ("each", "batch"):
            raise ValueError(f"durability must be 'each' or 'batch', not {durability!r}")
        self._b = open_backend(url, storage_options, timeout)
        self._options = dict(storage_options or {})
        self._durability = durability
        self._ready = False
        self._lock = threading.Lock()
        self._pending_lock = threading.Lock()
        self._pending_files: set[str] = set()
        self._pending_dirs: set[str] = set()
        # Objects are immutable: what this instance read (verified) or wrote, and what a
        # listing proved intact, need no second request (DESIGN.md "Store economy").
        self._cache = _read_cache()
        self._known: KeyMap[None] = KeyMap()
        self._listings: dict[str, dict[str, FileInfo]] = {}
        self._in_run = False  # remembering starts with new_run() (a run), ends with end_run()
        #: Per-run scratch of the layers above (e.g. reuse hints), forgotten by new_run.
        self.run_memo: dict[str, Any] = {}
        # objects held in packs (see open_packs): which packs may hold an object (told by
        # the layers above: a record's packs, a segment's; hints, kept across runs, as a
        # record read before a run is read from within it), which one was found to hold it
        # and which packs were opened (in this run)
        self._holders: KeyMap[tuple[str, ...]] = KeyMap()
        self._pack_gate = threading.Lock()
        self._packs_forget()
        self.url = self._b.url

    def _packs_forget(self) -> None:
        self._found_in: KeyMap[str] = KeyMap()
        self._opened: set[str] = set()
        self._damaged_packs: dict[str, bytes] = {}
        if len(self._holders) > _MAX_HOLDERS:
            self._holders = KeyMap()

    def new_run(self) -> None:
        """Forget what this instance learnt of the store (read cache, objects known intact,
        listings) and start counting requests from zero: a new run reads what the store
        holds now (another process may have damaged or deleted objects since)."""
        self._cache = _read_cache()
        self._known = KeyMap()
        self._listings = {}
        self.run_memo = {}
        self._packs_forget()
        self._in_run = True
        self._b.requests.reset()

    def end_run(self) -> None:
        """Stop remembering (after a run): commands outside a run read the store afresh."""
        self.new_run()
        self._in_run = False

    def _learn(self, rel: str, data: bytes | None = None) -> None:
        """Within a run: ``rel`` is in the store, intact (and holds ``data``)."""
        if self._in_run:
            self._known.add(rel)
            if data is not None:
                self._cache.put(rel, data)

    def _forget(self, rel: str) -> None:
        self._known.discard(rel)
        self._cache.drop(rel)

    @property
    def is_bucket(self) -> bool:
        """An object store (S3, GCS): a request's latency is what concurrent reads
        hide; on local disk a read waits for nothing they could overlap."""
        return bool(self._b.is_object_store)

    @property
    def requests(self) -> RequestCounts:
        """Requests this instance sent to the store, by kind (what a bucket bills)."""
        return self._b.requests

    def __repr__(self) -> str:
        return f"Store({self.url!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # Locks and event loops do not pickle; a store is fully described by its arguments
        # (writes not yet flushed stay the business of the process that made them).
        return (_rebuild, (self.url, self._options, self._b.timeout, self._durability))

    # -- durability -------------------------------------------------------------------------

    def flush(self) -> None:
        """Make every deferred local write of this instance durable (``durability="batch"``).

        With ``"batch"`` a local write is atomic and visible at once, but its fsync waits
        for the next ``flush`` or commit (``put_ref(..., commit=True)``), as git's
        ``core.fsyncMethod=batch`` does: one round of fsyncs per batch instead of two per
        file. A killed process loses nothing (the page cache survives it); a power cut
        may lose unflushed objects, which readers then find missing or damaged (typed
        errors, repaired by the next write of the same content), never a commit that
        points at them. Object stores are durable per PUT; this is a no-op there.
        """
        with self._pending_lock:
            files, dirs = sorted(self._pending_files), sorted(self._pending_dirs)
            self._pending_files.clear()
            self._pending_dirs.clear()
        if files or dirs:
            with self._b.failures(f"flushing {len(files)} writes to {self.url}"):
                _local.fsync_paths(files, dirs)

    def _deferred(self, path: str) -> None:
        with self._pending_lock:
            self._pending_files.add(path)
            self._pending_dirs.add(os.path.dirname(path))

    # -- health -----------------------------------------------------------------------------

    def check(self, *, write: bool = True) -> None:
        """Probe the store now: reachable, bucket present, readable and (if ``write``) writable.

        Commands that only read probe with ``write=False``: that reads the layout marker
        (absent is fine: nothing was written yet) and never writes, so read-only
        credentials, bucket roles and mounts serve them.
        """
        with self._lock:
            self._ready = False
        self._ensure_ready()
        rel = f"{LAYOUT_VERSION}/STORE"
        if not write:
            self._read(rel, f"reading {self._url(rel)}")
            return
        self._write_whole(rel, MARKER, f"writing {self._url(rel)}")
        if self._read(rel, f"reading {self._url(rel)} back") != MARKER:
            raise StoreUnavailable(
                self.url,
                f"{self._url(rel)} read back different bytes than were written; "
                "check that nothing else rewrites files in this location",
            )

    # -- content-addressed objects -------------------------------------------------------

    def put_object(self, kind: str, data: bytes) -> str:
        """Store ``data`` under its sha256 unless present; return ``"sha256:<hex>"``."""
        kind = validate_kind(kind)
        data = as_bytes(data)
        oid = oid_of(data)
        rel = object_rel(kind, oid)
        if rel in self._known:
            return oid  # read intact, written or proved by a listing in this run
        self._ensure_ready()
        what = f"writing {self._url(rel)}"
        created = True
        if self._b.protocol == "file":
            created = self._local(_local.write_once, rel, data, what)
        else:
            try:
                self._b.call(what, "pipe_file", self._path(rel), data, mode="create",
                             nbytes=len(data))
            except FileExistsError:
                created = False  # already there, perhaps from a concurrent writer
            except FileNotFoundError as exc:
                raise self._b.missing_bucket(what) from exc
        if not created and not self._proved(rel, data):
            self._repair_if_damaged(rel, data, oid, what)
        self._learn(rel, _kept(kind, data))
        if kind == PACK_KIND:
            self._damaged_packs.pop(oid, None)
        return oid

    def put_object_streamed(self, kind: str, parts: Iterable[bytes]) -> str:
        """:meth:`put_object` of bytes given a part at a time (a record of 70,000 units is
        ~50 MB): on local disk they are written and hashed as they come, never held whole
        (nor kept in the read cache); on an object store they are joined for its one PUT."""
        kind = validate_kind(kind)
        if self._b.protocol != "file":
            return self.put_object(kind, b"".join(parts))
        self._ensure_ready()
        digest = hashlib.sha256()

        def hashed() -> Iterator[bytes]:
            for part in parts:
                digest.update(part)
                yield part

        def name() -> str:
            return self._path(object_rel(kind, "sha256:" + digest.hexdigest()))

        def intact(path: str) -> bool:  # a file there already: the bytes its name says?
            check = hashlib.sha256()
            with open(path, "rb") as handle:
                while chunk := handle.read(1 << 20):
                    check.update(chunk)
            if check.hexdigest() == digest.hexdigest():
                return True
            logger.warning("repairing damaged object %s", self._url_of(path))
            return False

        what = f"writing a {kind} object to {self.url}"
        sync = self._durability == "each"
        self._b.requests.add("put")
        with self._b.failures(what):
            path, _ = _local.write_once_streamed(
                self._path(f"{LAYOUT_VERSION}/objects/{kind}"), hashed(), name, intact=intact,
                sync=sync, root=self._b.root)
        if not sync:
            self._deferred(path)
        oid = "sha256:" + digest.hexdigest()
        if self._in_run:
            self._known.add(object_rel(kind, oid))
        return oid

    def put_objects(self, kind: str, items: Iterable[bytes]) -> list[str]:
        """:meth:`put_object` for many objects at once: one concurrent batch of conditional
        writes on an object store (objects this instance knows are there are skipped)."""
        kind = validate_kind(kind)
        datas = [as_bytes(d) for d in items]
        oids = [oid_of(d) for d in datas]
        todo = {object_rel(kind, oid): data for oid, data in zip(oids, datas, strict=True)
                if object_rel(kind, oid) not in self._known}
        if not todo:
            return oids
        if not self._b.is_object_store:
            for data in todo.values():
                self.put_object(kind, data)
            return oids
        self._ensure_ready()
        written = self._b.write_many(f"writing {len(todo)} {kind} objects to {self.url}",
                                     {self._path(rel): data for rel, data in todo.items()},
                                     create=True)
        for rel, data in todo.items():
            if not written[self._path(rel)] and not self._proved(rel, data):
                self._repair_if_damaged(rel, data, oid_of(data), f"writing {self._url(rel)}")
            self._learn(rel, _kept(kind, data))
        if kind == PACK_KIND:
            for oid in oids:
                self._damaged_packs.pop(oid, None)
        return oids

    def _repair_if_damaged(self, rel: str, data: bytes, oid: str, what: str) -> None:
        """An existing object with other bytes is damage: replace it whole with the good bytes.

        Without this a damaged object would stay forever, since every later write of the
        same content is a no-op. Identical bytes (the normal case) are left alone.
        """
        existing = self._read(rel, f"checking {self._url(rel)}", long=True,
                              limit=MAX_OBJECT_BYTES)
        if existing is not None and oid_of(existing) == oid:
            return
        logger.warning("repairing damaged object %s", self._url(rel))
        self._write_whole(rel, data, what)

    def get_object(self, kind: str, oid: str) -> bytes:
        """The bytes of an object, verified against ``oid``."""
        rel = object_rel(validate_kind(kind), oid)
        cached = self._cache.get(rel) if rel in self._known or oid in self._found_in else None
        if cached is not None:
            return cached
        if kind in PACKED_KINDS and (oid in self._found_in or oid in self._holders):
            got = self.get_objects(kind, [oid])[oid]
            if isinstance(got, Exception):
                raise got
            return got
        self._ensure_ready()
        data = self._read(rel, f"reading {self._url(rel)}", long=True, limit=MAX_OBJECT_BYTES)
        return self._checked(rel, oid, data)

    def get_object_parts(self, kind: str, oid: str, part: int = 1 << 20) -> Iterator[bytes]:
        """:meth:`get_object`'s bytes a part at a time, for a reader that parses as it
        reads (a long record: a snapshot of 30,000 cases is ~66 MB): on local disk read and
        hashed as they come, never whole (nor kept in the read cache); once the last part
        is given, ``CorruptObjectError`` if they are not what ``oid`` names (a reader must
        read to the end before it trusts what it parsed). Elsewhere, and for an object this
        instance holds, or of at most 4 parts (read as before, into the read cache), the
        whole bytes as one part."""
        kind = validate_kind(kind)
        rel = object_rel(kind, oid)
        if self._b.protocol == "file" and kind not in PACKED_KINDS and not (
                rel in self._known and self._cache.holds(rel)):
            self._ensure_ready()
            what, path = f"reading {self._url(rel)}", self._path(rel)
            with self._b.failures(what):
                _local.confine(self._b.root, path, final=True)
                try:
                    handle = open(path, "rb")  # noqa: SIM115 - closed by _parts, or here
                except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                    handle = None
                long = handle is not None and os.fstat(handle.fileno()).st_size > 4 * part
            if long:
                yield from self._parts(rel, oid, handle, part, what)
                return
            if handle is not None:
                handle.close()
        yield self.get_object(kind, oid)

    def _parts(self, rel: str, oid: str, handle: Any, part: int, what: str) -> Iterator[bytes]:
        """:meth:`get_object_parts` of an open local file."""
        self._b.requests.add("get")
        digest, size = hashlib.sha256(), 0
        with handle:
            while True:
                with self._b.failures(what):
                    chunk = handle.read(part)
                if not chunk:
                    break
                size += len(chunk)
                if size > MAX_OBJECT_BYTES:
                    self._forget(rel)
                    raise TooLarge(self._url(rel), MAX_OBJECT_BYTES)
                digest.update(chunk)
                yield chunk
        actual = "sha256:" + digest.hexdigest()
        if actual != oid:
            self._forget(rel)
            raise CorruptObjectError(self._url(rel), oid, actual)
        self._learn(rel)

    def get_objects(self, kind: str, oids: Iterable[str]) -> dict[str, bytes | Exception]:
        """The verified bytes of many objects, read in one concurrent batch (what this
        instance read before comes from memory); per oid the bytes, or the typed error
        :meth:`get_object` would raise (``ObjectNotFound``, ``CorruptObjectError``)."""
        kind = validate_kind(kind)
        out: dict[str, bytes | Exception] = {}
        todo: dict[str, str] = {}
        for oid in dict.fromkeys(oids):
            rel = object_rel(kind, oid)
            cached = self._cache.get(rel) if rel in self._known or oid in self._found_in \
                else None
            if cached is not None:
                out[oid] = cached
            else:
                todo[oid] = rel
        if todo and kind in PACKED_KINDS and (self._holders or self._found_in):
            self._from_packs(kind, todo, out)
        if todo:
            self._ensure_ready()
            raw = self._b.read_many(f"reading {len(todo)} {kind} objects from {self.url}",
                                    [self._path(rel) for rel in todo.values()],
                                    limit=MAX_OBJECT_BYTES)
            for oid, rel in todo.items():
                try:
                    data = raw[self._path(rel)]
                    if _too_long(data, MAX_OBJECT_BYTES):
                        raise TooLarge(self._url(rel), MAX_OBJECT_BYTES)
                    out[oid] = self._checked(rel, oid, data)
                except (ObjectNotFound, CorruptObjectError) as exc:
                    out[oid] = exc
        return out

    # -- objects held in packs ----------------------------------------------------------------

    def locate(self, oids: Iterable[str], packs: Iterable[str]) -> None:
        """The objects ``oids`` may be held by ``packs`` (the only copy of a unit or judge
        entry that a scoring task wrote as a pack): a read of one that this instance does
        not hold opens those packs (:meth:`open_packs`) before it asks for a loose object."""
        named = tuple(dict.fromkeys(packs))
        if not named:
            return
        holders, found, among = self._holders, self._found_in, set(named)
        for oid in oids:
            if oid in found:
                continue  # read or written by this instance: where is known
            old = holders.get(oid)
            # one tuple shared by every object of a record (a tuple per object, merged, held
            # 70,000 copies of a 300-pack tuple at 10,000 cases)
            holders[oid] = named if old is None or old is named \
                or all(p in among for p in old) else tuple(dict.fromkeys(old + named))

    def packs_holding(self, oid: str) -> list[str]:
        """The sound pack ``oid`` was found in (read or written by this instance), if any."""
        found = self._found_in.get(oid)
        return [found] if found is not None and found not in self._damaged_packs else []

    def pack_damaged(self, pack_oid: str) -> bool:
        """Whether this instance found pack ``pack_oid`` damaged (its bytes no longer hash to
        its id; the members that still match theirs were used)."""
        return pack_oid in self._damaged_packs

    def damaged_packs(self) -> dict[str, bytes]:
        """The packs this instance found damaged in this run, with the bytes it read (what
        :func:`evalsnap.records.pack.repair` rebuilds them from)."""
        return dict(self._damaged_packs)

    def in_damaged_pack(self, oid: str) -> bool:
        """Whether ``oid`` was read from a damaged pack (a new record must not name that
        pack: the object needs a sound copy of its own)."""
        return self._found_in.get(oid) in self._damaged_packs

    def hold_members(self, pack_oid: str, members: Mapping[tuple[str, str], bytes], *,
                     checked: bool = False, spare: bool = False) -> None:
        """Pack ``pack_oid`` is in the store and holds ``members`` ((kind, oid) → bytes,
        each hashing to its oid). Units and judge entries (:data:`PACKED_KINDS`, whose pack
        may be their only copy) are then read from memory while the read cache keeps them,
        else from the pack; a member of another kind is a copy of a loose object, kept as
        :meth:`remember` keeps it (handed out once the loose object is proved). ``checked``:
        each member was hashed already (by the pack reader, or the writer). ``spare``: the
        members are kept in the read cache only where it has room (they are read later, if at
        all, from the pack again: a large run's packs, read whole, would only push each
        other out)."""
        for (kind, oid), data in members.items():
            if not checked and oid_of(data) != oid:
                continue
            if kind in PACKED_KINDS:
                self._cache.put(object_rel(validate_kind(kind), oid), data, spare=spare)
                self._found_in[oid] = pack_oid
            elif self._in_run:
                self._cache.put(object_rel(validate_kind(kind), oid), data, spare=spare)
        self._opened.add(pack_oid)

    def open_packs(self, pack_oids: Iterable[str], *, spare: bool = False
                   ) -> dict[str, Mapping[tuple[str, str], bytes] | Exception]:
        """Reads packs (one concurrent batch) and returns each one's members, each checked
        against its own oid (or why the pack cannot be used: missing, not a pack; the objects
        it would hold are then looked for elsewhere). A pack whose bytes no longer hash to
        its id is damaged, and its members that still match their ids are used (logged;
        ``verify`` reports the pack): damage costs what it touched, not the whole pack. The
        members become readable as objects (:meth:`hold_members`, ``spare`` as it says);
        the packs' bytes are not kept."""
        out: dict[str, Mapping[tuple[str, str], bytes] | Exception] = {}
        todo = [oid for oid in dict.fromkeys(pack_oids)]
        if not todo:
            return out
        self._ensure_ready()
        rels = {oid: object_rel(PACK_KIND, oid) for oid in todo}
        raw = self._b.read_many(f"reading {len(todo)} packs from {self.url}",
                                [self._path(rel) for rel in rels.values()],
                                limit=MAX_OBJECT_BYTES)
        for pack_oid, rel in rels.items():
            got = raw.pop(self._path(rel))  # each pack's bytes let go once it is read
            # opened (self._opened) once its members are held: a reader in another thread
            # that finds it opened must find what it holds
            if isinstance(got, BaseException) or got is None or _too_long(got, MAX_OBJECT_BYTES):
                problem: Exception = got if isinstance(got, Exception) else \
                    TooLarge(self._url(rel), MAX_OBJECT_BYTES) if got is not None \
                    else ObjectNotFound(self._url(rel))
                logger.warning("pack %s unusable (%s); what it holds is looked for elsewhere",
                               pack_oid, problem)
                self._opened.add(pack_oid)
                out[pack_oid] = problem
                continue
            if (actual := oid_of(got)) != pack_oid:
                self._damaged_packs[pack_oid] = got
                logger.warning("pack %s is damaged (its bytes hash to %s); its members that "
                               "still match their ids are used, the others computed again "
                               "(run `evalsnap verify`)", self._url(rel), actual)
            if _unpacker is None:
                out[pack_oid] = StorageError(f"pack {pack_oid}: no pack reader is set "
                                             "(storage.store.set_unpacker)")
                self._opened.add(pack_oid)
                continue
            try:
                members = _unpacker(got, pack_oid)
            except Exception as exc:  # not a pack: as if absent (logged, verify reports it)
                logger.warning("%s", exc)
                self._opened.add(pack_oid)
                out[pack_oid] = exc
                continue
            self.hold_members(pack_oid, members, checked=True,  # the unpacker checked each
                              spare=spare)
            out[pack_oid] = members
        return out

    def _from_packs(self, kind: str, todo: dict[str, str],
                    out: dict[str, bytes | Exception]) -> None:
        """Serves what it can of ``todo`` (oid → rel) from packs, each pack opened at most
        once per call (again only if the read cache let go of what it held)."""
        tried: set[str] = set()
        while todo:
            need: dict[str, None] = {}
            for oid, rel in list(todo.items()):
                data = self._cache.get(rel) if oid in self._found_in else None
                if data is not None:
                    out[oid] = data
                    del todo[oid]
                    continue
                found = self._found_in.get(oid)
                for p in ((found,) if found is not None else self._holders.get(oid, ())):
                    if p not in tried and (found is not None or p not in self._opened):
                        need[p] = None
            if not need:
                return
            batch = list(need)[:PACK_OPEN_BATCH]
            tried.update(batch)
            with self._pack_gate:  # one reader opens a pack while the others wait for it
                if any(self._wanted_from(p, todo) for p in batch):
                    self.open_packs(batch)

    def _wanted_from(self, pack_oid: str, todo: dict[str, str]) -> bool:
        """Whether ``pack_oid`` must still be opened for ``todo`` (another thread may have
        opened it while this one waited)."""
        for oid, rel in todo.items():
            found = self._found_in.get(oid)
            if found == pack_oid and not self._cache.holds(rel):
                return True
            if found is None and pack_oid in self._holders.get(oid, ()) \
                    and pack_oid not in self._opened:
                return True
        return False

    def _checked(self, rel: str, oid: str, data: bytes | None) -> bytes:
        if data is None:
            self._forget(rel)
            self._bucket_still_there(f"reading {self._url(rel)}")
            raise ObjectNotFound(self._url(rel))
        actual = oid_of(data)
        if actual != oid:
            self._forget(rel)
            raise CorruptObjectError(self._url(rel), oid, actual)
        self._learn(rel, data)
        return data

    def remember(self, kind: str, oid: str, data: bytes) -> bool:
        """Keep ``data`` (e.g. a pack member) as what object ``oid`` should hold, if it hashes
        to ``oid``. It is handed out only once the store proved the object is there
        (:meth:`prove_objects`), never on its own word."""
        if oid_of(data) != oid or not self._in_run:
            return False
        self._cache.put(object_rel(validate_kind(kind), oid), data)
        return True

    def written_elsewhere(self, kind: str, oid: str, data: bytes, *, spare: bool = False
                          ) -> None:
        """``data`` is object ``oid`` as another process of this run wrote it moments ago (a
        scoring process's pack): known to be in the store, as if this instance wrote it
        (its bytes kept only where the read cache has room, if ``spare``)."""
        rel = object_rel(validate_kind(kind), oid)  # one string for both maps, not two
        if self._in_run and oid_of(data) == oid:
            self._cache.put(rel, data, spare=spare)
            self._learn(rel)

    def let_go(self, kind: str, oid: str) -> None:
        """Drop the bytes of ``oid`` from the read cache (it stays known to be in the store):
        for an object read once for what it holds, as a pack whose members are kept."""
        self._cache.drop(object_rel(validate_kind(kind), oid))

    def remembered(self, kind: str, oid: str) -> bytes | None:
        """What :meth:`remember` kept for ``oid`` (or a verified read), unproved."""
        return self._cache.get(object_rel(validate_kind(kind), oid))

    # -- proofs without downloads -----------------------------------------------------------

    def prove_objects(self, kind: str, contents: Mapping[str, bytes]) -> set[str]:
        """The oids of ``contents`` (oid → bytes known from elsewhere, e.g. a pack) whose
        object the store holds intact: a unit or judge entry that a pack this instance read
        holds (its only copy); else on a bucket, proved by one listing of the kind (its
        MD5s, 1,000 objects a request) instead of one download each; where a listing proves
        nothing (local disk, memory, multipart uploads), by reading the object."""
        kind = validate_kind(kind)
        proved: set[str] = set()
        unproved: list[str] = []
        for oid, data in contents.items():
            rel = object_rel(kind, oid)
            if oid_of(data) != oid:
                continue
            if oid in self._found_in and kind in PACKED_KINDS:
                proved.add(oid)  # a pack read (or written) by this instance holds it, whole
            elif rel in self._known or self._proved(rel, data,
                                                    area=f"{LAYOUT_VERSION}/objects/{kind}"):
                proved.add(oid)
                self._learn(rel, data)
            else:
                unproved.append(oid)
        if unproved and not self._listed_md5(f"{LAYOUT_VERSION}/objects/{kind}"):
            for oid, got in self.get_objects(kind, unproved).items():
                if isinstance(got, bytes):
                    proved.add(oid)
        return proved

    def prove_refs(self, namespace: str, contents: Mapping[str, bytes]) -> set[str]:
        """The names of ``contents`` (name → the bytes expected) whose ref holds exactly
        those bytes: on a bucket by one listing of the namespace; elsewhere by reading."""
        area = ref_rel(namespace, None)
        proved = {name for name, data in contents.items()
                  if self._proved(ref_rel(namespace, name), data, area=area)}
        if not self._listed_md5(area):
            got = self.get_refs(namespace, [name for name in contents if name not in proved])
            proved |= {n for n, data in got.items() if data == contents[n]}
        return proved

    def _proved(self, rel: str, data: bytes, area: str | None = None) -> bool:
        """Whether a listing taken in this run shows ``rel`` holding exactly ``data``
        (``area``: take that listing now if it was not taken yet)."""
        if not self._b.is_object_store or not self._in_run:
            return False
        if area is not None and area not in self._listings:
            self._list_area(area)
        info = next((listing.get(rel) for base, listing in self._listings.items()
                     if rel.startswith(base + "/")), None)
        return (info is not None and info.md5 is not None and info.size == len(data)
                and info.md5 == hashlib.md5(data, usedforsecurity=False).hexdigest())

    def _listed_md5(self, area: str) -> bool:
        return self._b.is_object_store and self._in_run and area in self._listings

    def _list_area(self, area: str) -> None:
        self._ensure_ready()
        base = self._path(area)
        found = self._b.listing(f"listing {self._url(area)}", base)
        prefix = f"{self._b.root}/"
        self._listings[area] = {path[len(prefix):]: info for path, info in found.items()
                                if path.startswith(prefix)}

    def has_object(self, kind: str, oid: str) -> bool:
        rel = object_rel(validate_kind(kind), oid)
        self._ensure_ready()
        try:
            info = self._b.call(f"looking up {self._url(rel)}", "info", self._path(rel))
        except FileNotFoundError:
            return False
        return bool(info.get("type") == "file")

    def iter_objects(self, kind: str) -> Iterator[str]:
        """The oids stored under ``kind``, sorted. The listing is taken when called."""
        entries, _ = self._scan(validate_kind(kind))
        return iter([oid for oid, _ in entries])

    def object_url(self, kind: str, oid: str) -> str:
        return self._url(object_rel(validate_kind(kind), oid))

    # -- mutable refs ---------------------------------------------------------------------

    def put_ref(self, namespace: str, name: str, data: bytes | Iterable[bytes], *,
                commit: bool = False, content_type: str | None = None) -> None:
        """Replace the ref ``namespace/name`` with ``data`` in one atomic write. ``data``
        may be its parts one after another (a page as it is rendered): a local store writes
        them as they come, a bucket gets them whole in one request.

        ``commit=True`` (a run manifest) first makes every deferred write durable, then
        this ref: whatever a durable commit points at is durable too. ``content_type``: the
        object's ``Content-Type`` on a bucket (an HTML page opens in a browser instead of
        downloading as ``binary/octet-stream``); a local file has none.
        """
        rel = ref_rel(namespace, name)
        data = _bytes_or_parts(data)
        self._ensure_ready()
        if commit:
            self.flush()
        self._write_whole(rel, data, f"writing {self._url(rel)}", durable=commit,
                          content_type=content_type)

    # -- the browsable site (v1/site/) ------------------------------------------------------

    def put_site(self, pages: Mapping[str, bytes | Iterable[bytes]], content_type: str) -> None:
        """Replace the files ``pages`` names (paths relative to ``v1/site/``, each segment a
        safe id) with their bytes (or their parts, as :meth:`put_ref` takes them), typed
        ``content_type``: one concurrent batch on a bucket. A static site for browsers, not
        data: nothing in evalsnap reads it back."""
        items = {site_rel(path): _bytes_or_parts(data) for path, data in pages.items()}
        self._ensure_ready()
        if not self._b.is_object_store:
            for rel, data in items.items():
                self._write_whole(rel, data, f"writing {self._url(rel)}")
            return
        self._b.write_many(f"writing {len(items)} pages of the site to {self._url(SITE)}",
                           {self._path(rel): _whole(data) for rel, data in items.items()},
                           create=False, content_type=content_type)

    def delete_site(self, directory: str) -> int:
        """Remove the pages under ``directory`` of the site (relative to ``v1/site/``; e.g. a
        run's pages once gc removed the run). Returns how many files were removed."""
        rel = site_rel(directory)
        self._ensure_ready()
        try:
            found = self._b.call(f"listing {self._url(rel)}", "find", self._path(rel), long=True)
        except FileNotFoundError:
            return 0
        paths = sorted(found if isinstance(found, list) else found.keys())
        for path in paths:
            try:
                self._b.call(f"deleting {self._url_of(path)}", "rm_file", path)
            except FileNotFoundError:
                pass
        return len(paths)

    def site_link(self, path: str, *, public_url: str | None = None) -> str:
        """Where a browser opens a page of the site: ``public_url`` + its path, a local
        ``file://`` URL, else the store URL (a bucket's site wants a public URL: a signed
        link would not carry over to the pages it links to)."""
        rel = site_rel(path)
        if public_url:
            return f"{public_url.rstrip('/')}/{rel}"
        if self._b.protocol == "file":
            return Path(self._path(rel)).as_uri()
        return self._url(rel)

    def ref_link(self, namespace: str, name: str, *, public_url: str | None = None,
                 expires: int = 7 * 24 * 3600) -> tuple[str, int | None]:
        """A URL a browser opens for the ref, and for how many seconds (None: no expiry).

        ``public_url``: the HTTP base the store is served at (a bucket website, a CDN,
        ``https://storage.googleapis.com/<bucket>/<prefix>``): that base + the ref's path.
        Else a local store's ``file://`` URL; else a URL the backend signs (s3fs, gcsfs with
        signing credentials) valid ``expires`` seconds; else the store URL itself (a
        ``s3://``/``gs://`` URL a browser cannot open: set a public URL)."""
        rel = ref_rel(namespace, name)
        if public_url:
            return f"{public_url.rstrip('/')}/{rel}", None
        if self._b.protocol == "file":
            return Path(self._path(rel)).as_uri(), None
        try:
            signed = self._b.fs.sign(self._path(rel), expiration=expires)
        except Exception as exc:  # noqa: BLE001 - no signing credentials (or no support)
            logger.info("cannot sign a URL for %s (%s): links name the store URL",
                        self._url(rel), exc)
            return self._url(rel), None
        return str(signed), expires

    def put_refs(self, namespace: str, items: Mapping[str, bytes]) -> None:
        """:meth:`put_ref` for many refs of one namespace: one concurrent batch on a bucket."""
        if not self._b.is_object_store:
            for name, data in items.items():
                self.put_ref(namespace, name, data)
            return
        self._ensure_ready()
        self._b.write_many(f"writing {len(items)} refs of {namespace} to {self.url}",
                           {self._path(ref_rel(namespace, n)): as_bytes(d)
                            for n, d in items.items()}, create=False)

    def get_ref(self, namespace: str, name: str) -> bytes | None:
        """The ref's bytes, or ``None`` if it does not exist."""
        rel = ref_rel(namespace, name)
        self._ensure_ready()
        return self._read(rel, f"reading {self._url(rel)}", long=True, limit=MAX_REF_BYTES)

    def get_refs(self, namespace: str, names: Iterable[str]
                 ) -> dict[str, bytes | None | TooLarge]:
        """:meth:`get_ref` for many refs of one namespace: one concurrent batch on a bucket
        (per name its bytes, ``None`` if it does not exist, or the ``TooLarge`` error
        :meth:`get_ref` would raise)."""
        rels = {name: ref_rel(namespace, name) for name in dict.fromkeys(names)}
        if not rels:
            return {}
        self._ensure_ready()
        got = self._b.read_many(f"reading {len(rels)} refs of {namespace} from {self.url}",
                                [self._path(rel) for rel in rels.values()], limit=MAX_REF_BYTES)
        out: dict[str, bytes | None | TooLarge] = {}
        for name, rel in rels.items():
            data = got[self._path(rel)]
            out[name] = TooLarge(self._url(rel), MAX_REF_BYTES) \
                if _too_long(data, MAX_REF_BYTES) else data
        return out

    def list_refs_dated(self, namespace: str) -> list[tuple[str, float]]:
        """(name, when the store last wrote it: seconds since the epoch) of every ref directly
        under ``namespace``: the store's own clock (S3 ``LastModified``, GCS ``updated``, file
        mtime), not what a file claims of itself."""
        return self._names_in(ref_rel(namespace, None), dated=True)  # type: ignore[return-value]

    def list_refs(self, namespace: str) -> list[str]:
        """Names of the refs directly under ``namespace`` (not in sub-namespaces), sorted."""
        return self._names_in(ref_rel(namespace, None))  # type: ignore[return-value]

    def _names_in(self, rel: str, dated: bool = False) -> list[str] | list[tuple[str, float]]:
        self._ensure_ready()
        folder = self._path(rel)
        try:
            entries = self._b.call(
                f"listing {self._url(rel)}", "ls", folder, detail=True, long=True
            )
        except FileNotFoundError:
            return []
        names = []
        for entry in entries:
            parent, _, base = str(entry["name"]).rstrip("/").rpartition("/")
            if (
                entry.get("type") == "file"
                and parent == folder
                and len(base) <= MAX_ID_LENGTH
                and ID_PATTERN.match(base)  # skips temporary files, which start with a dot
            ):
                names.append((base, _mtime(entry)) if dated else base)
        return sorted(names)  # type: ignore[type-var,return-value]

    def delete_ref(self, namespace: str, name: str) -> None:
        """Remove a ref; removing a missing ref is a no-op."""
        rel = ref_rel(namespace, name)
        self._ensure_ready()
        try:
            self._b.call(f"deleting {self._url(rel)}", "rm_file", self._path(rel))
        except FileNotFoundError:
            pass

    # -- integration and audit ------------------------------------------------------------

    def prefect_storage_basepath(self) -> str:
        """Base path for Prefect's LocalFileSystem / RemoteFileSystem result storage."""
        return self._url(f"{LAYOUT_VERSION}/prefect")

    def put_task_result(self, name: str, data: bytes) -> None:
        """Replace Prefect's cached task result ``v1/prefect/<name>`` in one write (with
        the store's deadlines, as every other call)."""
        rel = f"{LAYOUT_VERSION}/prefect/{validate_id(name, 'task result name')}"
        self._ensure_ready()
        self._write_whole(rel, as_bytes(data), f"writing {self._url(rel)}")
        if self._in_run:
            self._task_results().put(name, as_bytes(data))

    def get_task_result(self, name: str) -> bytes | None:
        """The bytes of ``v1/prefect/<name>``, or ``None`` if there are none."""
        rel = f"{LAYOUT_VERSION}/prefect/{validate_id(name, 'task result name')}"
        memo = self._task_results() if self._in_run else None
        known = memo.get(name) if memo is not None else None
        if known is not None:  # Prefect reads a cache hit twice; the store is asked once a run
            return known
        self._ensure_ready()
        data = self._read(rel, f"reading {self._url(rel)}", limit=MAX_REF_BYTES)
        if memo is not None and data is not None:
            memo.put(name, data)
        return data

    def _task_results(self) -> SlabLRU:
        """Task results this run wrote or read, the most recent :data:`TASK_RESULTS_BYTES`
        (every one of a 6,000-case run's was 13 MB kept to its end; memray)."""
        memo = self.run_memo.get("task results")
        if not isinstance(memo, SlabLRU):
            memo = self.run_memo.setdefault("task results", SlabLRU(TASK_RESULTS_BYTES))
        return memo  # type: ignore[no-any-return]

    def list_task_results(self) -> list[str]:
        """Names of Prefect's cached task results (``v1/prefect/<name>``), sorted."""
        return self._names_in(f"{LAYOUT_VERSION}/prefect")  # type: ignore[return-value]

    def verify(self) -> list[Problem]:
        """Re-hash every object; report corrupt, unreadable and stray files."""
        problems: list[Problem] = []
        for kind in OBJECT_KINDS:
            entries, strays = self._scan(kind)
            problems.extend(
                Problem(
                    self._url_of(path),
                    kind,
                    "unexpected file in the object area (a temporary file left by an "
                    "interrupted write, or a foreign file); delete it once no write is running",
                )
                for path in strays
            )
            for start in range(0, len(entries), _VERIFY_BATCH):
                batch = entries[start : start + _VERIFY_BATCH]
                contents = self._read_many([path for _, path in batch])
                for oid, path in batch:
                    problem = check_content(oid, contents[path])
                    if problem:
                        self._forget(object_rel(kind, oid))
                        problems.append(Problem(self._url_of(path), kind, problem))
        return problems

    # -- internals ------------------------------------------------------------------------

    def _path(self, rel: str) -> str:
        return f"{self._b.root}/{rel}"

    def _url(self, rel: str) -> str:
        return f"{self.url.rstrip('/')}/{rel}"

    def _url_of(self, path: str) -> str:
        prefix = f"{self._b.root}/"
        return self._url(path[len(prefix) :]) if path.startswith(prefix) else path

    def _ensure_ready(self) -> None:
        """Probe once per instance, so that a missing bucket is not mistaken for an empty
        store (object stores answer "not found" for both)."""
        if self._ready:
            return
        with self._lock:
            if not self._ready:
                self._probe()
                self._ready = True

    def _bucket_still_there(self, what: str) -> None:
        """A missing object in a bucket that is gone is a missing bucket (deleted since the
        store was opened), not a missing object: raises ``StoreUnavailable`` saying so."""
        if not self._b.is_object_store:
            return
        try:
            self._b.call(f"looking up bucket {self._b.bucket!r}", "info", self._b.bucket,
                         passthrough=(FileNotFoundError, PermissionError))
        except FileNotFoundError as exc:
            raise self._b.missing_bucket(what) from exc
        except PermissionError:
            pass  # cannot tell: the object is what is missing

    def _probe(self) -> None:
        if self._b.protocol == "file":
            if os.path.exists(self._b.root) and not os.path.isdir(self._b.root):
                raise StoreUnavailable(
                    self.url, "it is a file, not a directory; choose another store path"
                )
            return
        if not self._b.is_object_store:
            return
        self._b.refuse_dead_endpoint()
        what = f"looking up bucket {self._b.bucket!r}"
        try:
            self._b.call(
                what, "info", self._b.bucket, passthrough=(FileNotFoundError, PermissionError)
            )
        except FileNotFoundError as exc:
            raise self._b.missing_bucket(what) from exc
        except PermissionError:
            pass  # may use objects without reading bucket metadata; real calls will tell

    def _local(self, write: Callable[..., Any], rel: str, data: bytes | Iterable[bytes],
               what: str, durable: bool = False) -> Any:
        """Runs a local ``write`` (see :mod:`storage._local`) and returns what it returns."""
        sync = durable or self._durability == "each"
        self._b.requests.add("put")
        with self._b.failures(what):
            result = write(self._path(rel), data, sync=sync, root=self._b.root)
        if not sync:
            # also when the file was there already: its writer may not have flushed it yet
            self._deferred(self._path(rel))
        return result

    def _write_whole(self, rel: str, data: bytes | Iterable[bytes], what: str,
                     durable: bool = False, content_type: str | None = None) -> None:
        """Replace a mutable file in one atomic step (``data``: its bytes, or its parts,
        written as they come on local disk)."""
        if self._b.protocol == "file":
            self._local(_local.write_replace, rel, data, what, durable)
            return
        data = _whole(data)
        typed: dict[str, Any] = self._b.typed(content_type)
        try:
            self._b.call(what, "pipe_file", self._path(rel), data, nbytes=len(data), **typed)
        except FileNotFoundError as exc:
            raise self._b.missing_bucket(what) from exc

    def _read(self, rel: str, what: str, long: bool = False, limit: int | None = None
              ) -> bytes | None:
        """One GET (never a HEAD first); with ``limit``, at most ``limit + 1`` bytes."""
        if limit is not None:
            data = self._b.read_many(what, [self._path(rel)], limit=limit)[self._path(rel)]
            if _too_long(data, limit):
                raise TooLarge(self._url(rel), limit)
            return data
        try:
            data = self._b.call(what, "cat_file", self._path(rel), long=long)
        except (FileNotFoundError, IsADirectoryError):
            return None
        return bytes(data)

    def _scan(self, kind: str) -> tuple[list[tuple[str, str]], list[str]]:
        """(oid, path) of every well-named object of ``kind``, and every other file there."""
        self._ensure_ready()
        base = self._path(f"{LAYOUT_VERSION}/objects/{kind}")
        try:
            found = self._b.call(f"listing {self._url_of(base)}", "find", base, long=True)
        except FileNotFoundError:
            return [], []
        entries: list[tuple[str, str]] = []
        strays: list[str] = []
        for path in sorted(str(p) for p in found):
            oid = oid_from_rel(path[len(base) + 1 :]) if path.startswith(base + "/") else None
            if oid:
                entries.append((oid, path))
            else:
                strays.append(path)
        return entries, strays

    def _read_many(self, paths: list[str]) -> dict[str, bytes | BaseException]:
        """Read a batch concurrently where the backend can (fsspec ``cat`` on a list)."""
        raw = self._b.call("reading objects", "cat", paths, on_error="return", long=True)
        out: dict[str, bytes | BaseException] = {}
        for path in paths:
            value = raw.get(path) if isinstance(raw, dict) else None
            if value is None:  # key spelled differently by the backend: read it alone
                try:
                    value = self._b.call("reading objects", "cat_file", path, long=True)
                except (FileNotFoundError, StoreUnavailable) as exc:
                    value = exc
            out[path] = value
        return out


def _too_long(data: bytes | None, limit: int) -> bool:
    return data is not None and (data is OVERSIZE or len(data) > limit)


def _mtime(entry: Mapping[str, Any]) -> float:
    """When the store last wrote a listed file (seconds since the epoch; 0 if unknown)."""
    for key in ("LastModified", "updated", "mtime", "created"):
        value = entry.get(key)
        if isinstance(value, int | float):
            return float(value)
        if value is not None and hasattr(value, "timestamp"):
            return float(value.timestamp())
        if isinstance(value, str):
            from datetime import datetime

            try:
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return 0.0


def _rebuild(url: str, options: dict[str, str], timeout: float,
             durability: str = "each") -> Store:
    return Store(url, options, timeout=timeout, durability=durability)


def _bytes_or_parts(data: bytes | Iterable[bytes]) -> bytes | Iterable[bytes]:
    """``data`` as bytes (:func:`as_bytes`), or its parts as they are (an iterator of bytes,
    not a str: a str is refused as :func:`as_bytes` refuses it)."""
    if isinstance(data, bytes | bytearray | memoryview | str):
        return as_bytes(data)  # type: ignore[arg-type]
    return data


def _whole(data: bytes | Iterable[bytes]) -> bytes:
    return data if isinstance(data, bytes) else b"".join(as_bytes(part) for part in data)
