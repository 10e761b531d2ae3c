"""Small, JSON-serializable values that stages pass to each other (and Prefect caches)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from evalsnap.records._base import CaseRepetition, Shared
from evalsnap.records.record import TokenCounts, UnitKey


class InferenceOutcome(CaseRepetition):
    """What an inference task returns: ids, not the inference itself."""

    oid: str
    fingerprint: str
    status: Literal["success", "failure"]
    model_calls: int = 0
    run_id: str
    """The run that produced the record (differs from the current run when reused)."""
    error: str | None = None


class UnitOutcome(UnitKey):
    """What a scoring task returns per unit."""

    complete: bool
    status: str
    score: float | None = None
    judge_calls: int = 0
    reused_judge_samples: int = 0
    judge_tokens: dict[str, TokenCounts] = Field(default_factory=dict)
    """Tokens of this run's live judge calls for the unit, by model."""
    judge_unreported: int = 0
    """This run's live judge calls for the unit that reported no token usage."""
    run_id: Shared
    """The run that scored the unit."""
    reused_from_record: Shared | None = None
    why: Shared
    packs: list[Shared] = Field(default_factory=list)
    """Packs holding a copy of the unit (and its judge entries): what the record names so
    that the next run reads a few packs instead of every object."""
