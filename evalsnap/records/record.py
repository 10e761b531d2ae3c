"""EvaluationRecord and RunManifest: what a run produced, published last."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from evalsnap.records._base import StoredModel


class UnitRef(BaseModel):
    """A unit in a record: where its result lives and why it was (re)computed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    eval_id: str
    repetition: int = 0
    metric_name: str
    unit_oid: str
    unit_fingerprint: str
    case_fingerprint: str
    rule_fingerprint: str
    reused: bool
    reused_from_run: str | None = None
    """Run that scored the unit, when reused."""
    reused_from_record: str | None = None
    """Record that published it, when reused."""
    why: str
    """Why scored: ``new``, ``forced``, ``reuse not requested``, ``reference changed``,
    ``rule changed``, ``evaluator version changed``, ``inference changed``,
    ``incomplete before``, ``no trusted version``; or ``reused``."""


class InferenceRef(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    eval_id: str
    repetition: int = 0
    inference_oid: str
    inference_fingerprint: str
    status: Literal["success", "failure"]
    reused: bool
    model_calls: int = 0
    """Agent model calls made by this run for this case (0 when reused)."""


class RunSummary(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    complete: bool
    passed: bool
    agent_calls: int
    judge_calls: int
    reused_units: int
    scored_units: int
    reused_judge_samples: int = 0


class EvaluationRecord(StoredModel):
    """The published result of one run or rescore."""

    KIND: ClassVar[str] = "record"
    SCHEMA_VERSION: ClassVar[int] = 1

    schema_version: int = 1
    run_id: str
    kind: Literal["run", "rescore", "import"] = "run"
    eval_set_id: str
    app_name: str
    snapshot_oid: str | None
    """None only for records imported from ADK history."""
    parent_record: str | None = None
    """Previous record of the same eval set (the one ``explain`` compares against)."""
    source: str | None = None
    """For a rescore: the run or snapshot whose inference was used."""
    reuse: bool = False
    force: bool = False
    inference: list[InferenceRef] = Field(default_factory=list)
    units: list[UnitRef] = Field(default_factory=list)
    skipped_cases: list[str] = Field(default_factory=list)
    """Rescore: inference whose eval_id the new eval set no longer has."""
    uninferred_cases: list[str] = Field(default_factory=list)
    """Rescore: eval_ids of the new eval set with no inference to score."""
    summary: RunSummary
    adk_history_path: str | None = None
    """Where the ADK EvalSetResult copy was written."""
    imported_from: str | None = None
    created_at: str = ""


class ManifestEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str
    oid: str


class RunManifest(StoredModel):
    """The only pointer to a run: written last, so what it names exists."""

    KIND: ClassVar[str] = "manifest"
    SCHEMA_VERSION: ClassVar[int] = 1

    schema_version: int = 1
    run_id: str
    eval_set_id: str
    app_name: str
    kind: Literal["run", "rescore", "import"] = "run"
    record_oid: str
    snapshot_oid: str | None
    objects: list[ManifestEntry]
    """Every object the record depends on."""
    passed: bool
    complete: bool
    created_at: str
    checksum: str = ""
    """sha256 of this manifest without ``checksum``; verified on read."""
