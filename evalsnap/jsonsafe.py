"""The one strict JSON parse of evalsnap: for eval sets, configs and stored bytes alike."""

from __future__ import annotations

import json
import re
from typing import Any

#: What ``json.loads`` accepts that no JSON can hold again: a lone surrogate escape
#: (``\\ud800``; a paired one matches too and passes the check) or a float that overflows to
#: ``inf`` (a 3-digit exponent, or hundreds of digits). Only a text holding one of these is
#: re-encoded to check it (a parse of stored bytes is on every reuse path).
_NEEDS_CHECK = re.compile(r"\\u[dD][89a-fA-F]|[eE][+-]?\d{3}|\d{300}")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number (use a finite number or null)")


def strict_json(text: str) -> Any:
    """``json.loads`` limited to what can be stored and fingerprinted: no NaN/Infinity (nor a
    number too large for a float, such as ``1e999``), no lone surrogate escapes (``\\ud800``),
    no nesting too deep to parse. Any of those raises ``ValueError``
    (``json.JSONDecodeError`` for syntax errors)."""
    try:
        raw = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("it is nested too deeply") from None
    if not _NEEDS_CHECK.search(text):
        return raw
    try:
        json.dumps(raw, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("it contains a lone surrogate escape such as \\ud800, which is not "
                         "text") from None
    except RecursionError:
        raise ValueError("it is nested too deeply") from None
    except ValueError:  # json.loads reads 1e999 as inf, which no JSON can hold again
        raise ValueError("it holds a number too large for a float (such as 1e999); use a "
                         "finite number or a string") from None
    return raw
