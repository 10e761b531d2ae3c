"""The run summary as typed models: the ``--json`` contract.

One :class:`MetricResult` per score unit (a metric on one case × repetition), the row every
view of a unit reads; :class:`CaseResult` holds a case's rows, :class:`RecordResult` is the
``--json`` object of a run over one eval set, :class:`SuiteResult` the one of a run over
several, and :class:`RunSummary` either (the whole contract, pinned by a golden JSON schema in
``tests/golden/summary.schema.json``). ``model_dump(mode="json")`` gives the ``--json`` object
itself: the keys in their order, and a key that the object only has in some runs (a baseline
comparison, the report link, the gate) left out unless it was set.

The stored records (:mod:`evalsnap.records.record`) are what a run *is*; these are views of
them, built by :func:`evalsnap.reports.summary.summary` and read by the command line, the
Python API, the Prefect artifacts and events, and the reports.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import IO, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    RootModel,
    SerializerFunctionWrapHandler,
    model_serializer,
)
from pydantic_core import to_json

from evalsnap.records.record import Baseline, Coverage, EfficiencyValue, ModelPrice, TokenCounts
from evalsnap.records.unit import Status
from evalsnap.rows import RowList, Rows

__all__ = ["Aggregate", "BaselineResult", "CaseResult", "Change", "MetricDelta", "MetricResult",
           "RecordResult", "RepetitionResult", "Rows", "RunSummary", "SuiteResult", "Summary",
           "as_record", "parts", "write_json"]



class _Contract(BaseModel):
    """Strict (an undeclared key is an error) and frozen; the keys of ``SOMETIMES`` are in
    the JSON only when they were set, as the ``--json`` object has them only in some runs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    SOMETIMES: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _leave_out_unset(self, handler: SerializerFunctionWrapHandler) -> Any:
        return _without_unset(self, handler(self))


def _without_unset(model: _Contract, data: Any) -> Any:
    """``data`` (a model's JSON) without the keys of its ``SOMETIMES`` that were not set."""
    if isinstance(data, dict):
        for name in model.SOMETIMES - model.model_fields_set:
            data.pop(name, None)
    return data


class MetricResult(_Contract):
    """One score unit: a metric on one case × repetition, as this record has it."""

    score: float | None = None
    """The metric's own overall score."""
    status: Status
    """The gate's verdict: ``PASSED``, ``FAILED``, ``NOT_EVALUATED`` or ``INFORMATIONAL``."""
    metric_status: Status | None = None
    """The status the evaluator itself reported."""
    gate_score: float | None = None
    """Mean of the non-None per-invocation scores (what the threshold is held against)."""
    threshold: float | None = None
    reused: bool = False
    """Scored by an earlier run (``reused_from_run``) and reused by this one."""
    reused_from_record: str | None = None
    reused_from_run: str | None = None
    why: str = ""
    """Why it was scored (``new``, ``rule changed``, …) or ``reused``."""
    reason: str | None = None
    """Why it is incomplete or NOT_EVALUATED, or where gate and metric disagree."""
    complete: bool = True
    """The metric ran to a verdict."""
    judge_calls: int = 0
    """Judge model calls this run made for it (0 when reused)."""


class CaseResult(_Contract):
    """One case × repetition of a record: its inference and its units by metric name."""

    SOMETIMES: ClassVar[frozenset[str]] = frozenset({
        "inference", "inference_reused", "efficiency", "tokens", "tokens_by_model"})

    eval_id: str
    repetition: int = 0
    inference: Literal["success", "failure"] | None = None
    """``success`` or ``failure``; absent for a case the record has units but no inference of
    (imported records)."""
    inference_reused: bool | None = None
    metrics: dict[str, MetricResult] = Field(default_factory=dict)
    efficiency: dict[str, EfficiencyValue] = Field(default_factory=dict)
    """ADK's informational efficiency metrics of the inference (``token_usage_v1``, …)."""
    tokens: TokenCounts | None = None
    """The agent's tokens over the case's turns."""
    tokens_by_model: dict[str, TokenCounts] = Field(default_factory=dict)


class RepetitionResult(_Contract):
    """One repetition of a case × metric in its :class:`Aggregate`."""

    repetition: int
    status: Status
    score: float | None = None
    complete: bool


class Aggregate(_Contract):
    """A case × metric over its repetitions (:func:`evalsnap.aggregates.aggregate`)."""

    eval_id: str
    metric: str
    n: int
    passed: int
    failed: int
    incomplete: int
    scored: int
    pass_rate: float | None = None
    pass_rate_ci95: list[float] | None = None
    """The 95% Wilson interval of the pass rate."""
    mean_score: float | None = None
    score_stdev: float | None = None
    pass_at_k: dict[str, float] = Field(default_factory=dict)
    pass_hat_k: dict[str, float] = Field(default_factory=dict)
    verdict: Literal["passing", "failing", "flaky", "incomplete"]
    status: Status
    """By the repetition gate (``gate``)."""
    gate: str
    gate_score: float | None = None
    higher_is_better: bool = True
    threshold: float | None = None
    repetitions: list[RepetitionResult] = Field(default_factory=list)


class Change(_Contract):
    """A regression or a fix against the baseline (:func:`evalsnap.reports.regressions.compare`):
    of one unit, or of a case × metric as a whole where both sides have repetitions
    (``repetition`` None, the pass counts and Fisher's p-value)."""

    SOMETIMES: ClassVar[frozenset[str]] = frozenset({
        "passed_before", "n_before", "passed_after", "n_after"})

    eval_id: str
    repetition: int | None
    metric: str
    change: str
    """What changed, in words."""
    status_before: str
    status_after: str
    score_before: float | None = None
    score_after: float | None = None
    passed_before: int | None = None
    n_before: int | None = None
    passed_after: int | None = None
    n_after: int | None = None
    p_value: float | None = None
    significant: bool = True
    """False: within noise (Fisher's p-value not below ``alpha``); it fails no gate."""

    @model_serializer(mode="wrap")
    def _leave_out_unset(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = _without_unset(self, handler(self))
        if isinstance(data, dict) and "n_before" in data:  # a case × metric's: ``change`` last
            data["change"] = data.pop("change")
        return data


class MetricDelta(_Contract):
    """Per metric: the mean score difference over the cases both sides scored."""

    metric: str
    cases: int
    mean_before: float
    mean_after: float
    mean_delta: float
    ci95: list[float] | None = None
    """The seeded paired bootstrap 95% interval (2 cases or more)."""
    excludes_zero: bool | None = None


class BaselineResult(Baseline, _Contract):
    """The record's baseline as the summary gives it: why there is no comparison (``note``),
    else when the baseline was made."""

    SOMETIMES: ClassVar[frozenset[str]] = frozenset({"note", "created_at"})

    note: str | None = None
    created_at: str | None = None


class RecordResult(_Contract):
    """The record of one eval set: the ``--json`` object of a run over one eval set."""

    SOMETIMES: ClassVar[frozenset[str]] = frozenset({
        "baseline", "regressions", "fixes", "not_compared", "metric_deltas", "replayed_record",
        "replay_changes", "report_url", "report_url_expires", "store_requests", "fail_on"})

    run_id: str
    kind: Literal["run", "rescore", "import", "replay"]
    snapshot_id: str | None = None
    record_id: str
    parent_record: str | None = None
    eval_set_id: str
    agent_calls: int = 0
    """Agent model calls this run made."""
    judge_calls: int = 0
    """Judge model calls this run made."""
    reused_judge_samples: int = 0
    reused_units: int = 0
    scored_units: int = 0
    complete: bool
    passed: bool
    """Complete, and every case × metric passed its repetition gate."""
    exit_code: int
    """0 passed, 1 a quality failure, 3 incomplete (:mod:`evalsnap.exitcodes`; under
    ``fail_on`` once the gate has run)."""
    repetition_gate: str = "mean"
    repetitions: int = 1
    skipped_cases: list[str] = Field(default_factory=list)
    uninferred_cases: list[str] = Field(default_factory=list)
    unscored: list[str] = Field(default_factory=list)
    adk_history_path: str | None = None
    full: bool = True
    coverage: Coverage | None = None
    agent_tokens: TokenCounts | None = None
    """Agent tokens this run spent (reused inference costs nothing)."""
    judge_tokens: TokenCounts | None = None
    """Judge tokens this run spent."""
    inference_tokens: TokenCounts | None = None
    model_tokens: dict[str, TokenCounts] = Field(default_factory=dict)
    estimated_cost: float | None = None
    """This run's tokens priced by the config's ``evalsnapPrices``; None says why in
    ``cost_note``."""
    cost_note: str | None = None
    prices: dict[str, ModelPrice] = Field(default_factory=dict)
    cases: RowList[CaseResult] = Field(default_factory=list)
    aggregates: RowList[Aggregate] = Field(default_factory=list)
    baseline: BaselineResult | None = None
    regressions: list[Change] = Field(default_factory=list)
    fixes: list[Change] = Field(default_factory=list)
    not_compared: int = 0
    """Units in only one of the record and its baseline."""
    metric_deltas: list[MetricDelta] = Field(default_factory=list)
    replayed_record: str | None = None
    replay_changes: list[dict[str, Any]] = Field(default_factory=list)
    report_url: str | None = None
    """The HTML report, as a link a browser opens (public, signed or local)."""
    report_url_expires: str | None = None
    store_requests: dict[str, int] = Field(default_factory=dict)
    """This run's store requests by kind (what a bucket bills)."""
    fail_on: str | None = None
    """The gate the exit code was decided under (``--fail-on``)."""


class SuiteResult(_Contract):
    """A run over several eval sets: one record each, the totals, the worst exit code."""

    SOMETIMES: ClassVar[frozenset[str]] = frozenset({"fail_on"})

    kind: Literal["run", "rescore", "import", "replay"]
    eval_set_ids: list[str]
    run_ids: list[str]
    record_ids: list[str]
    agent_calls: int = 0
    judge_calls: int = 0
    reused_judge_samples: int = 0
    reused_units: int = 0
    scored_units: int = 0
    complete: bool
    passed: bool
    exit_code: int
    runs: list[RecordResult]
    fail_on: str | None = None


Summary = RecordResult | SuiteResult
"""What a run or rescore returns: the record of its one eval set, or the suite of several."""


class RunSummary(RootModel[RecordResult | SuiteResult]):
    """The ``--json`` contract as a whole (``RunSummary.model_validate_json(line).root``)."""


def write_json(result: Summary, out: IO[str]) -> None:
    """Writes ``result.model_dump_json()`` to ``out``, the rows held as :class:`Rows` a row at
    a time (the ``--json`` object of 10,000 cases is never one string, nor its data)."""
    if isinstance(result, SuiteResult):
        _write_model(result, out, {"runs": lambda: _write_list(
            out, (lambda run=run: write_json(run, out) for run in result.runs))})
        return
    rows = {name: value for name in ("cases", "aggregates")
            if isinstance(value := getattr(result, name), Rows)}
    _write_model(result, out, {name: lambda value=value: _write_list(out, (
        lambda b=b: out.write(b.decode()) for b in value.json_items())) for name, value in rows.items()})


def _write_list(out: IO[str], items: Iterable[Any]) -> None:
    out.write("[")
    for i, write in enumerate(items):
        if i:
            out.write(",")
        write()
    out.write("]")


def _write_model(model: BaseModel, out: IO[str], parts: dict[str, Any]) -> None:
    """``model``'s JSON, its fields in ``parts`` written by their writers, the others (small)
    as ``model_dump_json`` writes them."""
    if not parts:
        out.write(model.model_dump_json())
        return
    head = model.model_dump(mode="json", exclude=set(parts))
    out.write("{")
    first = True
    for name in type(model).model_fields:
        if name not in parts and name not in head:
            continue  # left out of the object (unset: _Contract.SOMETIMES)
        out.write(("" if first else ",") + to_json(name).decode() + ":")
        first = False
        if name in parts:
            parts[name]()
        else:
            out.write(to_json(head[name]).decode())
    out.write("}")


def as_record(result: RecordResult | dict[str, Any]) -> RecordResult:
    """The model of one record's ``--json`` object (given as the object or as the model)."""
    return result if isinstance(result, RecordResult) else RecordResult.model_validate(result)


def parts(result: Summary) -> list[RecordResult]:
    """The per-eval-set results of a run's result (one, or each of ``runs``)."""
    return list(result.runs) if isinstance(result, SuiteResult) else [result]
