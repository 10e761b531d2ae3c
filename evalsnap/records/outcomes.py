"""A metric's unit outcomes as one stored object, which Prefect's cached result names.

A scoring task's result is a row per case (~900 bytes each: ~29 MB for a metric of 30,000
cases). Prefect copies a task result several times as it persists it (our serializer's
bytes, its record's ``model_dump_json``, that text encoded: ~6× the result at the peak of
a 30,000-case run; bench/RESULTS.md, stop 55). So a cacheable scoring task writes its rows
here first, as one content-addressed object of kind :data:`KIND`, and its cached result is
a *handle* of a few bytes that names it (:func:`handle`).

The object is a JSON list with one row on each line (``[``, a row and a comma per line, the
last row without one, ``]``): JSON to every reader of the store (gc follows the ids in it,
``verify`` parses it), and read a line at a time as its parts come (:func:`lines`), so that
no reader holds it whole. Parsed as data; nothing in it is imported or run.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from evalsnap.records.task_results import Reiterable, loads_plain
from storage import validate_oid

KIND = "outcomes"
#: A handle is ``{KIND: oid, _ROWS: the number of rows}`` (``{"outcomes": …, "rows": n}``).
_ROWS = "rows"
#: A row is ~1 KB; a line far longer is not one (a crafted object read a part at a time).
MAX_ROW_BYTES = 4 << 20


def encode(items: Iterable[bytes]) -> Iterator[bytes]:
    """The object's bytes, a part per row: each item is a row's compact JSON (one line)."""
    yield b"["
    for n, item in enumerate(items):
        if b"\n" in item or b"\r" in item:
            raise ValueError("a row's JSON is one line")
        yield (b",\n" if n else b"\n") + item
    yield b"\n]\n"


def handle(oid: str | None, rows: int) -> dict[str, Any]:
    """What a cached scoring result holds: the object with its rows (``None``: not kept,
    nothing to cache)."""
    return {KIND: oid, _ROWS: rows}


def handle_oid(value: Any) -> str | None:
    """The object a cached result names, if ``value`` is a handle of a kept object;
    ``None`` if it is not a handle, or one of rows that were not kept (nothing to cache);
    ``ValueError`` for a handle that names no object, ``InvalidId`` for one whose id is
    not an object id."""
    if not isinstance(value, dict) or set(value) != {KIND, _ROWS} or value[KIND] is None:
        return None
    oid, count = value[KIND], value[_ROWS]
    if not isinstance(oid, str) or not isinstance(count, int) or isinstance(count, bool) \
            or count < 1:
        raise ValueError("the handle names no stored outcomes")
    validate_oid(oid)
    return oid


def lines(parts: Iterable[bytes]) -> Iterator[bytes]:
    """Each row's JSON (bytes) of an object given a part at a time, as the parts come;
    ``ValueError`` as soon as the bytes are not laid out as :func:`encode` writes them."""
    rest = b""
    state = "open"  # then "rows", then "closed"
    pending: bytes | None = None  # a row, yielded once the next line says whether it is last
    for part in parts:
        rest += part
        *done, rest = rest.split(b"\n")
        if len(rest) > MAX_ROW_BYTES:
            raise ValueError(f"a line of more than {MAX_ROW_BYTES} bytes is not a row")
        for line in done:
            if state == "open":
                if line != b"[":
                    raise ValueError("not a list of outcomes, one per line")
                state = "rows"
            elif state == "rows":
                if line == b"]":
                    state = "closed"
                    if pending is not None and pending.endswith(b","):
                        raise ValueError("the last row has a comma after it")
                elif pending is not None and not pending.endswith(b","):
                    raise ValueError("a row that is not the last has no comma")
                if pending is not None:
                    yield pending if state == "closed" else pending[:-1]
                pending = None if state == "closed" else line
            else:
                raise ValueError("bytes after the end of the list")
    if rest or state != "closed":
        raise ValueError("the list of outcomes is cut short or has trailing bytes")


def read_lines(store: Any, oid: str) -> Iterator[bytes]:
    """:func:`lines` of the stored object ``oid``, read a part at a time. The object is
    verified against ``oid`` once its last part is read (``CorruptObjectError``): a reader
    trusts what it read only once the iteration has ended."""
    return lines(store.get_object_parts(KIND, oid))


def stored_items(store: Any, oid: str) -> Iterable[Any]:
    """The rows of the stored object ``oid`` as plain JSON data, a line at a time (each
    iteration reads the object afresh; see :func:`read_lines` for when it is verified)."""
    return Reiterable(lambda: (loads_plain(line) for line in read_lines(store, oid)))
