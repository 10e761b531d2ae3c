"""The one strict JSON parse of evalsnap: for eval sets, configs and stored bytes alike."""

from __future__ import annotations

import json
import math
import re
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
