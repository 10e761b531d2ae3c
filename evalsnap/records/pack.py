"""Packs: many small objects of one run in one content-addressed object, as git packs them.

A bucket bills and waits per request, and a run's objects are many and small (a score unit
is about 1 KB, a judge ledger entry 8 KB). So each scoring task also writes its new units
and ledger entries as one pack (or a few, at most :data:`PACK_BYTES` each), and publish packs
the run's inference records; the record names its packs (``EvaluationRecord.packs``). The
next run of the eval set reads those few packs instead of every object one by one.

A pack only *accelerates*: the loose objects stay the truth (every reader, ``verify`` and
``gc`` work on them as before). What a pack holds is used only after the store proved that
the loose object is there, whole (:meth:`storage.Store.prove_objects`: a bucket listing's
MD5, else a read); a damaged or missing pack costs the reads it would have saved, never a
wrong result. Each member is checked against its own id when a pack is read.

Format (``schema: evalsnap.pack/1``): strict JSON, ``{"schema": ..., "members": [{"kind",
"oid", "text"}...]}``, ``text`` being the member's UTF-8 bytes (every evalsnap object is JSON
text).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from evalsnap.errors import CorruptRecordError
from evalsnap.records._base import parse_stored
from storage import OBJECT_KINDS, oid_of
from storage.ids import OID_PATTERN

if TYPE_CHECKING:
    from storage import Store

__all__ = ["KIND", "PACK_BYTES", "PACK_SCHEMA", "build_packs", "each_pack", "members_of",
           "read_pack", "write_packs"]

logger = logging.getLogger(__name__)

KIND = "pack"
PACK_SCHEMA = "evalsnap.pack/1"
#: A pack is cut once its members reach this many bytes (reads stay few and bounded).
PACK_BYTES = 8 * 2**20
_MEMBER_KINDS = frozenset(OBJECT_KINDS) - {KIND}


def build_packs(members: Iterable[tuple[str, bytes]]) -> list[tuple[bytes, set[str]]]:
    """The packs holding ``members`` (kind, bytes), in order, each at most about
    :data:`PACK_BYTES`: per pack its bytes and the oids it holds. The same members in the
    same order give the same packs (so a run that changed nothing writes none)."""
    return list(each_pack(members))


def each_pack(members: Iterable[tuple[str, bytes]]) -> Iterator[tuple[bytes, set[str]]]:
    """:func:`build_packs` one pack at a time: a pack's bytes can be written and let go
    before the next is built (``members`` is read as the packs are cut)."""
    batch: list[dict[str, str]] = []
    size = 0
    seen: set[tuple[str, str]] = set()
    for kind, data in members:
        oid = oid_of(data)
        if (kind, oid) in seen:
            continue
        seen.add((kind, oid))
        batch.append({"kind": kind, "oid": oid, "text": data.decode("utf-8")})
        size += len(data)
        if size >= PACK_BYTES:
            yield _encode(batch), {m["oid"] for m in batch}
            batch, size = [], 0
    if batch:
        yield _encode(batch), {m["oid"] for m in batch}


def _encode(members: list[dict[str, str]]) -> bytes:
    return json.dumps({"schema": PACK_SCHEMA, "members": members}, ensure_ascii=False,
                      separators=(",", ":"), allow_nan=False).encode()


def read_pack(data: bytes, *, where: str) -> dict[tuple[str, str], bytes]:
    """The members of a pack, (kind, oid) → bytes, each checked against its oid;
    ``CorruptRecordError`` if the pack is not one (a member that fails its check is dropped,
    logged: the loose object is then read instead)."""
    raw = parse_stored(data, what=f"pack {where}")
    if not isinstance(raw, dict) or raw.get("schema") != PACK_SCHEMA \
            or not isinstance(raw.get("members"), list):
        raise CorruptRecordError(f"pack {where} is not an {PACK_SCHEMA} pack; it is not used "
                                 "(the objects it would hold are read one by one).")
    out: dict[tuple[str, str], bytes] = {}
    for member in raw["members"]:
        kind = member.get("kind") if isinstance(member, dict) else None
        oid = member.get("oid") if isinstance(member, dict) else None
        text = member.get("text") if isinstance(member, dict) else None
        if kind not in _MEMBER_KINDS or not isinstance(oid, str) or not OID_PATTERN.match(oid) \
                or not isinstance(text, str):
            logger.warning("pack %s: skipping a member that is not an object", where)
            continue
        body = text.encode("utf-8", "surrogatepass")
        if oid_of(body) != oid:
            logger.warning("pack %s: member %s does not hash to its id; not used", where, oid)
            continue
        out[(kind, oid)] = body
    return out


#: Packs read at once by :func:`members_of` (concurrent reads on a bucket; the batch's bytes
#: are what it holds at a time).
PACK_BATCH = 8


def members_of(store: Store, pack_oids: list[str]) -> Iterator[tuple[str, str, bytes]]:
    """(kind, oid, bytes) of every member of the packs, read :data:`PACK_BATCH` at a time,
    each pack let go of once read; a pack that cannot be read is skipped (logged: what it
    holds is then read object by object)."""
    for start in range(0, len(pack_oids), PACK_BATCH):
        for pack_oid, got in store.get_objects(KIND, pack_oids[start:start + PACK_BATCH]).items():
            try:
                members = read_pack(got, where=pack_oid) if isinstance(got, bytes) else {}
            except CorruptRecordError as exc:
                logger.warning("%s", exc)
                continue
            store.let_go(KIND, pack_oid)
            for (kind, oid), data in members.items():
                yield kind, oid, data


def write_packs(store: Store, members: Iterable[tuple[str, bytes]]) -> list[str]:
    """Writes ``members`` as packs (:func:`each_pack`), one at a time, each let go of once
    written; returns their oids."""
    oids: list[str] = []
    for data, _ in each_pack(members):
        oids += store.put_objects(KIND, [data])
        store.let_go(KIND, oids[-1])
    return oids
