"""Which failures of an inference a retry can fix.

A retry can fix what depends on the moment: a deadline or timeout, a rate limit or an
overloaded or failing service (HTTP 408, 429, 5xx, as model clients report them), a lost
connection. Everything else (the agent's own code raising, a set-up ADK refuses, a model
that rejects the request) fails the same way every time: it is a failed inference at once,
with its traceback in the record, instead of the same error after every retry delay.
"""

from __future__ import annotations

import asyncio
import traceback as _traceback
from typing import Any

__all__ = ["is_transient", "traceback_of"]

_MAX_TRACEBACK = 16_000
_TRANSIENT_STATUS = frozenset({408, 429})
_TRANSIENT_NAMES = ("Timeout", "TimedOut", "RateLimit", "ServiceUnavailable", "Unavailable",
                    "Overloaded", "ConnectError", "ConnectionError", "TooManyRequests",
                    "InternalServerError", "ResourceExhausted", "DeadlineExceeded")


def _status(exc: BaseException) -> int | None:
    for attr in ("status_code", "code", "status"):
        value: Any = getattr(exc, attr, None)
        value = getattr(value, "value", value)  # an enum (HTTPStatus)
        if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599:
            return value
    response = getattr(exc, "response", None)
    value = getattr(response, "status_code", None)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _one(exc: BaseException) -> bool | None:
    """True or False when ``exc`` itself says; None when it says nothing."""
    flag = getattr(exc, "retryable", None)
    if isinstance(flag, bool):  # an error that knows (the offline models' errors do)
        return flag
    if isinstance(exc, TimeoutError | asyncio.TimeoutError | ConnectionError):
        return True
    status = _status(exc)
    if status is not None:
        return status in _TRANSIENT_STATUS or status >= 500
    names = [k.__name__ for k in type(exc).__mro__]
    if any(marker in name for name in names for marker in _TRANSIENT_NAMES):
        return True  # httpx.ConnectError, openai.RateLimitError, aiohttp's, grpc's…
    return None


def is_transient(exc: BaseException) -> bool:
    """Whether retrying the inference that raised ``exc`` can succeed (its causes are
    asked too: a tool may wrap a connection error in its own)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        verdict = _one(current)
        if verdict is not None:
            return verdict
        current = current.__cause__ or current.__context__
    return False


def traceback_of(exc: BaseException) -> str:
    """The formatted traceback, its end kept when long (where it was raised)."""
    text = "".join(_traceback.format_exception(exc))
    return text if len(text) <= _MAX_TRACEBACK else "…" + text[-_MAX_TRACEBACK:]
