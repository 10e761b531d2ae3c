"""The one place fingerprints are computed.

Canonical form (version ``CANON_VERSION``): the value (a pydantic model is dumped
with ``mode="json"``) with volatile fields removed, serialized by ``json.dumps``
with sorted keys, compact separators, ``ensure_ascii=False`` and
``allow_nan=False``, UTF-8 encoded, prefixed by ``"<type>/<version>\\n"`` and
hashed with sha256. The result is written ``sha256:<hex>``.

Sequences keep their order (turn order is meaning). The exclusion list below is
part of the canonicalization version: changing it, or the header format, must
bump ``CANON_VERSION`` and the golden hashes in ``tests/test_fingerprint.py``.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from google.adk.version import __version__ as ADK_VERSION
from pydantic import BaseModel

CANON_VERSION = 1

#: Keys dropped wherever they appear: ADK fills them with timestamps, generated
#: ids or timings that differ between two runs of the same deterministic agent.
VOLATILE_KEYS: frozenset[str] = frozenset(
    {
        "creation_timestamp",
        "invocation_id",
        "duration",
        "model_duration",
        "tool_duration",
        "duration_details",
        "session_id",
        "created_at",
        "recorded_at",
        "elapsed_seconds",
    }
)

#: ``id`` is only volatile inside function calls / responses (ADK generates
#: ``adk-<uuid>`` ids there); a user's tool argument named ``id`` is meaning.
_FUNCTION_SHAPE_KEYS = frozenset({"name", "args"}), frozenset({"name", "response"})


def _is_function_part(value: dict[str, Any]) -> bool:
    keys = value.keys()
    return any(shape <= keys for shape in _FUNCTION_SHAPE_KEYS)


def strip_volatile(value: Any) -> Any:
    """Returns ``value`` (JSON data: string keys, no models) without the volatile fields:
    :func:`canonical_data` of it, which is that for JSON data."""
    return canonical_data(value)


def to_jsonable(value: Any) -> Any:
    """Dumps pydantic models (recursively) to JSON data; leaves JSON data alone."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=False, exclude_none=False)
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    return value


def canonical_data(value: Any) -> Any:
    """``strip_volatile(to_jsonable(value))`` in one pass over the value (the two passes
    copied every dict and list of a conversation twice: a fingerprint's costliest part)."""
    if isinstance(value, BaseModel):
        return canonical_data(value.model_dump(mode="json", by_alias=False, exclude_none=False))
    if isinstance(value, dict):
        if not all(type(k) is str for k in value):
            value = {str(k): v for k, v in value.items()}
        function_part = _is_function_part(value)
        return {
            k: canonical_data(v)
            for k, v in value.items()
            if k not in VOLATILE_KEYS and not (function_part and k == "id")
        }
    if isinstance(value, list | tuple):
        return [canonical_data(v) for v in value]
    return value


def canonical_bytes(kind: str, value: Any) -> bytes:
    """Returns the canonical bytes hashed for a value of type ``kind``."""
    body = json.dumps(
        canonical_data(value),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )
    return f"evalsnap.{kind}/{CANON_VERSION}\n{body}".encode()


def fingerprint(kind: str, value: Any) -> str:
    """Returns ``sha256:<hex>`` of the canonical bytes of ``value``."""
    return "sha256:" + hashlib.sha256(canonical_bytes(kind, value)).hexdigest()


def short(fp: str, n: int = 12) -> str:
    """A display form of a fingerprint or object id."""
    return fp.split(":", 1)[-1][:n]


# ---- the layered keys (DESIGN.md "Fingerprints") ----------------------------------------

def case_inputs(case: Any) -> dict[str, Any]:
    """What the agent is given: user turns or scenario, and the session input."""
    return {
        "user_turns": [inv.user_content.model_dump(mode="json") for inv in case.conversation or []],
        "scenario": case.conversation_scenario.model_dump(mode="json")
        if case.conversation_scenario else None,
        "session_input": case.session_input.model_dump(mode="json") if case.session_input else None,
    }


def inference_fingerprint(agent_identity: str, case: Any, repetition: int) -> str:
    """Agent identity + case inputs + repetition + google-adk version: run the agent again?"""
    return fingerprint("inference", {
        "agent": agent_identity, "inputs": case_inputs(case),
        "repetition": repetition, "adk_version": ADK_VERSION,
    })


def unit_fingerprint(case_fingerprint: str, rule_fingerprint: str) -> str:
    """A case × a rule: score this metric on this case again?"""
    return fingerprint("unit", {"case": case_fingerprint, "rule": rule_fingerprint})


def case_fingerprint(inference: Any, reference: dict[str, Any]) -> str:
    """An inference record's content + the full reference case: this case's scores stale?"""
    return fingerprint("case", {"inference": inference.content(), "reference": reference})
