"""InferenceRecord: what the agent did on one eval case, one repetition."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from google.adk.evaluation.eval_case import Invocation
from pydantic import Field, model_validator

from evalsnap.records._base import FrozenModel, StoredModel


class ModelUsage(FrozenModel):
    """The usage one model response reported, as the model-boundary plugin saw it."""

    model: str | None = None
    """The model version the response names (None: it names none)."""
    usage: dict[str, Any]
    """Its ``usage_metadata`` (``GenerateContentResponseUsageMetadata`` as JSON)."""


class InferenceRecord(StoredModel):
    """One run of the agent over one eval case (ADK ``InferenceResult`` + session state)."""

    KIND: ClassVar[str] = "inference"
    SCHEMA_VERSION: ClassVar[int] = 1

    inference_fingerprint: str
    """Agent identity + case inputs + repetition + google-adk version."""
    eval_set_id: str
    """The eval set the case came from (informational; not part of the fingerprint)."""
    eval_id: str
    """The eval case id."""
    repetition: int = 0
    """Zero-based repetition index of this case."""
    app_name: str
    """ADK app name the session ran under."""
    agent_name: str
    """Name of the root agent."""
    adk_version: str
    """google-adk version that ran the agent."""
    status: Literal["success", "failure"]
    """``failure`` means the agent raised; such records are never reused."""
    error: str | None = None
    """The exception, when ``status`` is ``failure``."""
    traceback: str | None = None
    """Its traceback (the end of it when long), when the agent or its set-up raised."""
    retryable: bool | None = None
    """Whether a retry could fix the failure (a timeout, 408/429/5xx, a lost connection);
    False: it fails the same way every time, so it was not retried. None: not a failure,
    or recorded before this was decided."""
    attempts: int = 1
    """How many attempts the orchestrator made (Prefect task retries)."""
    invocations: list[Invocation] = Field(default_factory=list)
    """ADK invocations, in turn order."""
    initial_session_state: dict[str, Any] | None = None
    """Actual state before the first turn (for a pinned session: its stored state)."""
    final_session_state: dict[str, Any] | None = None
    """State read back from the session service after the last turn."""
    model_calls: int = 0
    """LLM requests sent to the agent's model(s) during this inference."""
    model_usage: list[ModelUsage] | None = None
    """The usage every model response reported, in order, counted at the same model
    boundary as ``model_calls`` (AgentTool inner runs, sub-agents and retried calls
    included); None in records written before it was counted."""
    agent_manifest: dict[str, Any] | None = None
    """What the agent was (:mod:`evalsnap.agents.identity`): package files, resolved agent
    tree, non-secret ``.env`` keys and declared inputs, by hash where a value could be
    private; the agent identity in ``inference_fingerprint`` is its fingerprint. Never a
    secret value. None in older records."""
    run_id: str = ""
    """The evalsnap run that produced this record."""
    created_at: str = ""
    """UTC ISO timestamp (volatile; excluded from fingerprints)."""

    @model_validator(mode="before")
    @classmethod
    def _migrate(cls, data: Any) -> Any:
        # Records written before state capture carry no state keys: load as None.
        if isinstance(data, dict):
            data.setdefault("initial_session_state", None)
            data.setdefault("final_session_state", None)
        return data

    @property
    def ok(self) -> bool:
        return self.status == "success"

    def content(self) -> dict[str, Any]:
        """What the agent produced: the part of this record scores depend on."""
        return {
            "status": self.status,
            "invocations": [i.model_dump(mode="json") for i in self.invocations],
            "initial_session_state": self.initial_session_state,
            "final_session_state": self.final_session_state,
        }
