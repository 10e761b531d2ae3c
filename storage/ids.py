"""Validation of every name that becomes part of a storage path.

Ids end up as path segments on local disk and as object keys, so they are restricted to a
small alphabet that is safe everywhere: no separators, no ``..``, no leading dot (temporary
files start with one), bounded length.
"""

from __future__ import annotations

import hashlib
import re

from storage.errors import InvalidId

__all__ = [
    "ID_PATTERN",
    "MAX_ID_LENGTH",
    "OBJECT_KINDS",
    "OID_PATTERN",
    "PACKED_KINDS",
    "oid_of",
    "short_key",
    "validate_id",
    "validate_kind",
    "validate_oid",
]

ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")
MAX_ID_LENGTH = 200
#: Kinds of content-addressed objects; each is a folder under ``v1/objects/``. ``outcomes``:
#: a metric's unit outcomes, which a cached scoring result names (records/outcomes.py).
OBJECT_KINDS: tuple[str, ...] = ("inference", "snapshot", "unit", "judge", "record", "pack",
                                 "outcomes")
#: Kinds whose objects may have no copy but a pack's (what a scoring task writes: a pack is
#: their only copy; a pack of other kinds is a copy for fast reads of loose objects).
PACKED_KINDS: tuple[str, ...] = ("unit", "judge")

#: What an object id looks like: ``sha256:`` and 64 lowercase hex digits.
OID_PATTERN = re.compile(r"^sha256:[0-9a-f]{64}$")
_ID_RULE = (
    f"use 1-{MAX_ID_LENGTH} characters from A-Z a-z 0-9 . _ : -, starting with a letter or digit"
)


def validate_id(value: object, what: str = "id") -> str:
    """Return ``value`` if it is a safe id, else raise :class:`InvalidId` naming ``what``."""
    if not isinstance(value, str):
        raise InvalidId(value, what, f"expected a string, got {type(value).__name__}; {_ID_RULE}")
    if not value:
        raise InvalidId(value, what, f"it is empty; {_ID_RULE}")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidId(value, what, f"it has {len(value)} characters; {_ID_RULE}")
    if ".." in value:
        raise InvalidId(value, what, f"it contains '..'; {_ID_RULE}")
    if "/" in value or "\\" in value:
        raise InvalidId(value, what, f"it contains a path separator; {_ID_RULE}")
    if not ID_PATTERN.match(value):
        raise InvalidId(value, what, _ID_RULE)
    return value


def validate_kind(kind: object) -> str:
    """Return ``kind`` if it is one of :data:`OBJECT_KINDS`."""
    if not isinstance(kind, str) or kind not in OBJECT_KINDS:
        raise InvalidId(kind, "object kind", f"use one of {', '.join(OBJECT_KINDS)}")
    return kind


def validate_oid(oid: object) -> str:
    """Return ``oid`` if it looks like ``sha256:<64 lowercase hex>``."""
    if not isinstance(oid, str) or not OID_PATTERN.match(oid):
        raise InvalidId(oid, "object id", "expected 'sha256:' followed by 64 lowercase hex digits")
    return oid


def oid_of(data: bytes) -> str:
    """The content address of ``data``: ``sha256:<hex>``."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def short_key(text: str) -> bytes:
    """A 16-byte key for a path or an id in what a process remembers of many objects (a
    run's 70,000 units at 10,000 cases): a third of the memory of the text; collisions
    2⁻¹²⁸."""
    return hashlib.blake2b(text.encode(), digest_size=16).digest()
