"""Rows of models kept as their JSON, past a few MB in a temporary file: what a run holds of
each unit or case while it goes (the scoring tasks' outcomes, the summary's rows), a few
bytes a row in memory whatever the number of cases.

:class:`Rows` reads as a list of models (each row parsed when it is read) and is built by
appending (``extend``); :data:`RowList` is a pydantic field that holds a list or
:class:`Rows`, validated and written as the list.
"""

from __future__ import annotations

import array
import json
import os
import tempfile
import threading
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from typing import Annotated, Any, Generic, TypeVar, overload

from pydantic import BaseModel, GetCoreSchemaHandler, SerializerFunctionWrapHandler
from pydantic_core import core_schema

__all__ = ["ROWS_IN_MEMORY", "RowGroups", "RowList", "Rows", "Spool"]

M = TypeVar("M", bound=BaseModel)
K = TypeVar("K", bound=Hashable)

#: Bytes of rows' JSON a :class:`Rows` keeps in memory; past this they are in an unnamed
#: temporary file (deleted with it), read back a row at a time.
ROWS_IN_MEMORY = 4 << 20

#: Rows read from the file at once while iterating.
_BLOCK = 512

#: Whether rows pickled by this process go to a process on the same machine: set in a local
#: scoring process (:func:`send_by_file`), whose results the flow's process unpickles.
_BY_FILE = False


def send_by_file() -> None:
    """From now on rows past :data:`ROWS_IN_MEMORY` that this process pickles travel as a
    temporary file that the unpickling process reads (and deletes when it lets the rows
    go: :meth:`Rows.clear`), not through the pipe: a scoring process's result for a metric
    of 30,000 cases was ~100 MB received at once, and kept by Prefect's future as its
    pickle. Only for a process whose pickles stay on this machine (a local process pool)."""
    global _BY_FILE
    _BY_FILE = True


class Spool(Sequence[bytes]):
    """Byte strings appended and read back by index: in memory up to
    :data:`ROWS_IN_MEMORY`, then in an unnamed temporary file, each string's end offset in an
    array (8 bytes a row)."""

    __slots__ = ("_ends", "_file", "_lock", "_path")

    def __init__(self, items: Iterable[bytes] = ()) -> None:
        self._file: Any = tempfile.SpooledTemporaryFile(max_size=ROWS_IN_MEMORY)  # noqa: SIM115
        self._ends = array.array("Q")
        self._lock = threading.Lock()
        self._path: str | None = None
        self.extend(items)

    @property
    def size(self) -> int:
        """Bytes of all the strings."""
        return self._ends[-1] if self._ends else 0

    def to_file(self) -> str:
        """A new temporary file holding the strings (for :meth:`from_file`): its path."""
        with tempfile.NamedTemporaryFile(prefix="evalsnap-rows-", delete=False) as out, \
                self._lock:
            self._file.seek(0)
            left = self.size
            while left:
                block = self._file.read(min(left, 1 << 20))
                out.write(block)
                left -= len(block)
            return out.name

    @classmethod
    def from_file(cls, path: str, ends: bytes) -> Spool:
        """The strings of :meth:`to_file`'s file, read from it; :meth:`discard` deletes it
        (a pickle may be read more than once: Prefect's process pool future unpickles its
        result on every ``result()``)."""
        spool = cls()
        spool._file = open(path, "r+b")  # noqa: SIM115 - the spool's, as its temporary file
        spool._path = path
        spool._ends.frombytes(ends)
        return spool

    def discard(self) -> None:
        """Deletes the file :meth:`from_file` read, if this spool was read from one."""
        if self._path is not None:
            try:
                os.unlink(self._path)
            except FileNotFoundError:
                pass
            self._path = None

    def extend(self, items: Iterable[bytes]) -> None:
        with self._lock:
            end = self._ends[-1] if self._ends else 0
            self._file.seek(end)
            for item in items:
                self._file.write(item)
                end += len(item)
                self._ends.append(end)

    def __len__(self) -> int:
        return len(self._ends)

    @overload
    def __getitem__(self, index: int) -> bytes: ...

    @overload
    def __getitem__(self, index: slice) -> list[bytes]: ...

    def __getitem__(self, index: int | slice) -> bytes | list[bytes]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        end = self._ends[index]  # IndexError as a list's; a negative index counts from the end
        i = index % len(self._ends)
        start = self._ends[i - 1] if i else 0
        with self._lock:
            self._file.seek(start)
            return self._file.read(end - start)

    def __iter__(self) -> Iterator[bytes]:
        start = block_start = 0
        block = b""
        for i in range(len(self._ends)):  # rows appended meanwhile are not read
            end = self._ends[i]
            if not i % _BLOCK:  # a block of rows read at once (one seek, under the lock)
                block_start = start
                with self._lock:
                    self._file.seek(block_start)
                    block = self._file.read(
                        self._ends[min(i + _BLOCK, len(self._ends)) - 1] - block_start)
            yield block[start - block_start:end - block_start]
            start = end


class Rows(Sequence[M], Generic[M]):
    """Rows of one model kept as each row's JSON and parsed when read: at 10,000 cases × 7
    metrics ~60 MB against ~400 MB of the rows as models, and past :data:`ROWS_IN_MEMORY`
    that JSON is in a temporary file, 8 bytes a row in memory. Everything that reads them
    iterates, indexes or counts them, as it would a list; rows are added at the end
    (:meth:`extend`, ``+``), and :meth:`clear` lets them all go."""

    __slots__ = ("_items", "_model", "kept")

    def __init__(self, model: type[M], rows: Iterable[M] = ()) -> None:
        self._model = model
        self.kept: dict[str, Any] | None = None
        """Where a store keeps these rows, as the small JSON that names them (a scoring
        task's cached result: :mod:`evalsnap.records.outcomes`); ``None``: nowhere."""
        self._items = Spool(row.model_dump_json().encode() for row in rows)

    @classmethod
    def of_json(cls, model: type[M], items: Iterable[bytes]) -> Rows[M]:
        """Rows from each row's JSON (as :meth:`json_items` gives it)."""
        rows = cls(model)
        rows._items.extend(items)
        return rows

    @property
    def model(self) -> type[M]:
        return self._model

    def json_items(self) -> Sequence[bytes]:
        """Each row's JSON, as ``model_dump_json`` writes it."""
        return self._items

    def extend(self, rows: Iterable[M]) -> None:
        """Adds ``rows`` at the end (each made JSON as it comes)."""
        self._items.extend(row.model_dump_json().encode() for row in rows)

    def extend_json(self, items: Iterable[bytes]) -> None:
        """Adds rows given as their JSON (another :class:`Rows`' :meth:`json_items`)."""
        self._items.extend(items)

    def clear(self) -> None:
        """Lets every row go (the temporary file with them; rows received from a scoring
        process: the file it sent, too)."""
        self._items.discard()
        self._items = Spool()

    def __add__(self, other: Iterable[M]) -> Rows[M]:
        both = Rows.of_json(self._model, self._items)
        if isinstance(other, Rows):
            both.extend_json(other.json_items())
        else:
            both.extend(other)
        return both

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, index: int) -> M: ...

    @overload
    def __getitem__(self, index: slice) -> list[M]: ...

    def __getitem__(self, index: int | slice) -> M | list[M]:
        if isinstance(index, slice):
            return [self._model.model_validate_json(b) for b in self._items[index]]
        return self._model.model_validate_json(self._items[index])

    def __iter__(self) -> Iterator[M]:
        return (self._model.model_validate_json(b) for b in self._items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Rows):
            return (len(self) == len(other) and all(
                a == b for a, b in zip(self._items, other._items, strict=True))) \
                or list(self) == list(other)
        return isinstance(other, Sequence) and not isinstance(other, str | bytes) \
            and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]  # as a list's

    def __repr__(self) -> str:
        return f"Rows[{self._model.__name__}]({len(self)} rows)"

    def __reduce__(self) -> tuple[Any, ...]:
        if _BY_FILE and self._items.size > ROWS_IN_MEMORY:
            return Rows._from_file, (self._model, self._items.to_file(),
                                     self._items._ends.tobytes())
        return Rows.of_json, (self._model, tuple(self._items))

    @classmethod
    def _from_file(cls, model: type[M], path: str, ends: bytes) -> Rows[M]:
        rows = cls(model)
        rows._items = Spool.from_file(path, ends)
        return rows


class _RowsOrList:
    """A field that holds a list of rows or :class:`Rows`: validated as the list (JSON data
    becomes a list of models; a :class:`Rows` is kept as it is), described and written as
    the list (the JSON schema and the ``--json`` object do not change)."""

    def __get_pydantic_core_schema__(self, source: Any,
                                     handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        as_list = handler(source)
        return core_schema.json_or_python_schema(
            json_schema=as_list,
            python_schema=core_schema.union_schema(
                [core_schema.is_instance_schema(Rows), as_list], mode="left_to_right"),
            serialization=core_schema.wrap_serializer_function_ser_schema(
                _rows_data, schema=as_list))


def _rows_data(value: Any, handler: SerializerFunctionWrapHandler) -> Any:
    if isinstance(value, Rows):  # the rows' own JSON, as data (no model of them is made)
        return [json.loads(b) for b in value.json_items()]
    return handler(value)


RowList = Annotated[list[M], _RowsOrList()]
"""A list of ``M`` or :class:`Rows` of ``M`` (a field of a model)."""


class RowGroups(Mapping[K, list[M]]):
    """Rows (or a list) grouped by ``key``, in their order, as row numbers: each group is
    read from the rows when it is looked up, so grouping 70,000 rows never holds them all
    parsed (only :meth:`__init__`'s one pass reads every row)."""

    def __init__(self, rows: Sequence[M], key: Callable[[M], K]) -> None:
        self._rows = rows
        # each group's row numbers as an array: ~90 bytes a group of 7 where a list of ints
        # took ~300 (30,000 cases' groups of their units, in the summary and the aggregates)
        self._index: dict[K, array.array[int]] = {}
        for i, row in enumerate(rows):
            found = self._index.get(k := key(row))
            if found is None:
                self._index[k] = array.array("I", (i,))
            else:
                found.append(i)

    def __getitem__(self, key: K) -> list[M]:
        return [self._rows[i] for i in self._index[key]]

    def first(self, key: K) -> M | None:
        """The first row of ``key``'s group, or None."""
        found = self._index.get(key)
        return None if found is None else self._rows[found[0]]

    def __iter__(self) -> Iterator[K]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)
