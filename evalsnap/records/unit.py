"""ScoreUnit: one metric scored on one frozen case."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, NamedTuple, cast

from pydantic import Field

from evalsnap.records._base import FrozenModel, StoredModel

Status = Literal["PASSED", "FAILED", "NOT_EVALUATED", "INFORMATIONAL"]


class UnitRow(FrozenModel):
    """One per actual invocation, in order."""

    invocation_index: int
    score: float | None = None
    status: Status = "NOT_EVALUATED"
    rubric_scores: list[dict[str, Any]] | None = None


class ScoreUnit(StoredModel):
    """The result of scoring one metric on one case; reusable when ``complete``."""

    KIND: ClassVar[str] = "unit"
    VOLATILE: ClassVar[frozenset[str]] = frozenset({"run_id", "created_at"})
    SCHEMA_VERSION: ClassVar[int] = 1

    unit_fingerprint: str
    """Fingerprint of (case fingerprint, rule fingerprint): the reuse key."""
    case_fingerprint: str
    rule_fingerprint: str
    eval_id: str
    repetition: int = 0
    metric_name: str
    threshold: float
    score: float | None = None
    """The metric's own overall score."""
    metric_status: Status = "NOT_EVALUATED"
    """The metric's own overall status."""
    gate_score: float | None = None
    """Mean of the non-None per-invocation scores."""
    status: Status = "NOT_EVALUATED"
    """The gate verdict evalsnap acts on (exit codes, summaries)."""
    rows: list[UnitRow] = Field(default_factory=list)
    complete: bool = False
    """True when the metric ran to a verdict; only complete units are reused."""
    reason: str | None = None
    """Why the unit is incomplete or NOT_EVALUATED, or where gate and metric disagree."""
    trace: Literal["not_needed", "complete", "unavailable"] = "not_needed"
    """Judge trace coverage for this unit."""
    trace_note: str | None = None
    ledger: list[str] = Field(default_factory=list)
    """Object ids of the judge ledger entries of this unit."""
    judge_calls: int = 0
    """Judge requests sent while producing this unit (0 when answered from a ledger)."""
    rubric_scores: list[dict[str, Any]] | None = None
    run_id: str = ""
    """The run that scored this unit, while it is in memory: VOLATILE, so never stored (a
    unit read back has ``""``; the unit index and run manifests say which runs name it)."""
    created_at: str = ""


class VerdictRow(NamedTuple):
    """An invocation row's score and status (what the repetition gate pools)."""

    score: float | None
    status: Status


@dataclass(frozen=True, slots=True)
class UnitVerdict:
    """What summaries, aggregates and report pages read of a unit: its verdict, without
    its rubric details, ledger ids or fingerprints. A parsed :class:`ScoreUnit` takes about
    5 KB; a run of 10,000 cases × 7 metrics held every one of them, several times, while it
    published (:func:`evalsnap.records.repo.get_unit_verdict` keeps these instead)."""

    score: float | None
    status: Status
    metric_status: Status
    gate_score: float | None
    threshold: float
    complete: bool
    reason: str | None
    judge_calls: int
    trace: str
    rows: tuple[VerdictRow, ...]

    @classmethod
    def of(cls, unit: ScoreUnit) -> UnitVerdict:
        return cls(score=unit.score, status=_interned(unit.status),
                   metric_status=_interned(unit.metric_status), gate_score=unit.gate_score,
                   threshold=unit.threshold, complete=unit.complete, reason=unit.reason,
                   judge_calls=unit.judge_calls, trace=sys.intern(unit.trace),
                   rows=tuple(VerdictRow(r.score, _interned(r.status)) for r in unit.rows))

    def packed(self) -> bytes:
        """The verdict as a few bytes (what a run keeps of each of its units: a third of the
        memory of the object); :meth:`unpacked` makes it again."""
        return json.dumps([self.score, self.status, self.metric_status, self.gate_score,
                           self.threshold, self.complete, self.reason, self.judge_calls,
                           self.trace, [list(r) for r in self.rows]],
                          ensure_ascii=False, separators=(",", ":")).encode()

    @classmethod
    def unpacked(cls, data: bytes) -> UnitVerdict:
        (score, status, metric_status, gate_score, threshold, complete, reason, judge_calls,
         trace, rows) = json.loads(data)
        return cls(score, status, metric_status, gate_score, threshold, complete, reason,
                   judge_calls, trace, tuple(VerdictRow(r, st) for r, st in rows))


def _interned(status: Status) -> Status:
    return cast(Status, sys.intern(status))
