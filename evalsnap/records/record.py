"""EvaluationRecord and RunManifest: what a run produced, published last."""

from __future__ import annotations

import json
from typing import ClassVar, Literal

from pydantic import Field

from evalsnap.exitcodes import FailOn
from evalsnap.records._base import CaseRepetition, FrozenModel, Shared, StoredModel
from evalsnap.rows import RowGroups, RowList


class UnitKey(CaseRepetition):
    """A scored unit: its case × repetition and metric, where it lives and its fingerprints
    (the first fields of a record's unit and of what a scoring task returns)."""

    metric_name: Shared
    unit_oid: str
    unit_fingerprint: str
    case_fingerprint: Shared
    rule_fingerprint: Shared


class UnitRef(UnitKey):
    """A unit in a record: where its result lives and why it was (re)computed."""

    reused: bool
    reused_from_run: Shared | None = None
    """Run that scored the unit, when reused."""
    reused_from_record: Shared | None = None
    """Record that published it, when reused."""
    why: Shared
    """Why scored: ``new``, ``forced``, ``reuse not requested``, ``reference changed``,
    ``rule changed``, ``evaluator version changed``, ``inference changed``,
    ``incomplete before``, ``no trusted version``; or ``reused``."""


class TokenCounts(FrozenModel):
    """Tokens summed over model responses' usage metadata.

    A count is None when no response reported it (unavailable, not zero). ``input_tokens``
    is prompt plus tool-use prompt tokens and ``output_tokens`` candidates plus thoughts
    tokens, as ADK's ``token_usage_v1`` counts them; ``total_tokens`` is their sum (a
    response's own total where it reported neither). ``cached_tokens`` is part of the input,
    ``thoughts_tokens`` part of the output.
    """

    input_tokens: int | None = None
    output_tokens: int | None = None
    total_tokens: int | None = None
    cached_tokens: int | None = None
    thoughts_tokens: int | None = None


class EfficiencyValue(FrozenModel):
    """One of ADK's informational efficiency metrics on one inference, as ADK computes it."""

    value: float | None = None
    """ADK's overall value: the per-invocation average; None where ADK gives None (n/a)."""
    status: str = "INFORMATIONAL"
    """ADK's status: ``INFORMATIONAL``, or ``NOT_EVALUATED`` when the evaluator raised."""
    details: dict[str, float | None] | None = None
    """ADK's overall breakdown, where it gives one (``token_usage_v1``: token types;
    ``invocation_duration_v1``: model, tool and framework seconds)."""


class ModelPrice(FrozenModel):
    """Price of one model, per million tokens (``evalsnapPrices`` in test_config.json)."""

    input_per_million: float
    output_per_million: float


class InferenceKey(CaseRepetition):
    """A stored inference: its case × repetition, where it lives and its fingerprint (the
    first fields of a record's inference and of a snapshot's frozen case)."""

    inference_oid: str
    """Object id of the InferenceRecord (its content hash)."""
    inference_fingerprint: str


class InferenceRef(InferenceKey):
    status: Literal["success", "failure"]
    reused: bool
    model_calls: int = 0
    """Agent model calls made by this run for this case (0 when reused)."""
    efficiency: dict[str, EfficiencyValue] = Field(default_factory=dict)
    """ADK's efficiency metrics of this inference, by metric name (none for a failed
    inference, as ADK gives none, and in records written before they were computed)."""
    tokens: TokenCounts | None = None
    """The agent's tokens in this inference (whoever ran it); None when none was reported."""
    tokens_by_model: dict[str, TokenCounts] = Field(default_factory=dict)
    """``tokens`` by the model version the responses name (``<unreported>`` where none)."""


class RunSummary(FrozenModel):
    complete: bool
    passed: bool
    agent_calls: int
    judge_calls: int
    reused_units: int
    scored_units: int
    reused_judge_samples: int = 0
    unscored: list[str] = Field(default_factory=list)
    """Selected ``case/metric`` pairs (``eval_id#repetition/metric``) without a unit, and
    selected cases without inference (``eval_id/*``): the run is then incomplete."""
    agent_tokens: TokenCounts | None = None
    """Agent tokens spent by this run (zeros when it called no agent model; None when its
    calls reported no usage, and in records written before tokens were counted)."""
    judge_tokens: TokenCounts | None = None
    """Judge tokens spent by this run (answers from the ledger cost none), as for
    ``agent_tokens``."""
    inference_tokens: TokenCounts | None = None
    """Agent tokens of all the inference this record scores, reused inference included."""
    model_tokens: dict[str, TokenCounts] = Field(default_factory=dict)
    """This run's tokens, agent and judge, by model name: the names a price table uses."""
    estimated_cost: float | None = None
    """This run's tokens priced by the config's ``evalsnapPrices``; None when there is no
    table, a model used has no price, or model calls reported no usage (``cost_note``)."""
    prices: dict[str, ModelPrice] = Field(default_factory=dict)
    """The prices the estimate used (the table's entries for the models this run used)."""
    cost_note: str | None = None
    """Why ``estimated_cost`` is None."""


class CaseStability(FrozenModel):
    """How many repetitions a case got under ``--until-stable``, and why it stopped
    (:mod:`evalsnap.pipeline.stability`)."""

    repetitions: int
    stopped: Literal["stable", "max", "incomplete"]
    """``stable``: no pass rate of the case is in doubt; ``max``: it reached the maximum
    still in doubt; ``incomplete``: a repetition could not be scored."""


class Coverage(FrozenModel):
    """What part of its eval set and config a record covers."""

    full: bool
    """Every case of the eval set and every metric of the config (a rescore: of a full
    source, every case of it with inference). ``latest`` and default baselines skip the
    records that are not."""
    missing_cases: list[str] = Field(default_factory=list)
    """Eval_ids of the eval set this record does not cover."""
    missing_metrics: list[str] = Field(default_factory=list)
    """Metrics of the config this record does not score."""
    repetitions: int = 1
    """Runs of the agent per case."""
    repetition_gate: str | None = None
    """How the repetitions of a case × metric are gated (``--repetition-gate``: ``mean``,
    ``every``, ``rate:P``; see :mod:`evalsnap.aggregates`); None: ``mean``, ADK
    ``AgentEvaluator``'s rule (and records written before the gate was recorded)."""
    note: str | None = None
    """Why the record is not full when no case or metric list says it (a subset source)."""
    until_stable: int | None = None
    """``--until-stable MAX``: the most repetitions a case could get (None: not asked;
    every case got ``repetitions``)."""
    stability: dict[str, CaseStability] | None = None
    """With ``until_stable``: per eval_id, the repetitions it got and why it stopped."""


class Baseline(FrozenModel):
    """The earlier record a run was compared with (``--baseline``)."""

    requested: str
    """What was asked: a run id, a record id, ``latest`` or ``last-good``."""
    record_oid: str | None = None
    """The record compared with; None when ``latest`` or ``last-good`` found no earlier
    full run."""
    run_id: str | None = None
    tolerance: float = 0.0
    """A score drop of more than this is a regression (0: only status changes are)."""
    alpha: float = 0.05
    """With at least 2 repetitions on both sides, a change of a case × metric's pass count is
    significant when Fisher's exact test gives a p-value below this (``--alpha``)."""


class EvaluationRecord(StoredModel):
    """The published result of one run or rescore."""

    KIND: ClassVar[str] = "record"
    SCHEMA_VERSION: ClassVar[int] = 1
    ROWS: ClassVar[dict[str, type[FrozenModel]]] = {"inference": InferenceRef, "units": UnitRef}

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
    inference: RowList[InferenceRef] = Field(default_factory=list)
    """One entry per case × repetition. A record publish made or read from the store holds
    these and its units as :class:`~evalsnap.rows.Rows` (each entry's JSON, past a few MB in
    a temporary file, parsed when read)."""
    units: RowList[UnitRef] = Field(default_factory=list)
    skipped_cases: list[str] = Field(default_factory=list)
    """Rescore: inference whose eval_id the new eval set no longer has."""
    uninferred_cases: list[str] = Field(default_factory=list)
    """Rescore: eval_ids of the new eval set with no inference to score."""
    summary: RunSummary
    adk_history_path: str | None = None
    """Where the ADK EvalSetResult copy was written."""
    packs: list[str] = Field(default_factory=list)
    """Packs (``v1/objects/pack/…``) holding copies of the objects this record names: what
    the next run of the eval set reads instead of every object (see
    :mod:`evalsnap.records.pack`); empty in records written before."""
    imported_from: str | None = None
    created_at: str = ""
    coverage: Coverage | None = None
    """What of the eval set and config it covers; None in records written before evalsnap
    recorded it (read as full)."""
    baseline: Baseline | None = None
    """The record it was compared with (regressions and fixes), if the run asked for one."""
    fail_on: FailOn | None = None
    """The run's gate (``--fail-on``): which outcome failed it. Whether the run is *good*
    (``--baseline last-good``) is this gate re-evaluated from the record; None in records
    written before it was recorded, and in imported ones: they count with ``quality``."""

    @property
    def full(self) -> bool:
        """Whether it covers the whole eval set and config (older records: yes)."""
        return self.coverage is None or self.coverage.full

    def units_by_case(self) -> RowGroups[tuple[str, int], UnitRef]:
        """The units by (eval id, repetition), in the record's order, each case's read from
        the record's rows when it is looked up: what a page or a summary groups by case
        without holding 70,000 parsed references (the index holds row numbers)."""
        return RowGroups(self.units, lambda u: (u.eval_id, u.repetition))


class ManifestEntry(FrozenModel):
    kind: str
    oid: str


class RunManifest(StoredModel):
    """The only pointer to a run: written last, so what it names exists."""

    KIND: ClassVar[str] = "manifest"
    SCHEMA_VERSION: ClassVar[int] = 1

    run_id: str
    eval_set_id: str
    app_name: str
    kind: Literal["run", "rescore", "import"] = "run"
    record_oid: str
    snapshot_oid: str | None
    objects: list[ManifestEntry]
    """The objects the record depends on: the record, its snapshot, inference records and
    packs, and each unit no listed pack holds (since packs-only, a pack is the only copy of
    the units and judge entries it holds; manifests written before list every unit). What
    the record names is followed from it (``gc``, ``verify``); this list is what a
    damaged record still keeps."""
    passed: bool
    complete: bool
    created_at: str
    checksum: str = ""
    """sha256 of this manifest without ``checksum``; verified on read."""
    full: bool | None = None
    """The record's ``coverage.full``; None in manifests written before it was recorded
    (read as full, and left out of the stored bytes so their checksums still hold)."""

    def to_bytes(self) -> bytes:
        if self.full is not None:
            return super().to_bytes()
        data = self.model_dump(mode="json", exclude={"full"})
        return json.dumps(data, sort_keys=True, ensure_ascii=False, allow_nan=False).encode()
