"""evalsnap's storage layer: one fsspec-backed store addressed by a URL.

Plain Python, no Prefect. See :mod:`storage.store` for the on-disk layout and
:mod:`storage.errors` for the error hierarchy, a subtree of :mod:`evalsnap.errors`
(``StorageError`` derives from ``EvalsnapError``).
"""

from storage.errors import (
    CorruptObjectError,
    InvalidId,
    ObjectNotFound,
    StorageError,
    StoreUnavailable,
    TooLarge,
)
from storage.ids import OBJECT_KINDS, oid_of, validate_id, validate_kind, validate_oid
from storage.store import LAYOUT_VERSION, Problem, Store

__all__ = [
    "CorruptObjectError",
    "InvalidId",
    "LAYOUT_VERSION",
    "OBJECT_KINDS",
    "ObjectNotFound",
    "Problem",
    "StorageError",
    "Store",
    "StoreUnavailable",
    "TooLarge",
    "oid_of",
    "validate_id",
    "validate_kind",
    "validate_oid",
]
