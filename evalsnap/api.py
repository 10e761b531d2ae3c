"""The Python API: ``evalsnap.evaluate`` and ``evalsnap.rescore``.

Each runs the same Prefect flow as the command line, in this process (on the server
``PREFECT_API_URL`` names, else on Prefect's temporary local API), and returns the
``--json`` object as a :class:`RunResult`. Bad input raises the typed errors of
:mod:`evalsnap.errors` (``UsageError``, ``EvalSetError``, ``ConfigError``, ...), exactly
where the command line exits 2; a quality failure or an incomplete run is a result, not an
exception (``result.passed``, ``result.complete``, ``result.exit_code``).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator

from evalsnap import errors, settings
from evalsnap.exitcodes import FailOn
from evalsnap.records.record import TokenCounts
from evalsnap.reports.summary_model import (
    CaseResult,
    MetricResult,
    RecordResult,
    RunSummary,
    SuiteResult,
    Summary,
    parts,
)
from evalsnap.spec import RunSpec

if TYPE_CHECKING:
    from evalsnap.pipeline.context import RunContext

__all__ = ["CaseResult", "MetricResult", "RecordResult", "RunResult", "RunSpec", "Tokens",
           "check_store_url", "evaluate", "rescore", "run", "run_spec"]


Tokens = TokenCounts
"""Token counts; a count is None when the model reported none (not zero)."""


class RunResult(BaseModel):
    """What a run or rescore gave: one record per eval set, and the run's verdict (the
    ``--json`` object, :class:`~evalsnap.reports.summary_model.RunSummary`, with a run over
    one eval set's record as ``runs[0]``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str
    complete: bool
    passed: bool
    exit_code: int
    """0 passed, 1 a quality failure, 3 incomplete (the command line's exit code, from
    :mod:`evalsnap.exitcodes`)."""
    agent_calls: int = 0
    judge_calls: int = 0
    reused_judge_samples: int = 0
    reused_units: int = 0
    scored_units: int = 0
    fail_on: str | None = None
    """The gate the exit code was decided under (``fail_on``)."""
    runs: list[RecordResult]
    """One per eval set, in the order given."""

    @model_validator(mode="before")
    @classmethod
    def _one_eval_set(cls, data: Any) -> Any:
        # The --json object of a run over one eval set is that eval set's record itself; the
        # lists of ids of a run over several are its records' (``runs``).
        if isinstance(data, RecordResult | SuiteResult):
            return {name: getattr(data, name) for name in cls.model_fields if name != "runs"} \
                | {"runs": parts(data)}
        if isinstance(data, dict):
            return {key: data[key] for key in cls.model_fields if key in data and key != "runs"} \
                | {"runs": data["runs"] if "runs" in data else [data]}
        return data

    @property
    def cases(self) -> list[tuple[str, CaseResult]]:
        """Every case of every record, with its eval set id."""
        return [(r.eval_set_id, c) for r in self.runs for c in r.cases]

    def problems(self) -> list[str]:
        """One line per unit that did not pass, and per failed inference."""
        lines = []
        for set_id, case in self.cases:
            label = f"{set_id}/{case.eval_id}" + (f" #{case.repetition}" if case.repetition else "")
            if case.inference == "failure":
                lines.append(f"{label}: inference failed")
            for name, m in case.metrics.items():
                if m.status in ("PASSED", "INFORMATIONAL"):
                    continue
                score = "no score" if m.score is None else f"score {m.score:.3f}"
                need = "" if m.threshold is None else f", threshold {m.threshold:g}"
                why = f": {m.reason}" if m.reason else ""
                lines.append(f"{label} · {name}: {m.status} ({score}{need}){why}")
        return lines


def run(spec: RunSpec, *, storage_options: dict[str, str] | None = None) -> RunResult:
    """Runs what ``spec`` asks (a run or a rescore) and returns its result: what
    :func:`evaluate` and :func:`rescore` do once they have built their spec."""
    return RunResult.model_validate(run_spec(spec, storage_options=storage_options))


def run_spec(spec: RunSpec, *, storage_options: dict[str, str] | None = None,
             progress: contextlib.AbstractContextManager[Any] | None = None,
             run_context: RunContext | None = None) -> Summary:
    """Runs the flow of ``spec`` in this process, on the server ``PREFECT_API_URL`` names
    (else on Prefect's own temporary local API); returns its result (the ``--json`` object).

    It leaves the caller's process as it found it: no logger, warning filter, environment
    variable or signal handler is changed (the command line does its own start-up in
    :mod:`evalsnap.startup`). ``storage_options`` stay in this process: they are never a
    flow parameter, so they never reach Prefect's database; they, the progress sink and
    the run's commits travel in the flow's run context (``run_context``, the caller's who
    listens to its progress or watches its commits: the CLI's; else a new one)."""
    from evalsnap.pipeline import context

    spec = _for_flow(spec)
    ctx = run_context or context.RunContext(spec.store, storage_options=storage_options)
    # the summary's model comes back in the context (not as JSON data too), for this run only
    ctx.keeps_summary, ctx.summary = True, None
    if spec.kind == "rescore":
        from flows.rescore import rescore as flow_fn
    else:
        from flows.evaluate import evaluate as flow_fn
    from prefect import settings as prefect_settings

    heartbeat = getattr(prefect_settings, "PREFECT_FLOWS_HEARTBEAT_FREQUENCY", None)
    try:
        with progress or contextlib.nullcontext(), _no_heartbeat(prefect_settings, heartbeat), \
                context.given(ctx):
            return flow_result(flow_fn(**spec.flow_parameters(), return_state=True), ctx)
    finally:
        ctx.keeps_summary, ctx.summary = False, None


#: ``scheme://user:password@`` or ``scheme://user@`` — credentials written into a URL (a
#: password may hold ``/``, as AWS secret keys do; a path that holds ``@`` is no user part).
_USERINFO = re.compile(r"^([a-z][a-z0-9+.-]*://)(?:[^/@?#:]*:[^@]*|[^/@?#:]*)@", re.IGNORECASE)
_CREDENTIALS_HINT = {
    "s3": "the environment (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE) or "
          "--storage-option key=… --storage-option secret=…",
    "gs": "the environment (GOOGLE_APPLICATION_CREDENTIALS) or --storage-option token=…",
}


def check_store_url(url: Any) -> None:
    """Refuses a store URL that holds credentials (``s3://KEY:SECRET@bucket/p``) before any
    flow starts: the store URL is a flow parameter, and Prefect stores every flow run's
    parameters in its database. The message names where credentials go instead."""
    found = _USERINFO.match(url) if isinstance(url, str) else None
    if found is None:
        return
    scheme = found.group(1)[:-3].lower()
    hint = _CREDENTIALS_HINT.get("s3" if scheme in ("s3", "s3a") else
                                 "gs" if scheme in ("gs", "gcs") else "",
                                 "the environment variables of the backend or --storage-option "
                                 "KEY=VALUE (EVALSNAP_STORE holds a URL, not credentials)")
    shown = found.group(1) + "***@" + url[found.end():]
    raise errors.UsageError(
        f"the store URL {shown!r} holds credentials (the part before '@'): a store URL is "
        "recorded as a Prefect flow parameter, in Prefect's database, so it must not hold a "
        f"secret. Give the credentials through {hint}, and the URL without them "
        f"({found.group(1) + url[found.end():]!r}).")


def flow_result(state: Any, ctx: Any = None) -> Summary:
    """The summary a flow run returned (its ``--json`` object, read as its model): also when
    the gate (``fail_on``) made it end Failed, since the flow returns its ``Failed`` state
    with the summary as its data; an exception the flow raised (a typed error) is raised
    here. With the run's context ``ctx`` (``keeps_summary``), the model the flow left
    there (the flow returned only the summary's head)."""
    summary = None
    if state.is_failed():
        from tasks.support import summary_of_failed

        summary = summary_of_failed(state.result(raise_on_failure=False))
    if summary is None:
        summary = state.result()  # raises what the flow raised
    if ctx is not None and ctx.summary is not None:
        found, ctx.summary = ctx.summary, None
        return found  # type: ignore[no-any-return]
    return RunSummary.model_validate(summary).root


def _for_flow(spec: RunSpec) -> RunSpec:
    """``spec`` as :func:`run_spec` hands it to a flow: the store and the runner resolved."""
    from evalsnap.pipeline.runners import resolve_runner

    spec = spec.model_copy(update={"store": spec.store or settings.get().store})
    check_store_url(spec.store)
    task_runner, dask_address = resolve_runner(spec.task_runner, spec.dask_address)
    return spec.model_copy(update={"task_runner": task_runner, "dask_address": dask_address})


def prepare(spec: RunSpec, ctx: RunContext) -> None:
    """Does the first steps of the flow :func:`run_spec` will run for ``spec`` with ``ctx``
    now (the CLI calls it while Prefect's temporary API starts, ~1 s it would otherwise
    wait): the plan (eval sets, agent, config, baseline) and, for ``--reuse``, the proof of
    what the previous record implies (:func:`evalsnap.pipeline.hints.prime`). The flow takes
    them from ``ctx`` when its spec is this one, else plans itself; an error planning raised
    is raised by the flow, as if it had planned then. Only for a run on a local store: a
    hanging bucket would make a failing run wait twice."""
    if spec.kind != "run":
        return
    try:
        spec = _for_flow(spec)
    except errors.EvalsnapError:
        return  # run_spec says so
    if "://" in spec.store and not spec.store.startswith("file://"):
        return
    from evalsnap.pipeline import hints
    from evalsnap.pipeline.plan import plan_runs
    from evalsnap.reports import lastgood
    from tasks.support import resolved

    expected = resolved(RunSpec.of_flow("run", **spec.flow_parameters()))
    if not ctx.serves(expected.store):
        return
    ctx.start_run_early()
    try:
        plans: Any = plan_runs(expected, ctx, good=lastgood.is_good)
        if expected.reuse and not expected.force:
            for plan in plans:
                hints.prime(ctx.store, plan.eval_set.eval_set_id)
    except Exception as exc:  # noqa: BLE001 - the flow raises it, as if it had planned
        plans = exc
    ctx.begin_run_early(expected, plans)


def read_ahead(ctx: RunContext, go_on: Any) -> None:
    """For a ``--reuse`` run :func:`prepare` planned: what its pages will read of the cases
    they detail, read now from each eval set's previous record
    (:func:`evalsnap.reports.html.read_ahead`) while ``go_on()`` says so (the CLI: while
    Prefect's temporary API starts). Only ahead of time: anything that fails here is left
    to the flow, which reads the same objects."""
    prepared = ctx.prepared()
    if prepared is None or isinstance(prepared[1], BaseException):
        return
    spec, plans = prepared
    if not spec.reuse or spec.force:
        return
    from evalsnap.records import EvaluationRecord, repo
    from evalsnap.reports import html

    for plan in plans:
        if not go_on():
            return
        try:
            record_oid = repo.latest_record_for(ctx.store, plan.eval_set.eval_set_id)
            if record_oid is not None:
                html.read_ahead(ctx.store, repo.get(ctx.store, EvaluationRecord, record_oid),
                                go_on)
        except Exception:  # noqa: BLE001, S112 - only ahead of time (see above)
            continue


@contextlib.contextmanager
def _no_heartbeat(prefect_settings: Any, heartbeat: Any) -> Iterator[None]:
    """A sync flow run otherwise spends ~1 s joining its heartbeat thread."""
    if heartbeat is None:
        yield
        return
    with prefect_settings.temporary_settings({heartbeat: None}):
        yield


def evaluate(agent_dir: str, evalset: str | list[str], *, config: str | None = None,
             store: str | None = None, storage_options: dict[str, str] | None = None,
             reuse: bool = False, force: bool = False, metrics: list[str] | None = None,
             cases: list[str] | None = None, repetitions: int = 1,
             agent_name: str | None = None, initial_session_file: str | None = None,
             concurrency: int = 8, task_runner: str | None = None,
             dask_address: str | None = None, baseline: str | None = None,
             tolerance: float = 0.0, fail_on: FailOn = "quality",
             framework: Literal["adk", "langgraph"] | None = None, repetition_gate: str = "mean",
             alpha: float = 0.05, until_stable: int | None = None) -> RunResult:
    """``evalsnap run`` as a function: runs the agent, freezes, scores, publishes.

    ``evalset`` takes what the command line takes (a file, ``FILE:ID,ID``, an eval set id
    of the agent, a directory of ``*.test.json`` files, or a list of them). ``baseline``
    (a run or record id, or ``latest``) adds regressions and fixes; ``fail_on`` sets
    ``exit_code`` as ``--fail-on`` does (the result is returned either way). The other
    arguments are the fields of :class:`~evalsnap.spec.RunSpec` of the same names.
    """
    return run(RunSpec(
        kind="run", agent_dir=str(agent_dir),
        evalsets=[str(e) for e in ([evalset] if isinstance(evalset, str) else evalset)],
        config=config, store=store or settings.get().store, reuse=reuse, force=force,
        metrics=metrics, cases=cases, repetitions=repetitions, until_stable=until_stable,
        concurrency=concurrency,
        task_runner=task_runner, dask_address=dask_address, agent_name=agent_name,
        initial_session_file=initial_session_file, baseline=baseline, tolerance=tolerance,
        fail_on=fail_on, framework=framework or None, repetition_gate=repetition_gate,
        alpha=alpha), storage_options=storage_options)


def rescore(run_or_snapshot: str, *, evalset: str | None = None, config: str | None = None,
            store: str | None = None, storage_options: dict[str, str] | None = None,
            reuse: bool = False, force: bool = False, metrics: list[str] | None = None,
            cases: list[str] | None = None, code_paths: list[str] | None = None,
            agent: str | None = None, agent_name: str | None = None, concurrency: int = 8,
            task_runner: str | None = None, dask_address: str | None = None,
            baseline: str | None = None, tolerance: float = 0.0,
            fail_on: FailOn = "quality", repetition_gate: str = "mean",
            alpha: float = 0.05) -> RunResult:
    """``evalsnap rescore`` as a function: scores frozen inference again; never calls the
    agent (``baseline`` and ``fail_on`` as for :func:`evaluate`)."""
    return run(RunSpec(
        kind="rescore", source=run_or_snapshot, evalsets=[evalset] if evalset else [],
        config=config, store=store or settings.get().store, reuse=reuse, force=force,
        metrics=metrics, cases=cases, code_paths=list(code_paths or []), agent_dir=agent,
        agent_name=agent_name, concurrency=concurrency, task_runner=task_runner,
        dask_address=dask_address, baseline=baseline, tolerance=tolerance, fail_on=fail_on,
        repetition_gate=repetition_gate, alpha=alpha), storage_options=storage_options)
