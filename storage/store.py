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

import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from storage import _local
from storage._backend import open_backend
from storage._layout import (
    LAYOUT_VERSION,
    MARKER,
    as_bytes,
    check_content,
    object_rel,
    oid_from_rel,
    ref_rel,
)
from storage.errors import CorruptObjectError, ObjectNotFound, StoreUnavailable
from storage.ids import ID_PATTERN, MAX_ID_LENGTH, OBJECT_KINDS, oid_of, validate_id, validate_kind

__all__ = ["LAYOUT_VERSION", "Problem", "Store"]

logger = logging.getLogger(__name__)

_VERIFY_BATCH = 64


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
        self.url = self._b.url

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
        if not created:
            self._repair_if_damaged(rel, data, oid, what)
        return oid

    def _repair_if_damaged(self, rel: str, data: bytes, oid: str, what: str) -> None:
        """An existing object with other bytes is damage: replace it whole with the good bytes.

        Without this a damaged object would stay forever, since every later write of the
        same content is a no-op. Identical bytes (the normal case) are left alone.
        """
        existing = self._read(rel, f"checking {self._url(rel)}", long=True)
        if existing is not None and oid_of(existing) == oid:
            return
        logger.warning("repairing damaged object %s", self._url(rel))
        self._write_whole(rel, data, what)

    def get_object(self, kind: str, oid: str) -> bytes:
        """The bytes of an object, verified against ``oid``."""
        rel = object_rel(validate_kind(kind), oid)
        self._ensure_ready()
        data = self._read(rel, f"reading {self._url(rel)}", long=True)
        if data is None:
            self._bucket_still_there(f"reading {self._url(rel)}")
            raise ObjectNotFound(self._url(rel))
        actual = oid_of(data)
        if actual != oid:
            raise CorruptObjectError(self._url(rel), oid, actual)
        return data

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

    def put_ref(self, namespace: str, name: str, data: bytes, *, commit: bool = False) -> None:
        """Replace the ref ``namespace/name`` with ``data`` in one atomic write.

        ``commit=True`` (a run manifest) first makes every deferred write durable, then
        this ref: whatever a durable commit points at is durable too.
        """
        rel = ref_rel(namespace, name)
        data = as_bytes(data)
        self._ensure_ready()
        if commit:
            self.flush()
        self._write_whole(rel, data, f"writing {self._url(rel)}", durable=commit)

    def get_ref(self, namespace: str, name: str) -> bytes | None:
        """The ref's bytes, or ``None`` if it does not exist."""
        rel = ref_rel(namespace, name)
        self._ensure_ready()
        return self._read(rel, f"reading {self._url(rel)}", long=True)

    def list_refs(self, namespace: str) -> list[str]:
        """Names of the refs directly under ``namespace`` (not in sub-namespaces), sorted."""
        return self._names_in(ref_rel(namespace, None))

    def _names_in(self, rel: str) -> list[str]:
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
                names.append(base)
        return sorted(names)

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

    def get_task_result(self, name: str) -> bytes | None:
        """The bytes of ``v1/prefect/<name>``, or ``None`` if there are none."""
        rel = f"{LAYOUT_VERSION}/prefect/{validate_id(name, 'task result name')}"
        self._ensure_ready()
        return self._read(rel, f"reading {self._url(rel)}")

    def list_task_results(self) -> list[str]:
        """Names of Prefect's cached task results (``v1/prefect/<name>``), sorted."""
        return self._names_in(f"{LAYOUT_VERSION}/prefect")

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
        what = f"looking up bucket {self._b.bucket!r}"
        try:
            self._b.call(
                what, "info", self._b.bucket, passthrough=(FileNotFoundError, PermissionError)
            )
        except FileNotFoundError as exc:
            raise self._b.missing_bucket(what) from exc
        except PermissionError:
            pass  # may use objects without reading bucket metadata; real calls will tell

    def _local(self, write: Callable[..., Any], rel: str, data: bytes, what: str,
               durable: bool = False) -> Any:
        """Runs a local ``write`` (see :mod:`storage._local`) and returns what it returns."""
        sync = durable or self._durability == "each"
        with self._b.failures(what):
            result = write(self._path(rel), data, sync=sync)
        if not sync:
            # also when the file was there already: its writer may not have flushed it yet
            self._deferred(self._path(rel))
        return result

    def _write_whole(self, rel: str, data: bytes, what: str, durable: bool = False) -> None:
        """Replace a mutable file in one atomic step."""
        if self._b.protocol == "file":
            self._local(_local.write_replace, rel, data, what, durable)
            return
        try:
            self._b.call(what, "pipe_file", self._path(rel), data, nbytes=len(data))
        except FileNotFoundError as exc:
            raise self._b.missing_bucket(what) from exc

    def _read(self, rel: str, what: str, long: bool = False) -> bytes | None:
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


def _rebuild(url: str, options: dict[str, str], timeout: float,
             durability: str = "each") -> Store:
    return Store(url, options, timeout=timeout, durability=durability)
