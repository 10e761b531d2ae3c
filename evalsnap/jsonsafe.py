"""The one strict JSON parse of evalsnap: for eval sets, configs and stored bytes alike."""

from __future__ import annotations

import codecs
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

#: What ``json.loads`` accepts that no JSON can hold again, besides the numbers
#: :func:`_finite_float` refuses: a lone surrogate escape (``\\ud800``; a paired one matches
#: too and passes the check). Only a text holding one is re-encoded to check it (a parse of
#: stored bytes is on every reuse path).
_NEEDS_CHECK = re.compile(r"\\u[dD][89a-fA-F]")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number (use a finite number or null)")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # 1e999, or hundreds of digits: no JSON can hold it again
        raise ValueError("it holds a number too large for a float (such as 1e999); use a "
                         "finite number or a string")
    return value


#: ``json`` decoder with :func:`strict_json`'s number rules, for reading a document a value
#: at a time (``raw_decode``); a text :func:`needs_whole_check` says so is left to
#: :func:`strict_json`.
STRICT_DECODER = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite_float)


def needs_whole_check(text: str) -> bool:
    """Whether ``text`` holds an escape :func:`strict_json` checks on the parsed whole."""
    return "\\u" in text and _NEEDS_CHECK.search(text) is not None


def strict_json(text: str) -> Any:
    """``json.loads`` limited to what can be stored and fingerprinted: no NaN/Infinity (nor a
    number too large for a float, such as ``1e999``), no lone surrogate escapes (``\\ud800``),
    no nesting too deep to parse. Any of those raises ``ValueError``
    (``json.JSONDecodeError`` for syntax errors)."""
    try:
        raw = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except RecursionError:
        raise ValueError("it is nested too deeply") from None
    if not needs_whole_check(text):
        return raw
    try:
        json.dumps(raw, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("it contains a lone surrogate escape such as \\ud800, which is not "
                         "text") from None
    except RecursionError:
        raise ValueError("it is nested too deeply") from None
    return raw


_SPACE = re.compile(r"[ \t\n\r]*")

#: Characters read before the position a streamed scan has reached, at most, before they
#: are let go (:func:`scan_object` of byte chunks).
_KEEP = 1 << 18


class _Text:
    """The text :func:`scan_object` reads: a whole ``str``, or decoded from UTF-8 byte
    chunks as the scan needs more (what it has read past let go: :meth:`forget`)."""

    def __init__(self, source: str | Iterable[bytes]) -> None:
        self.text = source if isinstance(source, str) else ""
        self._chunks: Iterator[bytes] | None = None if isinstance(source, str) else iter(source)
        self._decode = codecs.getincrementaldecoder("utf-8")("strict").decode
        self._tail = ""  # the last characters decoded: an escape cut between chunks is found

    def more(self, at_least: int = 1) -> bool:
        """Decodes the next chunks onto the text, ``at_least`` characters (joined to it
        once: appending a chunk at a time would copy a long text once per chunk); False
        at the end (a character cut at the end, or bytes that are no UTF-8, raise
        ``ValueError``)."""
        parts: list[str] = []
        got = 0
        while self._chunks is not None and got < at_least:
            chunk = next(self._chunks, None)
            part = self._decode(chunk if chunk is not None else b"", final=chunk is None)
            if chunk is None:
                self._chunks = None
            if part:
                # an escape the whole must be checked for (even cut between two chunks):
                # the caller reads the whole the strict way
                if needs_whole_check(self._tail + part):
                    raise ValueError("an escape that is checked on the whole text")
                self._tail = (self._tail + part)[-5:]
                parts.append(part)
                got += len(part)
        if parts:
            self.text += "".join(parts)
        return bool(parts)

    def forget(self, i: int) -> int:
        """Lets go of the text before ``i`` when streamed and more than :data:`_KEEP` (a
        position the scan will not look back to); ``i``'s position in what is kept."""
        if self._chunks is None or i <= _KEEP:
            return i
        self.text = self.text[i:]
        return 0


def scan_object(source: str | Iterable[bytes],
                arrays: Mapping[str, Callable[[Iterator[tuple[Any, str]]], Any]]
                ) -> dict[str, Any]:
    """The top-level JSON object of ``source`` (a text, or its UTF-8 bytes in chunks: then
    decoded as the scan reaches them, never whole), read a value at a time: the list of
    each key of ``arrays`` is handed to that key's function as its items, one at a time
    (each item's value and its text), and the function's result is that key's value; every
    other value is parsed whole. Raises ``ValueError`` (``IndexError``, ``RecursionError``)
    for anything that is not plain JSON of that shape, or that ``json.loads`` would read
    otherwise (a key given twice, a trailing comma), or that :func:`needs_whole_check`
    says must be checked whole: the caller then reads the text the one strict way, whose
    error says what is wrong. A whole text that needs that check is the caller's to refuse
    first."""
    src = _Text(source)

    def space(i: int) -> int:
        while True:
            i = _SPACE.match(src.text, i).end()  # type: ignore[union-attr]  # always matches
            if i < len(src.text) or not src.more():  # whitespace up to the end: read on from there
                return i

    def grow(i: int) -> bool:
        """More text for a value that starts at ``i``: at least as much again as there is
        from ``i`` (a value decoded again from its start after each chunk would cost the
        square of its length: a crafted object of one 1 GB string)."""
        return src.more(len(src.text) - i + 1)

    def at(i: int) -> str:
        while i >= len(src.text) and src.more():
            pass
        return src.text[i]  # IndexError past the end

    def value(i: int) -> tuple[Any, int]:
        """The value at ``i`` and where it ends: decoded again with more text while it ends
        within 3 characters of what was read, or is cut by it: a number cut there reads as
        a shorter one (``1`` of ``1e+5``, ``0`` of ``0.5``), and with 3 characters more it
        would have read on."""
        while True:
            try:
                found, end = STRICT_DECODER.raw_decode(src.text, i)
            except json.JSONDecodeError:
                if grow(i):
                    continue
                raise
            if end + 3 <= len(src.text) or not grow(i):
                return found, end

    def next_value(i: int, close: str) -> int:
        """Where the next value starts after one that ended at ``i``, or the ``close``
        bracket: a comma between values, none before the bracket."""
        i = space(i)
        if at(i) == ",":
            i = space(i + 1)
            if at(i) == close:
                raise ValueError("a trailing comma")
        elif at(i) != close:
            raise ValueError("no comma")
        return i

    def items(i: int, end: list[int]) -> Iterator[tuple[Any, str]]:
        while at(i) != "]":
            i = src.forget(i)
            found, stop = value(i)
            text = src.text[i:stop]
            i = next_value(stop, "]")
            yield found, text
        end.append(i + 1)

    head: dict[str, Any] = {}
    i = space(0)
    if at(i) != "{":
        raise ValueError("not an object")
    i = space(i + 1)
    while at(i) != "}":
        i = src.forget(i)
        if at(i) != '"':
            raise ValueError("a key is not a string")
        key, i = value(i)
        i = space(i)
        if at(i) != ":" or key in head:
            raise ValueError("no colon, or a key given twice")
        i = space(i + 1)
        take = arrays.get(key)
        if take is not None and at(i) == "[":
            end: list[int] = []
            head[key] = take(items(space(i + 1), end))
            if not end:
                raise ValueError(f"{key}: not every item was read")
            i = end[0]
        else:
            head[key], i = value(i)
        i = next_value(i, "}")
    if space(i + 1) != len(src.text):
        raise ValueError("more after the object")
    return head


def scan_array(text: str) -> Iterator[Any]:
    """The items of the top-level JSON array ``text``, each parsed when it is reached (a
    cached task result is checked an item at a time, :mod:`evalsnap.records.task_results`):
    as :func:`strict_json` reads them, else ``ValueError`` (also
    for a trailing comma, a missing one, or anything after the array) when the iteration
    reaches it."""
    i = _SPACE.match(text).end()  # type: ignore[union-attr]  # always matches
    if text[i:i + 1] != "[":
        raise ValueError("not a list")
    i = _SPACE.match(text, i + 1).end()  # type: ignore[union-attr]
    if text[i:i + 1] != "]":
        while True:
            try:
                item, stop = STRICT_DECODER.raw_decode(text, i)
            except RecursionError:
                raise ValueError("it is nested too deeply") from None
            if "\\u" in text[i:stop] and _NEEDS_CHECK.search(text, i, stop):
                strict_json(text[i:stop])  # its error says what is wrong
            yield item
            i = _SPACE.match(text, stop).end()  # type: ignore[union-attr]
            if text[i:i + 1] == "]":
                break
            if text[i:i + 1] != ",":
                raise ValueError("no comma between the items of a list")
            i = _SPACE.match(text, i + 1).end()  # type: ignore[union-attr]
            if text[i:i + 1] == "]":
                raise ValueError("a trailing comma")
    if _SPACE.match(text, i + 1).end() != len(text):  # type: ignore[union-attr]
        raise ValueError("more after the list")
