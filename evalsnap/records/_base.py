"""Shared base for stored records: versioned, strict, frozen, typed errors on load.

:func:`parse_stored` is the one parse of bytes read back from a store (objects, manifests,
index entries, ADK result files): whatever is wrong with them (not UTF-8, not JSON, NaN,
nesting too deep to parse, a number too long, bigger than the reader allows) is a
:class:`~evalsnap.errors.CorruptRecordError`, never a crash.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Annotated, Any, ClassVar, Self

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError, model_validator

from evalsnap.errors import CorruptRecordError, EvalsnapError, UnsupportedSchemaVersion
from evalsnap.jsonsafe import scan_object, strict_json
from evalsnap.rows import Rows
from storage.errors import StorageError

__all__ = ["CaseRepetition", "CorruptRecordError", "FrozenModel", "StoredModel", "first_problem",
           "parse_stored"]  # the error: evalsnap.errors

#: What to do about a stored file that cannot be read, unless the caller knows better.
VERIFY_ADVICE = ("run `evalsnap verify` to list every damaged file, delete this one and "
                 "re-run the step that produced it")


def parse_stored(data: bytes, *, what: str, limit: int | None = None,
                 advice: str = VERIFY_ADVICE) -> Any:
    """The JSON value of stored ``data`` (UTF-8, the rules of ``strict_json``).

    ``what`` names the file in the error (its kind and id or path), ``limit`` is the most
    bytes such a file can legitimately have, ``advice`` what to do about a bad one.
    Raises :class:`CorruptRecordError` for every way the bytes can be wrong.
    """
    if limit is not None and len(data) > limit:
        raise CorruptRecordError(
            f"{what} is {len(data)} bytes, more than the {limit} such a file can have; {advice}.")
    try:
        return strict_json(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise _not_json(what, f"not UTF-8 text: {exc.reason} at byte {exc.start}", advice) from exc
    except json.JSONDecodeError as exc:
        raise _not_json(what, f"line {exc.lineno}, column {exc.colno}: {exc.msg}", advice) from exc
    except ValueError as exc:  # strict_json's findings: NaN, surrogates, depth, long numbers
        raise _not_json(what, str(exc), advice) from exc
    except RecursionError as exc:  # strict_json re-encodes what it parsed: as deep again
        raise _not_json(what, "it is nested too deeply", advice) from exc


def _not_json(what: str, reason: str, advice: str) -> CorruptRecordError:
    return CorruptRecordError(f"{what} is not valid JSON ({reason}); {advice}.")


Shared = Annotated[str, AfterValidator(sys.intern)]
"""A string that many values of a run repeat (an eval id, a metric name, a rule's or a
case's fingerprint, a run id): one copy of it in memory, not one per value (a record of
10,000 cases × 7 metrics names each rule's fingerprint 10,000 times)."""


#: One ``__pydantic_fields_set__`` per distinct set of field names given (see FrozenModel).
_FIELDS_SETS: dict[frozenset[str], set[str]] = {}
_FIELDS_SETS_MAX = 4096


class FrozenModel(BaseModel):
    """A strict, immutable value: a field it does not declare is an error.

    Pydantic gives every instance a set of the field names it was given
    (``model_fields_set``), 0.2-0.7 KB each: at 10,000 cases × 7 metrics a run's units,
    references and outcomes held ~370,000 of them, 190 MB (measured, ``gc`` census of the
    CLI's process). A frozen model never adds to it in place (``model_copy`` copies it
    first), so instances given the same fields share one."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="after")
    def _share_fields_set(self) -> Self:
        given = self.__pydantic_fields_set__
        key = frozenset(given)
        shared = _FIELDS_SETS.get(key)
        if shared is None:
            if len(_FIELDS_SETS) >= _FIELDS_SETS_MAX:
                return self
            shared = _FIELDS_SETS.setdefault(key, given)
        object.__setattr__(self, "__pydantic_fields_set__", shared)
        return self


class CaseRepetition(FrozenModel):
    """A value about one case × repetition: these two fields come first."""

    eval_id: Shared
    repetition: int = 0


#: A list of models longer than this is encoded an item at a time (:meth:`StoredModel.to_bytes`).
_LONG = 64


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, allow_nan=False)


class StoredModel(FrozenModel):
    """A record written to the store. ``schema_version`` comes first in every record (a
    record that moves to version 2 declares ``schema_version: int = 2`` and
    ``SCHEMA_VERSION = 2``)."""

    KIND: ClassVar[str] = "object"
    SCHEMA_VERSION: ClassVar[int] = 1
    ROWS: ClassVar[dict[str, type[FrozenModel]]] = {}
    """Long list fields read back as :class:`~evalsnap.rows.Rows` of these models (each item
    parsed and checked as the bytes are read, then kept as its JSON), never as the parsed
    JSON of every item at once: a snapshot's cases."""
    VOLATILE: ClassVar[frozenset[str]] = frozenset()
    """Fields that say when or by which run an object was made, not what it is: left out of
    the stored bytes (they read back as their defaults), so the same work gives the same
    object, and writing it again repairs a damaged copy (``Store.put_object``). Who made an
    object is said by the run manifests and index entries that name it."""

    schema_version: int = 1
    """Format version of the record."""

    def to_bytes(self) -> bytes:
        """The bytes stored: JSON, keys sorted so equal records give equal objects.

        A long list of models (a record's units, a snapshot's cases) is encoded an item at a
        time, to the same bytes: as one dict, a record of 70,000 units took six times its
        52 MB while it was written."""
        if not self._long_fields():
            return _canonical(self.model_dump(mode="json", exclude=set(self.VOLATILE))).encode()
        return b"".join(list(self.iter_bytes()))  # each item's bytes, joined once

    def is_long(self) -> bool:
        """Whether :meth:`iter_bytes` makes this record's bytes a part at a time."""
        return bool(self._long_fields())

    def _long_fields(self) -> set[str]:
        return {name for name, value in self if name not in self.VOLATILE and (
            isinstance(value, Rows) and len(value) > _LONG  # rows of one model: alike
            and issubclass(value.model, FrozenModel)
            or isinstance(value, list) and len(value) > _LONG
            and all(type(item) is type(value[0]) for item in value)
            and isinstance(value[0], FrozenModel))}  # evalsnap's own, dumped alike alone

    def iter_bytes(self) -> Iterator[bytes]:
        """The bytes of :meth:`to_bytes`, a part at a time (a long list's items one by one:
        written as they are made, a record of 70,000 units is never held as bytes whole)."""
        long = self._long_fields()
        head = self.model_dump(mode="json", exclude=set(self.VOLATILE) | long)
        if not long:
            yield _canonical(head).encode()
            return
        yield b"{"
        for i, key in enumerate(sorted([*head, *long])):
            yield f"{', ' if i else ''}{_canonical(key)}: ".encode()
            if key in head:
                yield _canonical(head[key]).encode()
                continue
            yield b"["
            for j, item in enumerate(getattr(self, key)):
                yield (b", " if j else b"") + _canonical(item.model_dump(mode="json")).encode()
            yield b"]"
        yield b"}"

    @classmethod
    def from_bytes(cls, data: bytes, *, where: str = "") -> Self:
        """Parses stored bytes; a newer schema raises ``UnsupportedSchemaVersion``, anything
        else that is wrong with them ``CorruptRecordError``. The :attr:`ROWS` fields are read
        an item at a time; whatever that reading does not take (a problem in the bytes, a
        lone surrogate escape) is read the one strict way, which says what is wrong."""
        if not cls.ROWS:  # a small object (a unit, an inference): parsed whole, no copies
            return cls.from_data(parse_stored(data, what=f"{cls.KIND} {where}".strip()),
                                 where=where)
        return cls.from_parts(lambda: _chunks(data), where=where)

    @classmethod
    def from_parts(cls, parts: Callable[[], Iterable[bytes]], *, where: str = "") -> Self:
        """:meth:`from_bytes` of bytes given a part at a time by ``parts()`` (called again,
        for the strict read, if the rows' reading refuses them; a storage error it raises,
        such as a damaged object found once its last part was read, is the caller's). The
        :attr:`ROWS` fields are read as the parts come: the bytes and text of a long record
        are never whole."""
        if cls.ROWS:
            try:
                return cls.from_data(_with_rows(parts(), cls.ROWS), where=where)
            except StorageError:
                raise
            except (ValueError, IndexError, RecursionError, ValidationError, EvalsnapError):
                pass  # read again the strict way: its error names the problem
        data = b"".join(parts())
        return cls.from_data(parse_stored(data, what=f"{cls.KIND} {where}".strip()),
                             where=where)

    @classmethod
    def from_data(cls, raw: Any, *, where: str = "") -> Self:
        if isinstance(raw, dict):
            found = raw.get("schema_version", 1)
            if isinstance(found, int) and found > cls.SCHEMA_VERSION:
                raise UnsupportedSchemaVersion(f"{cls.KIND} {where}".strip(), found, cls.SCHEMA_VERSION)
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            raise CorruptRecordError(
                f"{cls.KIND} {where} does not match schema v{cls.SCHEMA_VERSION}: "
                f"{first_problem(exc)}; run `evalsnap verify` and rerun the command with --force."
            ) from exc


def first_problem(exc: ValidationError) -> str:
    """The first thing pydantic found wrong, and where, short enough for a message (the
    location of a deeply nested problem is cut)."""
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first.get("loc", ())) or "the top level"
    return f"{first.get('msg')} at {where if len(where) <= 120 else where[:117] + '...'}"


#: Items validated, then added to the rows, at a time.
_BATCH = 256


#: Bytes of a stored object decoded at a time when it is read as rows (:func:`_with_rows`).
_CHUNK = 1 << 20


def _chunks(data: bytes) -> Iterator[bytes]:
    view = memoryview(data)
    for start in range(0, len(view), _CHUNK):
        yield bytes(view[start:start + _CHUNK])


def _with_rows(source: Iterable[bytes], rows: dict[str, type[FrozenModel]]) -> dict[str, Any]:
    """A stored object's top-level JSON object from its bytes in chunks, each of its
    ``rows`` fields (a list) as :class:`Rows` of that model, an item parsed, checked and let
    go at a time (:func:`~evalsnap.jsonsafe.scan_object`: the text decoded as it is
    reached; a snapshot of 30,000 cases is ~66 MB of it, which its bytes and their whole
    text held twice while it was read); ``ValueError``/``IndexError``/``ValidationError``
    for anything that is not plain JSON of that shape, or holds an escape that is checked
    on the whole (the caller then reads it the strict way)."""
    def rows_of(model: type[FrozenModel]) -> Any:
        def take(items: Iterator[tuple[Any, str]]) -> Rows[Any]:
            found: Rows[Any] = Rows(model)
            batch: list[bytes] = []
            for value, text in items:
                model.model_validate(value)  # checked; the row is the item's own JSON
                batch.append(text.encode())
                if len(batch) >= _BATCH:
                    found.extend_json(batch)
                    batch.clear()
            found.extend_json(batch)
            return found
        return take

    return scan_object(source, {key: rows_of(model) for key, model in rows.items()})
