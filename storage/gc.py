"""The storage half of ``evalsnap gc``: every file of a store area with its size and age,
and deletion, each call under the store's deadlines (:meth:`storage._backend.Backend.call`).

What may be deleted is decided above this layer (:mod:`evalsnap.records.gc`); here a file
is only a path relative to the store root (``v1/objects/unit/ab/cd…``), a size and the
time the backend last wrote it (local: ``mtime``; S3: ``LastModified``; GCS: ``updated``;
memory: ``created``), in seconds since the epoch on the store's clock.

Local stores are listed without following symbolic links, and one below the store root is
refused (``StoreUnavailable`` naming it): gc never deletes outside the store
(:func:`storage._local.confine`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from storage import _local
from storage._layout import LAYOUT_VERSION
from storage.store import Store

__all__ = ["StoredFile", "delete_files", "freshens_rewrites", "list_files", "marker_written_at"]

_WORKERS = 8


@dataclass(frozen=True)
class StoredFile:
    """One file of the store."""

    rel: str
    """Path relative to the store root, e.g. ``v1/refs/runs/<run_id>``."""
    size: int
    modified: float | None
    """When the backend last wrote it (epoch seconds); None if the backend does not say."""


def _modified(info: dict[str, Any]) -> float | None:
    """The write time in an fsspec info dict, whichever backend spelt it."""
    for key in ("mtime", "LastModified", "updated", "created"):
        value = info.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, dt.datetime):
            return (value if value.tzinfo else value.replace(tzinfo=dt.UTC)).timestamp()
        if isinstance(value, str) and value:
            try:
                parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError:
                continue
            return (parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)).timestamp()
    return None


def list_files(store: Store, area: str) -> list[StoredFile]:
    """Every file under ``area`` (relative to the store root, e.g. ``v1/objects``), sorted;
    the listing is taken when called (no listings cache)."""
    store._ensure_ready()
    if store._b.protocol == "file":
        with store._b.failures(f"listing {store._url(area)}"):
            return [StoredFile(rel, size, mtime)
                    for rel, size, mtime in _local.list_tree(store._b.root, area.strip("/"))]
    base = store._path(area.strip("/"))
    root = f"{store._b.root}/"
    try:
        found = store._b.call(f"listing {store._url(area)}", "find", base, detail=True,
                              long=True)
    except FileNotFoundError:
        return []
    out = []
    for path, info in sorted(found.items()):
        path = str(path).rstrip("/")
        if info.get("type", "file") != "file" or not path.startswith(root):
            continue
        out.append(StoredFile(path[len(root):], int(info.get("size") or 0), _modified(info)))
    return out


def marker_written_at(store: Store) -> float | None:
    """When ``v1/STORE`` was last written: every command that writes rewrites it before it
    starts its work (:meth:`Store.check`), so this is when the latest writer started."""
    rel = f"{LAYOUT_VERSION}/STORE"
    store._ensure_ready()
    try:
        info = store._b.call(f"looking up {store._url(rel)}", "info", store._path(rel))
    except FileNotFoundError:
        return None
    return _modified(info)


def freshens_rewrites(store: Store) -> bool:
    """Whether writing an object that exists refreshes its write time, and deletion checks
    it (local disk: :func:`storage._local.write_once`, :func:`storage._local.remove`)."""
    return store._b.protocol == "file"


def delete_files(store: Store, files: Iterable[StoredFile], *, unless_freshened: bool = False
                 ) -> list[StoredFile]:
    """Deletes each file (a missing one is not an error: another gc may have been first) and
    returns those deleted. ``unless_freshened`` (write-once objects): on local disk a file
    rewritten since it was listed is left (:func:`storage._local.remove`). A failure raises
    ``StoreUnavailable`` naming the file; a local path through a symbolic link is refused."""
    store._ensure_ready()
    local = store._b.protocol == "file"

    def remove(f: StoredFile) -> bool:
        what = f"deleting {store._url(f.rel)}"
        if local:
            with store._b.failures(what):
                return _local.remove(store._b.root, store._path(f.rel),
                                     listed_mtime=f.modified if unless_freshened else None)
        try:
            store._b.call(what, "rm_file", store._path(f.rel))
        except FileNotFoundError:
            pass
        return True

    batch = list(files)
    with ThreadPoolExecutor(max_workers=_WORKERS) as pool:
        done = list(pool.map(remove, batch))
    return [f for f, deleted in zip(batch, done, strict=True) if deleted]
