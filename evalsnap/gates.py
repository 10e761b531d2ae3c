"""The repetition gate's names (``--repetition-gate``): checked by the plan before any model
call, applied by :mod:`evalsnap.aggregates`."""

from __future__ import annotations

from evalsnap.errors import UsageError

__all__ = ["GATES", "check_gate", "rate_of"]

GATES = ("mean", "every", "rate:P")


def rate_of(gate: str) -> float | None:
    """P of ``rate:P``; None for another gate or a P that is not a number in [0, 1]."""
    if not gate.startswith("rate:"):
        return None
    try:
        p = float(gate.removeprefix("rate:"))
    except ValueError:
        return None
    return p if 0.0 <= p <= 1.0 else None


def check_gate(gate: str) -> str:
    """``gate`` if it is ``mean``, ``every`` or ``rate:P`` with 0 ≤ P ≤ 1; else exit 2."""
    if gate in ("mean", "every") or rate_of(gate) is not None:
        return gate
    raise UsageError(f"--repetition-gate {gate!r} is unknown; choose mean, every, or rate:P "
                     "with P between 0 and 1 (for example rate:0.8).")
