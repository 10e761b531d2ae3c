"""The nightly evaluation flow: inference → freeze → score → publish, then the gate."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from prefect import flow
from prefect.runtime import flow_run
from pydantic import Field, WithJsonSchema

from evalsnap import startup
from evalsnap.pipeline import context, hints, runners, stability
from evalsnap.pipeline.outcomes import InferenceOutcome, UnitOutcome
from evalsnap.pipeline.plan import Plan, plan_runs
from evalsnap.records.record import CaseStability
from evalsnap.reports import lastgood
from evalsnap.reports.artifacts import RunProgress
from evalsnap.reports.regressions import FailOn
from evalsnap.reports.suite import combined
from evalsnap.reports.summary_model import RecordResult
from evalsnap.rows import Rows
from evalsnap.spec import RunOptions, RunSpec
from tasks import freeze_task, publish_task, run_inference, run_scoring, scoring_pool
from tasks.support import (
    STORE_DEFAULT,
    Names,
    Text,
    as_data,
    finish,
    rename_flow_run,
    resolved,
    run_name,
    tag_flow_run,
    with_parameter_docs,
)

#: Where relative paths of a deployment's parameters start (said in every path's help).
RELATIVE = "relative paths start at the flow run's working directory (a deployment's: the project directory)"
RunnerChoice = Literal["default", "threads", "dask"]

# The parameters both flows (evaluate and rescore) take, as the UI's form shows them.
StoreParam = Annotated[str, Field(description=(
    f"Store URL: a local path, s3://…, gs://…; empty: {STORE_DEFAULT}; {RELATIVE}"))]
DaskAddressParam = Annotated[Text, Field(
    description="Existing Dask scheduler, e.g. tcp://10.0.0.5:8786 (implies dask); "
                "empty: $EVALSNAP_DASK_ADDRESS, else none")]
BaselineParam = Annotated[Text, Field(description=(
    "Compare with this earlier run or record of the same eval set and list "
    "regressions and fixes; 'latest' = the newest full run of the eval set; "
    "'last-good' = the newest full run of it that passed its own gate (fail_on) "
    "or that someone accepted (evalsnap accept RUN); empty: no comparison"))]
ToleranceParam = Annotated[float, Field(ge=0, description=(
    "With a baseline: a score drop of more than this also counts as a regression "
    "(0: only PASSED → FAILED and complete → incomplete do)"))]
FailOnParam = Annotated[FailOn, Field(description=(
    "When the flow run ends Failed (after the record is published): quality = a "
    "quality failure or an incomplete run (the CLI's exit code), incomplete = only "
    "an incomplete run, regression = only a regression against the baseline, never"))]
GateParam = Annotated[str, Field(description=(
    "How the repetitions of a case × metric pass: mean = ADK AgentEvaluator's rule "
    "(the mean of the per-invocation scores of all repetitions against the "
    "threshold), every = every repetition passed, rate:P = a pass rate of at least P"))]
AlphaParam = Annotated[float, Field(gt=0, lt=1, description=(
    "With a baseline and at least 2 repetitions on both sides: a change of a case's "
    "pass count is a regression (or fix) only when Fisher's exact test gives a "
    "p-value below this"))]


def _evalset_label(given: Any) -> str:
    first = str(given[0] if isinstance(given, list) and given else given or "eval")
    label = first.split(":")[0].rstrip("/").rsplit("/", 1)[-1]
    label = label.removesuffix(".evalset.json").removesuffix(".test.json").removesuffix(".json")
    return label + (f"+{len(given) - 1}" if isinstance(given, list) and len(given) > 1 else "")


def _run_name() -> str:
    params = flow_run.parameters or {}
    evalset = params.get("evalset", "eval")
    subset = bool(params.get("cases") or params.get("metrics")) or any(
        ":" in str(e) for e in (evalset if isinstance(evalset, list) else [evalset]))
    return run_name(_evalset_label(evalset), not subset)


@flow(name="evalsnap-evaluate", flow_run_name=_run_name, log_prints=False,
      validate_parameters=True, task_runner=runners.thread_runner())
@with_parameter_docs
def evaluate(
    agent_dir: Annotated[str, Field(description=(
        "Agent package directory: ADK (exposes root_agent, app or get_agent_async) or "
        f"LangGraph (exposes graph, or has a langgraph.json); {RELATIVE}"))],
    evalset: Annotated[str | list[str], WithJsonSchema({"type": "string"}), Field(description=(
        "Eval set, as adk eval names it: an .evalset.json file, FILE:ID,ID, an eval set id "
        "of the agent, or a directory of *.test.json files (each scored with the "
        f"test_config.json of its folder; the CLI and Python API take several); {RELATIVE}"))],
    config: Annotated[Text, Field(description=(
        f"test_config.json; empty: the one beside each eval set; {RELATIVE}"))] = "",
    store: StoreParam = "",
    reuse: Annotated[bool, Field(description="Reuse complete, compatible earlier work")] = False,
    force: Annotated[bool, Field(description="Score every unit again even if reusable")] = False,
    metrics: Annotated[Names, Field(description=(
        "Only these metrics, comma-separated (e.g. response_match_score,final_state_match); "
        "empty: every metric of the config"))] = "",
    cases: Annotated[Names, Field(description=(
        "Only these eval_ids, comma-separated; empty: every case. A run of some cases or "
        "metrics is a subset: never 'latest', never a default baseline"))] = "",
    repetitions: Annotated[int, Field(description=(
        "Runs of the agent per case (1 or more)"))] = 1,
    until_stable: Annotated[int, Field(ge=0, description=(
        "After the repetitions, more only for the cases whose pass rate is still in doubt "
        "(its 95% interval holds the gate's line, or the baseline's rate), up to this many "
        "per case; 0: off"))] = 0,
    concurrency: Annotated[int, Field(ge=1, description=(
        "Cases run at once per inference task, and units scored at once per metric task "
        "(model calls stay within the Prefect limits evalsnap-agent-model and "
        "evalsnap-judge-model, where they exist)"))] = 8,
    task_runner: Annotated[RunnerChoice, Field(
        description="Where tasks run: threads in the flow's process, or dask (a local "
                    "cluster of worker processes, or the scheduler at dask_address); "
                    "default: $EVALSNAP_TASK_RUNNER, else threads")] = "default",
    dask_address: DaskAddressParam = "",
    agent_name: Annotated[Text, Field(
        description="Evaluate this sub-agent of the tree; empty: the root agent")] = "",
    initial_session_file: Annotated[Text, Field(description=(
        "Initial session state for old-format *.test.json files (AgentEvaluator's "
        f"initial_session_file); empty: the initial.session.json beside them; {RELATIVE}"))] = "",
    baseline: BaselineParam = "",
    tolerance: ToleranceParam = 0.0,
    fail_on: FailOnParam = "quality",
    repetition_gate: GateParam = "mean",
    alpha: AlphaParam = 0.05,
    framework: Annotated[Literal["", "adk", "langgraph"], Field(description=(
        "The agent's framework; empty: detected (a package exposing graph, or a "
        "langgraph.json, is LangGraph)"))] = "",
) -> Any:
    """Runs the agent on every case, freezes a snapshot, scores each metric, publishes:
    one record per eval set; the flow run ends Failed when ``fail_on`` says so."""
    spec = resolved(RunSpec.of_flow("run", **locals()))  # the parameters, and nothing else yet
    with context.started(spec.store) as ctx:  # the run's store, limiter, progress, commits
        plans = (ctx.take_prepared(spec)  # planned while the CLI waited for the API
                 or plan_runs(spec, ctx, good=lastgood.is_good))
        tag_flow_run("evalsnap", *(f"evalset:{p.eval_set.eval_set_id}" for p in plans))
        rename_flow_run(_evalset_label([p.eval_set.eval_set_id for p in plans]),
                        all(p.coverage().full for p in plans))
        with runners.task_runner_scope(spec.task_runner, spec.dask_address,
                                       ctx.settings) as runner:
            results = [_evaluate(plan, spec.run_options(), runner) for plan in plans]
        return finish(combined(results), spec.fail_on, plans[0].store_url, ctx)


def _evaluate(plan: Plan, run: RunOptions, runner: str) -> RecordResult:
    """One eval set: inference → freeze → score → publish."""
    with RunProgress(plan.inference_total + len(plan.metric_names) + 1,
                     f"{plan.eval_set.eval_set_id}: inference, scoring, publish") as progress:
        return _stages(plan, run, runner, progress)


def _stages(plan: Plan, run: RunOptions, runner: str, progress: RunProgress) -> RecordResult:
    """:func:`_evaluate`'s tasks, their progress in ``progress``."""
    if run.reuse and not run.force:  # prove in bulk what the previous record implies
        hints.prime(plan.context.store, plan.eval_set.eval_set_id)  # once (maybe prepared)
    with scoring_pool(plan, run, runner) as pool:
        outcomes = run_inference(plan.inference_batches(run), progress)
        startup.give_back_freed()  # the inference batches
        snapshot_oid = freeze_task(as_data(plan.freeze_request(outcomes)))
        if plan.until_stable is None:  # the snapshot has them: scoring and publish read it
            plan.release_cases()
        startup.give_back_freed()  # the eval set and freeze's parse of it
        units = run_scoring(plan.score_requests(run, snapshot_oid), progress, pool)
        startup.give_back_freed()  # the scoring tasks' chunks
        if plan.until_stable is not None:
            outcomes, units, snapshot_oid = _until_stable(plan, run, progress, pool, outcomes,
                                                          units, snapshot_oid)
            plan.release_cases()
        request = plan.publish_request(run, snapshot_oid, outcomes, units)
        del outcomes, units  # the request's now: publish lets them go once the record has them
        result = publish_task(as_data(request))
    progress.advance()  # published
    return result


def _until_stable(plan: Plan, run: RunOptions, progress: RunProgress, pool: Any,
                  outcomes: Rows[InferenceOutcome], units: Rows[UnitOutcome],
                  snapshot_oid: str) -> tuple[Rows[InferenceOutcome], Rows[UnitOutcome], str]:
    """``--until-stable``: rounds of more repetitions for the cases in doubt (each round
    infers, freezes and scores only its own repetitions), then one snapshot of them all for
    the record (:mod:`evalsnap.pipeline.stability`)."""
    rates = stability.baseline_rates(plan.context.store,
                                     plan.baseline.record_oid if plan.baseline else None)
    thresholds = {r.metric_name: r.threshold for r in plan.selected_rules()}
    reps = dict.fromkeys(plan.case_ids, plan.repetitions)
    decided: dict[str, CaseStability] = {}
    while True:
        failed = {(o.eval_id, o.repetition) for o in outcomes if o.status != "success"}
        more, stopped = stability.next_round(
            units, failed, {c: n for c, n in reps.items() if c not in decided},
            gate=plan.repetition_gate, thresholds=thresholds, baseline_rates=rates,
            step=plan.repetitions, maximum=plan.until_stable or plan.repetitions)
        decided.update(stopped)
        if not more:
            break
        progress.grow(sum(more.values()) + len(plan.metric_names))
        new = run_inference(plan.inference_batches(
            run, {c: range(reps[c], reps[c] + k) for c, k in more.items()}), progress)
        round_oid = freeze_task(as_data(plan.freeze_request(new)))
        units = units + run_scoring(plan.score_requests(run, round_oid), progress, pool)
        outcomes = outcomes + new
        for case_id, k in more.items():
            reps[case_id] += k
    plan.stability = {c: decided[c] for c in plan.case_ids}
    if sum(reps.values()) > plan.inference_total:  # the record's snapshot: every repetition
        snapshot_oid = freeze_task(as_data(plan.freeze_request(outcomes)))
    return outcomes, units, snapshot_oid
