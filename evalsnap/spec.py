"""What a run is asked to do: :class:`RunSpec`, built once and passed down whole.

Three front doors take a run's options: the command line (``evalsnap run`` / ``rescore``),
the Python API (:func:`evalsnap.api.evaluate` / :func:`~evalsnap.api.rescore`) and the
Prefect flows (their flat parameters are what a person fills in on the UI's form). Each
builds one :class:`RunSpec` from what it was given and hands it on whole: the CLI and the API
to :func:`evalsnap.api.run` (which starts the flow with :meth:`RunSpec.flow_parameters`),
the flows to the plan (:func:`evalsnap.pipeline.plan.plan_runs` and ``plan_rescore``), which
reads every option from it. An option is named here once; a new one is a field here, a
parameter of each front door, and nothing in between.

What a spec never holds: credentials. A spec becomes a flow run's parameters, which Prefect
keeps in its database; storage options (keys, tokens) travel beside it
(``storage_options`` of :func:`evalsnap.api.run`), and a store URL with credentials in it is
refused before any flow starts (:func:`evalsnap.api.check_store_url`).

Pure and light: pydantic only (the CLI builds a spec before it imports ADK or Prefect).
"""

from __future__ import annotations

import datetime as dt
import secrets
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from evalsnap.exitcodes import FailOn

__all__ = ["RunOptions", "RunSpec", "new_run_id"]

Kind = Literal["run", "rescore"]


class RunSpec(BaseModel):
    """One run or rescore, as asked: what is evaluated, which part, where it is stored, how
    it reuses, what it is compared with, when it fails, and where its tasks run.

    Paths are as given (the flows resolve relative ones against the flow run's working
    directory); ``None`` or an empty list means the default the field names.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Kind = "run"
    """``run`` (the agent runs) or ``rescore`` (frozen inference is scored again)."""

    # ---- what is evaluated --------------------------------------------------------------
    agent_dir: str | None = None
    """run: the agent package (ADK or LangGraph); rescore: ``--agent``, the package imported
    first in every process that scores (what it registers is there), never called."""
    agent_name: str | None = None
    """A sub-agent of the tree (ADK) or a graph of ``langgraph.json``; None: the root."""
    framework: Literal["adk", "langgraph"] | None = None
    """None: detected from the package."""
    evalsets: list[str] = Field(default_factory=list)
    """run: the eval sets as ``adk eval`` names them (a file, ``FILE:ID,ID``, an eval set id
    of the agent, a directory of ``*.test.json``), one or more; rescore: the edited eval set,
    if any (none: the frozen references)."""
    source: str | None = None
    """rescore: the run, record or snapshot scored again (or ``latest``)."""
    config: str | None = None
    """``test_config.json``; None: the one beside each eval set (a rescore without an eval
    set: the frozen rules)."""
    initial_session_file: str | None = None
    """Initial session state of old-format ``*.test.json`` files (``AgentEvaluator``'s)."""
    code_paths: list[str] = Field(default_factory=list)
    """rescore: directories to import custom metrics from."""

    # ---- which part ---------------------------------------------------------------------
    metrics: list[str] | None = None
    """Only these metrics; None: every metric of the config (else the run is a subset)."""
    cases: list[str] | None = None
    """Only these eval ids; None: every case (else the run is a subset)."""
    repetitions: int = 1
    """Runs of the agent per case (checked by the plan: 1 or more)."""
    until_stable: int | None = None
    """run: after ``repetitions``, more repetitions for the cases whose pass rate is still
    in doubt, up to this many per case (:mod:`evalsnap.pipeline.stability`); None: off."""

    # ---- where, and how it reuses -------------------------------------------------------
    store: str = ""
    """The store URL: a local path, ``s3://…``, ``gs://…``, ``memory://…``; empty: the one
    store setting, ``EVALSNAP_STORE``, else ``.evalsnap``."""
    reuse: bool = False
    """Reuse complete, compatible earlier work (inference, units, judge answers)."""
    force: bool = False
    """Score every unit again although a reusable one exists."""

    # ---- what it is compared with, and when it fails ------------------------------------
    baseline: str | None = None
    """A run or record id of the same eval set, ``latest`` or ``last-good``; None: no
    comparison."""
    tolerance: float = 0.0
    """With a baseline: a score drop beyond this is a regression too."""
    alpha: float = 0.05
    """With repetitions on both sides: the significance level of a regression."""
    repetition_gate: str = "mean"
    """How the repetitions of a case × metric pass: ``mean``, ``every``, ``rate:P``."""
    fail_on: FailOn = "quality"
    """Which outcome fails the run (exit code, flow run state)."""

    # ---- where the tasks run ------------------------------------------------------------
    concurrency: int = 8
    """Cases run at once per inference task, and units scored at once per metric task."""
    task_runner: str | None = None
    """``threads`` or ``dask``; None: ``EVALSNAP_TASK_RUNNER``, else threads."""
    dask_address: str | None = None
    """An existing Dask scheduler; None: ``EVALSNAP_DASK_ADDRESS``, else none."""

    def run_options(self) -> RunOptions:
        """The options of one run of a plan of this spec (a new run id each call)."""
        return RunOptions(kind=self.kind, reuse=self.reuse, force=self.force,
                          concurrency=self.concurrency)

    def flow_parameters(self) -> dict[str, Any]:
        """The flat parameters of this spec's flow (``evalsnap-evaluate`` or
        ``evalsnap-rescore``), as the UI's form has them; :meth:`of_flow` reads them back."""
        common = {"config": self.config, "store": self.store, "reuse": self.reuse,
                  "force": self.force, "metrics": self.metrics, "cases": self.cases,
                  "concurrency": self.concurrency, "task_runner": self.task_runner,
                  "dask_address": self.dask_address, "agent_name": self.agent_name,
                  "baseline": self.baseline or "", "tolerance": self.tolerance,
                  "fail_on": self.fail_on, "repetition_gate": self.repetition_gate,
                  "alpha": self.alpha}
        if self.kind == "rescore":
            return {"run_or_snapshot": self.source,
                    "evalset": self.evalsets[0] if self.evalsets else None,
                    "code_paths": self.code_paths, "agent": self.agent_dir, **common}
        return {"agent_dir": self.agent_dir,
                "evalset": self.evalsets[0] if len(self.evalsets) == 1 else self.evalsets,
                "repetitions": self.repetitions, "until_stable": self.until_stable or 0,
                "initial_session_file": self.initial_session_file,
                "framework": self.framework or "", **common}

    @classmethod
    def of_flow(cls, kind: Kind, **params: Any) -> RunSpec:
        """The spec of a flow run, from its flat parameters (the form's "" is None, a
        comma-separated text is a list; ``default`` is no runner chosen)."""
        def text(value: Any) -> str | None:
            return None if value in (None, "", "default") else str(value)

        def listed(value: Any) -> list[str] | None:
            if isinstance(value, list | tuple):
                found = [str(v).strip() for v in value if str(v).strip()]
            else:
                found = [n.strip() for n in str(value or "").split(",") if n.strip()]
            return found or None

        evalset = params.pop("evalset", None)
        evalsets = ([str(e) for e in evalset] if isinstance(evalset, list | tuple)
                    else [evalset] if evalset else [])
        fields: dict[str, Any] = {
            "kind": kind, "evalsets": evalsets, "store": params.pop("store"),
            "metrics": listed(params.pop("metrics", None)),
            "cases": listed(params.pop("cases", None)),
            "code_paths": listed(params.pop("code_paths", None)) or [],
            "source": text(params.pop("run_or_snapshot", None)),
            "agent_dir": text(params.pop("agent_dir", None) or params.pop("agent", None)),
        }
        for name in ("config", "agent_name", "initial_session_file", "baseline", "framework",
                     "task_runner", "dask_address"):
            if name in params:
                fields[name] = text(params.pop(name))
        params.pop("agent", None)
        if "until_stable" in params:  # the form's 0 is off
            fields["until_stable"] = params.pop("until_stable") or None
        return cls(**fields, **params)


class RunOptions(BaseModel):
    """One run of a plan: its id and how it reuses (one per eval set of a spec)."""

    model_config = ConfigDict(frozen=True)

    run_id: str = Field(default_factory=lambda: new_run_id())
    kind: Kind = "run"
    reuse: bool = False
    force: bool = False
    concurrency: int = 8


def new_run_id() -> str:
    """``20261202T031500Z-a1b2c3``: sortable by time, unique."""
    return f"{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S}Z-{secrets.token_hex(3)}"
