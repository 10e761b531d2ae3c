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

import array
import json
import tempfile
import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import IO, Annotated, Any, ClassVar, Generic, Literal, TypeVar, overload

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    RootModel,
    SerializerFunctionWrapHandler,
    model_serializer,
)
from pydantic_core import core_schema, to_json

from evalsnap.records.record import Baseline, Coverage, EfficiencyValue, ModelPrice, TokenCounts
from evalsnap.records.unit import Status

__all__ = ["Aggregate", "BaselineResult", "CaseResult", "Change", "MetricDelta", "MetricResult",
           "RecordResult", "RepetitionResult", "Rows", "RunSummary", "SuiteResult", "Summary",
           "as_record", "parts", "write_json"]

M = TypeVar("M", bound=BaseModel)


#: Bytes of rows' JSON a :class:`Rows` keeps in memory; past this they are in an unnamed
#: temporary file (deleted with it), read back a row at a time.
ROWS_IN_MEMORY = 4 << 20


class _Spool(Sequence[bytes]):
    """Byte strings appended once and read back by index: in memory up to
    :data:`ROWS_IN_MEMORY`, then in an unnamed temporary file, each string's end offset in an
    array (8 bytes a row)."""

    __slots__ = ("_ends", "_file", "_lock")

    def __init__(self, items: Iterable[bytes] = ()) -> None:
        self._file = tempfile.SpooledTemporaryFile(max_size=ROWS_IN_MEMORY)  # noqa: SIM115
        self._ends = array.array("Q")
        self._lock = threading.Lock()
        end = 0
        for item in items:
            self._file.write(item)
            end += len(item)
            self._ends.append(end)

    def __len__(self) -> int:
        return len(self._ends)

    @overload
    def __getitem__(self, index: int) -> bytes: ...

    @overload
    def __getitem__(self, index: slice) -> list[bytes]: ...

    def __getitem__(self, index: int | slice) -> bytes | list[bytes]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        end = self._ends[index]  # IndexError as a list's; a negative index counts from the end
        i = index % len(self._ends)
        start = self._ends[i - 1] if i else 0
        with self._lock:
            self._file.seek(start)
            return self._file.read(end - start)

    def __iter__(self) -> Iterator[bytes]:
        start = 0
        for i, end in enumerate(self._ends):
            if not i % 512:  # a block of rows read at once (one seek, under the lock)
                block_start = start
                with self._lock:
                    self._file.seek(block_start)
                    block = self._file.read(self._ends[min(i + 511, len(self._ends) - 1)]
                                            - block_start)
            yield block[start - block_start:end - block_start]
            start = end


class Rows(Sequence[M], Generic[M]):
    """A summary's rows (its cases, its aggregates) kept as each row's JSON and parsed when
    read: at 10,000 cases × 7 metrics ~60 MB against ~400 MB of the rows as models, and past
    :data:`ROWS_IN_MEMORY` that JSON is in a temporary file, not in memory (a 30,000-case
    run's summary is 8 bytes a row here). A run's summary holds its rows this way;
    everything that reads them iterates, indexes or counts them, as it would a list, and the
    ``--json`` object is the same (:func:`write_json` writes it a row at a time)."""

    __slots__ = ("_items", "_model")

    def __init__(self, model: type[M], rows: Iterable[M] = ()) -> None:
        self._model = model
        self._items = _Spool(row.model_dump_json().encode() for row in rows)

    @classmethod
    def of_json(cls, model: type[M], items: Iterable[bytes]) -> Rows[M]:
        """Rows from each row's JSON (as :meth:`json_items` gives it)."""
        rows = cls(model)
        rows._items = _Spool(items)
        return rows

    def json_items(self) -> Sequence[bytes]:
        """Each row's JSON, as ``model_dump_json`` writes it."""
        return self._items

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, index: int) -> M: ...

    @overload
    def __getitem__(self, index: slice) -> list[M]: ...

    def __getitem__(self, index: int | slice) -> M | list[M]:
        if isinstance(index, slice):
            return [self._model.model_validate_json(b) for b in self._items[index]]
        return self._model.model_validate_json(self._items[index])

    def __iter__(self) -> Iterator[M]:
        return (self._model.model_validate_json(b) for b in self._items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Rows):
            return (len(self) == len(other) and all(
                a == b for a, b in zip(self._items, other._items, strict=True))) \
                or list(self) == list(other)
        return isinstance(other, Sequence) and not isinstance(other, str | bytes) \
            and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]  # as a list's

    def __repr__(self) -> str:
        return f"Rows[{self._model.__name__}]({len(self)} rows)"

    def __reduce__(self) -> tuple[Any, ...]:
        return Rows.of_json, (self._model, tuple(self._items))


class _RowsOrList:
    """A field that holds a list of rows or :class:`Rows`: validated as the list (JSON data
    becomes a list of models; a :class:`Rows` is kept as it is), described and written as
    the list (the JSON schema and the ``--json`` object do not change)."""

    def __get_pydantic_core_schema__(self, source: Any,
                                     handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        as_list = handler(source)
        return core_schema.json_or_python_schema(
            json_schema=as_list,
            python_schema=core_schema.union_schema(
                [core_schema.is_instance_schema(Rows), as_list], mode="left_to_right"),
            serialization=core_schema.wrap_serializer_function_ser_schema(
                _rows_data, schema=as_list))


def _rows_data(value: Any, handler: SerializerFunctionWrapHandler) -> Any:
    if isinstance(value, Rows):  # the rows' own JSON, as data (no model of them is made)
        return [json.loads(b) for b in value.json_items()]
    return handler(value)


RowList = Annotated[list[M], _RowsOrList()]
"""``list[M]`` that may be held as :class:`Rows` (mypy sees the list; read it as a sequence)."""


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
