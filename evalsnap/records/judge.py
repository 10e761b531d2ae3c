"""LedgerEntry: one judge request (one sample, one attempt) and what came back."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field

from evalsnap.records._base import StoredModel


class LedgerEntry(StoredModel):
    """An auditable judge call. Never holds credentials, API keys or HTTP headers."""

    KIND: ClassVar[str] = "judge"
    VOLATILE: ClassVar[frozenset[str]] = frozenset({"run_id", "created_at"})
    SCHEMA_VERSION: ClassVar[int] = 1

    metric_name: str
    """Metric whose evaluator asked the judge."""
    eval_id: str
    repetition: int = 0
    invocation_index: int | None = None
    """Actual invocation the call judged (None when it cannot be attributed)."""
    role: str = "judge"
    """``judge`` for single-prompt evaluators; ``segmenter``/``validator`` for hallucinations_v1."""
    sample_index: int
    """0-based sample of this exact request within the unit (``numSamples`` repeats)."""
    attempt: int = 1
    """1-based attempt of this sample (transient errors are retried; each attempt is an entry)."""
    request_key: str
    """sha256 of (judge model, rendered contents, generation config): the reuse key with
    ``sample_index``."""
    judge_model: dict[str, Any]
    """Judge identity: ``model`` (the requested id) and ``class`` (the BaseLlm that served it)."""
    generation_config: dict[str, Any] | None = None
    """The request's GenerateContentConfig without ``http_options`` (transport, headers)."""
    request: dict[str, Any]
    """The rendered request: ``contents`` as sent."""
    raw_response: str | None = None
    """The judge's answer text, verbatim; None when the call raised."""
    error: str | None = None
    """The exception the call raised (type and message), or why replay refused it."""
    parsed: dict[str, Any] | None = None
    """What the evaluator's own parser made of ``raw_response`` (label, verdicts, score,
    rationale)."""
    parse_ok: bool = False
    """False when the call failed or the parser found no score/label in the answer."""
    usage_metadata: dict[str, Any] | None = None
    """Token usage the judge reported for this call (the response's usage metadata, JSON);
    None when it reported none, the call raised, or the answer came from the ledger."""
    model_version: str | None = None
    """The model version the judge's response names, when it names one."""
    evaluator: str
    """Class path of the evaluator that asked."""
    aggregation_version: str
    """``adk-<version>/<class>``: the parsing and aggregation code in force."""
    source: Literal["model", "ledger"] = "model"
    """``model``: a live judge call; ``ledger``: answered from an earlier entry (``--reuse``)."""
    reused_from: str | None = None
    """Object id of the entry this answer was taken from, when ``source`` is ``ledger``."""
    run_id: str = ""
    created_at: str = ""
    """``run_id`` and ``created_at`` are VOLATILE: never stored (empty when read back)."""
    extra: dict[str, Any] = Field(default_factory=dict)
    """Evaluator-specific details (e.g. the number of samples requested)."""

    @property
    def failed(self) -> bool:
        return self.error is not None or not self.parse_ok
