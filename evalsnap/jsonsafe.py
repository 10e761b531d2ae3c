"""The one strict JSON parse of evalsnap: for eval sets, configs and stored bytes alike."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator, Mapping
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


def scan_object(text: str,
                arrays: Mapping[str, Callable[[Iterator[tuple[Any, int, int]]], Any]]
                ) -> dict[str, Any]:
    """The top-level JSON object of ``text``, read a value at a time: the list of each key
    of ``arrays`` is handed to that key's function as its items, one at a time (each item's
    value and where its text starts and ends), and the function's result is that key's
    value; every other value is parsed whole. Raises ``ValueError`` (``IndexError``,
    ``RecursionError``) for anything that is not plain JSON of that shape, or that
    ``json.loads`` would read otherwise (a key given twice, a trailing comma): the caller
    then reads the text the one strict way, whose error says what is wrong. A text
    :func:`needs_whole_check` says so is the caller's to refuse first."""
    def space(i: int) -> int:
        return _SPACE.match(text, i).end()  # type: ignore[union-attr]  # always matches

    def next_value(i: int, close: str) -> int:
        """Where the next value starts after one that ended at ``i``, or the ``close``
        bracket: a comma between values, none before the bracket."""
        i = space(i)
        if text[i] == ",":
            i = space(i + 1)
            if text[i] == close:
                raise ValueError("a trailing comma")
        elif text[i] != close:
            raise ValueError("no comma")
        return i

    def items(i: int, end: list[int]) -> Iterator[tuple[Any, int, int]]:
        while text[i] != "]":
            start = i
            value, stop = STRICT_DECODER.raw_decode(text, i)
            i = next_value(stop, "]")
            yield value, start, stop
        end.append(i + 1)

    head: dict[str, Any] = {}
    i = space(0)
    if text[i] != "{":
        raise ValueError("not an object")
    i = space(i + 1)
    while text[i] != "}":
        if text[i] != '"':
            raise ValueError("a key is not a string")
        key, i = STRICT_DECODER.raw_decode(text, i)
        i = space(i)
        if text[i] != ":" or key in head:
            raise ValueError("no colon, or a key given twice")
        i = space(i + 1)
        take = arrays.get(key)
        if take is not None and text[i] == "[":
            end: list[int] = []
            head[key] = take(items(space(i + 1), end))
            if not end:
                raise ValueError(f"{key}: not every item was read")
            i = end[0]
        else:
            head[key], i = STRICT_DECODER.raw_decode(text, i)
        i = next_value(i, "}")
    if space(i + 1) != len(text):
        raise ValueError("more after the object")
    return head
