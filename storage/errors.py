"""Typed storage errors, all in one place: the storage subtree of evalsnap's one error tree.

Hierarchy (the whole tree is drawn in :mod:`evalsnap.errors`)::

    EvalsnapError                (evalsnap.errors; exit_code = 2: bad usage, config or input)
    └── StorageError             base of every error raised by :mod:`storage`
        ├── CorruptObjectError   stored bytes do not hash to their name   (.url, .expected, .actual)
        │   └── TooLarge         a stored file longer than evalsnap writes (.url, .limit)
        ├── ObjectNotFound       a content-addressed object is missing    (.url)
        ├── StoreUnavailable     store cannot be used: unknown protocol,
        │                        missing bucket, bad credentials,
        │                        unreachable endpoint, local I/O failure  (.url, .reason)
        └── InvalidId            an id, kind or oid fails validation      (.value, .what, .reason)

Backend exceptions (fsspec, botocore, aiohttp, gcsfs, google-auth, ``OSError``) become
these in one place, :mod:`storage._backend`. ``evalsnap.errors`` is a leaf module (it
imports nothing but :mod:`typing`), so this package stays light: no ADK, no Prefect.

Every message names what failed and says what to do next. Messages never contain
credentials: URLs are the store's normalized URL, which has none.

Each error pickles with its attributes (``__reduce__``) so it survives process pools.
"""

from __future__ import annotations

from typing import Any

from evalsnap.errors import EvalsnapError

__all__ = [
    "CorruptObjectError",
    "InvalidId",
    "ObjectNotFound",
    "StorageError",
    "StoreUnavailable",
    "TooLarge",
]


class StorageError(EvalsnapError):
    """Base class of every error raised by :mod:`storage` (``exit_code`` 2, from the root)."""


class CorruptObjectError(StorageError):
    """An object's bytes no longer hash to the id it is stored under."""

    def __init__(self, url: str, expected: str, actual: str) -> None:
        self.url = url
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"corrupt object {url}: its bytes hash to {actual}, expected {expected}. "
            "Run `evalsnap verify` to list every damaged object, delete this one, "
            "and re-run the step that produced it."
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.url, self.expected, self.actual))


class TooLarge(CorruptObjectError):
    """A stored file is longer than any file evalsnap writes of its kind: refused after that
    many bytes, never downloaded or parsed whole (a planted multi-GB manifest must not take
    a command's memory). Treated as damage wherever damage is handled."""

    def __init__(self, url: str, limit: int) -> None:
        StorageError.__init__(
            self,
            f"stored file {url} is longer than {limit // 2**20} MiB, more than evalsnap "
            "writes there: it was not read. Run `evalsnap verify`, and delete the file if "
            "nothing of yours wrote it.")
        self.url, self.limit = url, limit
        self.expected, self.actual = "", ""

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.url, self.limit))


class ObjectNotFound(StorageError):
    """A content-addressed object that was asked for is not in the store."""

    def __init__(self, url: str) -> None:
        self.url = url
        super().__init__(
            f"object not found: {url}. Check that --store points at the store that "
            "produced this id, or re-run the step that writes it."
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.url,))


class StoreUnavailable(StorageError):
    """The store cannot be reached, opened or written."""

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        self.reason = reason
        super().__init__(f"store {url} is unavailable: {reason}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.url, self.reason))


class InvalidId(StorageError):
    """A name used in a storage path is not a safe id."""

    def __init__(self, value: object, what: str, reason: str) -> None:
        self.value = value
        self.what = what
        self.reason = reason
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        super().__init__(f"invalid {what} {shown}: {reason}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.value, self.what, self.reason))
