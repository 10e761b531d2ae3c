"""Snapshot: the frozen, self-contained input of scoring."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from evalsnap.records._base import FrozenModel, StoredModel
from evalsnap.records.record import InferenceKey
from evalsnap.rows import RowGroups, RowList


class EvaluatorIdentity(FrozenModel):
    """What implements a metric. Part of the rule fingerprint."""

    kind: Literal["builtin", "custom_function", "custom_class"]
    """How the metric is provided."""
    name: str
    """Class path (built-ins, classes) or function import path (custom functions)."""
    adk_version: str | None = None
    """google-adk version, for built-in evaluators."""
    template_hash: str | None = None
    """sha256 of the judge prompt template(s), for LLM-as-judge evaluators."""
    version: str | None = None
    """Trusted implementation version declared in the config (custom metrics)."""

    @property
    def trusted(self) -> bool:
        """Whether a stored score may be reused automatically."""
        return self.kind == "builtin" or self.version is not None


class MetricRule(FrozenModel):
    """One metric with everything resolved: criterion with defaults, evaluator identity."""

    metric_name: str
    """Name under ``criteria``."""
    threshold: float
    """Pass threshold (``criterion.threshold``)."""
    criterion: dict[str, Any]
    """The criterion with defaults filled in (judge model and options, match type…)."""
    evaluator: EvaluatorIdentity
    """Who computes the metric."""
    metric_info: dict[str, Any] = Field(default_factory=dict)
    """ADK MetricInfo (value interval, description)."""
    judge: bool = False
    """Whether the evaluator calls a judge model."""
    rule_fingerprint: str
    """Fingerprint of (metric name, criterion, evaluator identity)."""


class FrozenCase(InferenceKey):
    """One case × repetition: the inference it refers to and the full reference."""

    inference_ok: bool
    reference: dict[str, Any]
    """The full ADK EvalCase as given (conversation or scenario, rubrics, final state)."""
    case_fingerprint: str
    """Fingerprint of (inference content, reference case)."""


class Snapshot(StoredModel):
    """Immutable scoring input; scoring never reads the eval set file again."""

    KIND: ClassVar[str] = "snapshot"
    VOLATILE: ClassVar[frozenset[str]] = frozenset({"created_at"})
    ROWS: ClassVar[dict[str, type[FrozenModel]]] = {"cases": FrozenCase}
    SCHEMA_VERSION: ClassVar[int] = 1

    eval_set_id: str
    """ADK eval set id."""
    eval_set_name: str | None = None
    app_name: str
    """Agent package name."""
    adk_version: str
    cases: RowList[FrozenCase]
    """Frozen cases, in eval set order: a snapshot read from the store holds them as
    :class:`~evalsnap.rows.Rows` (each case's JSON, past a few MB in a temporary file; a
    case is parsed when it is read), not as 30,000 parsed references."""
    rules: list[MetricRule]
    """Resolved scoring rules, in config order."""
    packs: list[str] = []
    """Packs holding copies of the cases' inference records (:mod:`evalsnap.records.pack`),
    so that a scoring process reads a few packs, not a record per case."""
    created_at: str = ""
    """UTC ISO timestamp: VOLATILE, never stored."""

    def by_key(self) -> RowGroups[tuple[str, int], FrozenCase]:
        """The cases by (eval id, repetition) (``first``), each parsed when it is looked up."""
        return cases_by_key(self)

    def rule(self, metric_name: str) -> MetricRule:
        for rule in self.rules:
            if rule.metric_name == metric_name:
                return rule
        raise KeyError(metric_name)


def cases_by_key(snapshot: Snapshot | None) -> RowGroups[tuple[str, int], FrozenCase]:
    """A snapshot's cases by (eval id, repetition), each read when looked up (``first``);
    none without a snapshot."""
    return RowGroups(snapshot.cases if snapshot is not None else [],
                     lambda c: (c.eval_id, c.repetition))
