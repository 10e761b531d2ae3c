"""Packs: many small objects of one run in one content-addressed object, as git packs them.

A bucket bills and waits per request, and a run's objects are many and small (a score unit
is about 1 KB, a judge ledger entry 8 KB). So:

* a scoring task writes its new units and judge ledger entries **only** as packs (a chunk of
  units at a time, each unit in the same pack as its ledger entries: at most
  :data:`PACK_BYTES` each); the record names the packs holding its units
  (``EvaluationRecord.packs``), an index segment the packs holding what it indexes;
* freeze packs the run's inference records and publish names those packs too: there the
  loose records stay (each is written as its case finishes, so that a killed run keeps it),
  and the packs spare the next run one read per case.

The store finds an object in a pack when a layer above has said which packs may hold it
(:meth:`storage.Store.locate`: a record's packs, a segment's, an outcome's) and reads the
pack once (:meth:`storage.Store.open_packs`); what no pack holds is read as a loose object
(stores written by earlier versions). Each member is checked against its own id when a pack
is read: a damaged or missing pack costs the recomputation of what it held, never a wrong
result; ``verify`` reports it, ``gc`` keeps a pack while a kept record or segment names it.

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
from storage.store import set_unpacker

if TYPE_CHECKING:
    from storage import Store

__all__ = ["KIND", "PACK_BYTES", "PACK_SCHEMA", "each_pack", "listed", "members_of",
           "pack_groups", "read_pack", "repair", "write_packs"]

logger = logging.getLogger(__name__)

KIND = "pack"
PACK_SCHEMA = "evalsnap.pack/1"
#: A pack is cut once its members reach this many bytes (reads stay few and bounded).
PACK_BYTES = 8 * 2**20
_MEMBER_KINDS = frozenset(OBJECT_KINDS) - {KIND}


def each_pack(members: Iterable[tuple[str, bytes]]) -> Iterator[tuple[bytes, set[str]]]:
    """The packs holding ``members`` (kind, bytes), in order, each at most about
    :data:`PACK_BYTES`, one at a time (a pack's bytes can be written and let go before the
    next is built): per pack its bytes and the oids it holds. The same members in the same
    order give the same packs (so a run that changed nothing writes none)."""
    return pack_groups([member] for member in members)


def pack_groups(groups: Iterable[list[tuple[str, bytes]]]
                ) -> Iterator[tuple[bytes, set[str]]]:
    """Packs of ``groups`` of members (kind, bytes), each group whole in one pack (a unit
    and its judge ledger entries), a pack cut once it reaches :data:`PACK_BYTES`: per pack
    its bytes and the oids it holds, in order; the same groups give the same packs."""
    batch: list[dict[str, str]] = []
    size = 0
    seen: set[tuple[str, str]] = set()
    for group in groups:
        for kind, data in group:
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


def listed(data: bytes) -> list[tuple[str, str]]:
    """The (kind, oid) of each member a pack's bytes list, whatever else is wrong with them
    (a damaged pack's list: what :func:`repair` rebuilds, what ``verify`` says it lost)."""
    try:
        raw = parse_stored(data, what="pack")
    except CorruptRecordError:
        return []
    members = raw.get("members") if isinstance(raw, dict) else None
    return [(m["kind"], m["oid"]) for m in members if isinstance(m, dict)
            and isinstance(m.get("kind"), str) and isinstance(m.get("oid"), str)] \
        if isinstance(members, list) else []


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
PACK_BATCH = 4


def members_of(store: Store, pack_oids: list[str], *, spare: bool = False
               ) -> Iterator[tuple[str, str, bytes]]:
    """(kind, oid, bytes) of every member of the packs, read :data:`PACK_BATCH` at a time
    from a bucket (one at a time from local disk)
    (:meth:`storage.Store.open_packs`: the members become readable as objects, kept in the
    read cache as far as it has room if ``spare``; the packs' bytes are let go); a pack
    that cannot be read is skipped (logged: what it holds is then looked for elsewhere)."""
    # on local disk one at a time: reading packs together hides no latency there, and each
    # holds its bytes and its members (~8 MB each) until the batch is read
    step = PACK_BATCH if store.is_bucket else 1
    for start in range(0, len(pack_oids), step):
        for got in store.open_packs(pack_oids[start:start + step], spare=spare).values():
            if isinstance(got, Exception):
                continue
            for (kind, oid), data in got.items():
                yield kind, oid, data


def write_packs(store: Store, members: Iterable[tuple[str, bytes]]) -> list[str]:
    """Writes ``members`` as packs (:func:`each_pack`), one at a time, each let go of once
    written; returns their oids."""
    oids: list[str] = []
    for data, _ in each_pack(members):
        oids += store.put_objects(KIND, [data])
        store.let_go(KIND, oids[-1])
    return oids


def repair(store: Store) -> list[str]:
    """Rewrites each pack the store found damaged in this run whose members are all at hand
    again (the sound ones from the damaged pack, the others done again by this run, byte for
    byte: objects hold no run id or time), if the rebuilt bytes hash to the pack's id;
    returns the packs repaired. What cannot be rebuilt stays as it is (``verify`` reports
    it; the records that name it are read without its damaged members)."""
    repaired = []
    for pack_oid, damaged in store.damaged_packs().items():
        names = listed(damaged)
        if not names:
            continue  # not even its list of members is left
        texts: list[dict[str, str]] = []
        for kind, oid in names:
            try:
                body = store.get_object(kind, oid)
            except Exception:  # noqa: BLE001 - not at hand (missing, damaged): no repair
                break
            texts.append({"kind": kind, "oid": oid, "text": body.decode("utf-8")})
        else:
            data = _encode(texts)
            if oid_of(data) == pack_oid:
                store.put_objects(KIND, [data])
                store.let_go(KIND, pack_oid)
                logger.warning("repaired damaged pack %s", pack_oid)
                repaired.append(pack_oid)
    return repaired


set_unpacker(lambda data, where: read_pack(data, where=where))
