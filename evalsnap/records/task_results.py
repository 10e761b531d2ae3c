"""Prefect's cached task results as evalsnap writes them: plain JSON ids, never code.

Prefect persists a cached task result as a *result record* (JSON metadata naming a
serializer, and the result as that serializer wrote it). evalsnap's serializer
(``evalsnap-ids``, :mod:`tasks.results`) writes plain JSON data only; this module is the one
parse of such a record, used by the result storage before Prefect sees a record and by
``evalsnap verify``. Plain Python: no Prefect import.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from evalsnap.jsonsafe import scan_array, strict_json

SERIALIZER_TYPE = "evalsnap-ids"
#: A cached result is a list of small id records; anything much bigger is not ours.
MAX_RESULT_BYTES = 64 * 1024 * 1024


def plain(value: Any, depth: int = 0) -> bool:
    """JSON data only: no depth bomb, nothing that could name code."""
    if depth > 16:
        return False
    if value is None or isinstance(value, bool | int | float | str):
        return True
    if isinstance(value, list):
        return all(plain(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and plain(v, depth + 1) for k, v in value.items())
    return False


def loads_plain(data: bytes | str) -> Any:
    """Parses JSON as the store's other readers do (``strict_json``: no NaN/Infinity, no
    nesting bomb), and no deeper than ids need; ``ValueError`` otherwise."""
    try:
        value = strict_json(data.decode("utf-8") if isinstance(data, bytes) else data)
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 ({exc})") from None
    if not plain(value):
        raise ValueError("nested too deeply for a task result")
    return value


def record_items(data: bytes) -> Iterable[Any]:
    """The result inside a stored result record, if the record is one of ours, an item at a
    time, each parsed as it is reached (a metric's result held one row per case: the check
    of a 6,006-case metric's 5.8 MB record held 17.4 MB at its peak parsed whole, 11.0 MB
    so, the record's text and its result's; tracemalloc). The record is parsed once; each
    iteration reads its items afresh. ``ValueError`` from the call for a record that is not
    ours; from an iteration for a result that is not a list of plain items."""
    return _items(_result_text(data))


def record_result(data: bytes) -> Iterable[Any] | dict[str, Any]:
    """The result inside a stored result record: a list's items as :func:`record_items`
    gives them (an inference batch's outcomes; a scoring result of an earlier evalsnap), or
    the object a scoring result is now (the handle of its stored outcomes,
    :mod:`evalsnap.records.outcomes`), parsed."""
    text = _result_text(data)
    if text.lstrip().startswith("{"):
        value = loads_plain(text)
        if not isinstance(value, dict):  # pragma: no cover - strict_json of "{…" is one
            raise ValueError("not a list or an object")
        return value
    return _items(text)


class Reiterable(Iterable[Any]):
    """Items read afresh by each iteration (``make`` gives a new iterator each time)."""

    def __init__(self, make: Callable[[], Iterator[Any]]) -> None:
        self._make = make

    def __iter__(self) -> Iterator[Any]:
        return self._make()


def _items(text: str) -> Iterable[Any]:
    def items() -> Iterator[Any]:
        for item in scan_array(text):
            if not plain(item, 1):
                raise ValueError("nested too deeply for a task result")
            yield item

    return Reiterable(items)


def _result_text(data: bytes) -> str:
    """The result text inside a stored result record, if the record is one of ours; else
    ``ValueError`` saying why."""
    if not data:
        raise ValueError("empty file (an interrupted write, or a full disk)")
    if len(data) > MAX_RESULT_BYTES:
        raise ValueError(f"{len(data)} bytes")
    record = loads_plain(data)
    if not isinstance(record, dict) or not isinstance(record.get("metadata"), dict):
        raise ValueError("not a result record")
    serializer = record["metadata"].get("serializer")
    kind = serializer.get("type") if isinstance(serializer, dict) else None
    if kind != SERIALIZER_TYPE:
        raise ValueError(f"it names serializer {kind!r}, not {SERIALIZER_TYPE!r}")
    result = record.get("result")
    if not isinstance(result, str):
        raise ValueError("its result is not text")
    return result
