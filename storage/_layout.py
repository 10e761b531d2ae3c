"""Where things live inside a store (layout ``v1``), and how object files are checked.

    v1/STORE                                 marker: ``Store.check()`` writes it, ``check(write=False)`` reads it
    v1/objects/<kind>/<hex[:2]>/<hex[2:]>    write-once; <hex> = sha256 of the bytes
    v1/refs/<namespace>/.../<name>           mutable; replaced whole
    v1/prefect/                              Prefect result storage
    v1/site/<path>                           the browsable static site (HTML pages)

The two-character fan-out keeps local directories small (as git and dvc do).
"""

from __future__ import annotations

import re

from storage.ids import oid_of, validate_id, validate_oid

__all__ = [
    "LAYOUT_VERSION",
    "MARKER",
    "as_bytes",
    "check_content",
    "object_rel",
    "oid_from_rel",
    "ref_rel",
    "site_rel",
]

LAYOUT_VERSION = "v1"
MARKER = b"evalsnap store\nlayout: v1\n"
_HEX_DIR = re.compile(r"^[0-9a-f]{2}$")
_HEX_REST = re.compile(r"^[0-9a-f]{62}$")


def object_rel(kind: str, oid: str) -> str:
    """Path of an object relative to the store root (``kind`` already validated)."""
    hexdigest = validate_oid(oid).removeprefix("sha256:")
    return f"{LAYOUT_VERSION}/objects/{kind}/{hexdigest[:2]}/{hexdigest[2:]}"


def oid_from_rel(rel: str) -> str | None:
    """The oid named by ``<hex[:2]>/<hex[2:]>`` (relative to a kind's folder), else None."""
    parts = rel.split("/")
    if len(parts) == 2 and _HEX_DIR.match(parts[0]) and _HEX_REST.match(parts[1]):
        return f"sha256:{parts[0]}{parts[1]}"
    return None


def ref_rel(namespace: str, name: str | None) -> str:
    """Path of a ref (or, with ``name=None``, of its namespace) relative to the store root."""
    if not isinstance(namespace, str):
        validate_id(namespace, "ref namespace")
    segments = [validate_id(part, "ref namespace segment") for part in namespace.split("/")]
    if name is not None:
        segments.append(validate_id(name, "ref name"))
    return f"{LAYOUT_VERSION}/refs/" + "/".join(segments)


SITE = f"{LAYOUT_VERSION}/site"


def site_rel(path: str) -> str:
    """Path of a page of the site relative to the store root; every segment a safe id."""
    segments = [validate_id(part, "site path segment") for part in path.split("/")]
    return f"{SITE}/" + "/".join(segments)


def as_bytes(data: bytes) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    raise TypeError(f"data must be bytes, not {type(data).__name__}: serialize it first")


def check_content(oid: str, content: bytes | BaseException) -> str | None:
    """What is wrong with an object file whose read gave ``content``, or None."""
    if isinstance(content, FileNotFoundError):
        return "disappeared while verifying (deleted by another process?); run verify again"
    if isinstance(content, BaseException):
        return f"could not be read ({type(content).__name__}: {content}); check the store"
    actual = oid_of(bytes(content))
    if actual != oid:
        return (
            f"content hashes to {actual}, not to its name {oid}: the object is corrupt; "
            "delete it and re-run the step that produced it"
        )
    return None
