"""Score units and judge ledger entries in a store's packs, for tests that read or damage one.

A scoring task writes its units and ledger entries only as packs (``evalsnap.records.pack``):
``v1/objects/pack/<hex[:2]>/<hex[2:]>``, strict JSON ``{"schema", "members": [{"kind",
"oid", "text"}]}``. These helpers find a member by its id in whatever pack holds it, and
change a pack's file in place as damage would (the pack then no longer hashes to its name;
its other members still match their ids and stay usable).

``files`` is anything with ``files(rel)``, ``read(rel)``, ``write(rel, data)`` (store-relative
paths): ``tests.test_reuse_rules.StoreFiles`` on local disk or in a bucket, or :class:`Local`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Protocol

PACKS = "v1/objects/pack"


class Files(Protocol):
    def files(self, rel: str) -> list[str]: ...
    def read(self, rel: str) -> bytes: ...
    def write(self, rel: str, data: bytes) -> None: ...


class Local:
    """A local store's files by store-relative path."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def files(self, rel: str) -> list[str]:
        base = self.root / rel
        return sorted(str(p.relative_to(self.root)) for p in base.rglob("*") if p.is_file()) \
            if base.is_dir() else []

    def read(self, rel: str) -> bytes:
        return (self.root / rel).read_bytes()

    def write(self, rel: str, data: bytes) -> None:
        (self.root / rel).write_bytes(data)


def _packs(files: Files) -> list[tuple[str, dict[str, Any]]]:
    return [(rel, json.loads(files.read(rel))) for rel in files.files(PACKS)
            if not rel.rsplit("/", 1)[-1].startswith(".")]


def pack_of(files: Files, kind: str, oid: str) -> str:
    """The store-relative path of the pack holding ``kind`` object ``oid``."""
    for rel, body in _packs(files):
        if any(m["kind"] == kind and m["oid"] == oid for m in body["members"]):
            return rel
    raise AssertionError(f"expected a pack to hold {kind} {oid}")


def member(files: Files, kind: str, oid: str) -> bytes:
    """The bytes of ``kind`` object ``oid`` as its pack holds them."""
    for _, body in _packs(files):
        for m in body["members"]:
            if m["kind"] == kind and m["oid"] == oid:
                data: bytes = m["text"].encode()
                assert "sha256:" + hashlib.sha256(data).hexdigest() == oid
                return data
    raise AssertionError(f"expected a pack to hold {kind} {oid}")


def _rewrite(files: Files, kind: str, oid: str, change: Any) -> None:
    rel = pack_of(files, kind, oid)
    body = json.loads(files.read(rel))
    members = []
    for m in body["members"]:
        if m["kind"] == kind and m["oid"] == oid:
            m = change(m)
            if m is None:
                continue
        members.append(m)
    body["members"] = members
    files.write(rel, json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode())


def damage_member(files: Files, kind: str, oid: str,
                  text: str = '{"not": "the object that hashes to its id"}') -> None:
    """Replaces what the pack holds for ``oid`` with ``text`` (the pack's file in place)."""
    _rewrite(files, kind, oid, lambda m: {**m, "text": text})


def delete_member(files: Files, kind: str, oid: str) -> None:
    """Removes ``oid`` from the pack holding it (the pack's file in place)."""
    _rewrite(files, kind, oid, lambda m: None)
