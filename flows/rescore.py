"""The rescore flow: score frozen inference again with new references or rules."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from prefect import flow
from prefect.runtime import flow_run
from pydantic import Field

from evalsnap.pipeline import context, hints, runners
from evalsnap.pipeline.plan import plan_rescore
from evalsnap.reports import lastgood
from evalsnap.reports.artifacts import RunProgress
from evalsnap.spec import RunSpec
from flows.evaluate import (
    RELATIVE,
    AlphaParam,
    BaselineParam,
    DaskAddressParam,
    FailOnParam,
    GateParam,
    RunnerChoice,
    StoreParam,
    ToleranceParam,
)
from tasks import freeze_task, publish_task, run_scoring
from tasks.support import (
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


def _run_name() -> str:
    params = flow_run.parameters or {}
    source = str(params.get("run_or_snapshot", ""))[:24]
    subset = bool(params.get("cases") or params.get("metrics"))
    return run_name(f"rescore-{source}", False if subset else None)


@flow(name="evalsnap-rescore", flow_run_name=_run_name, validate_parameters=True,
      task_runner=runners.thread_runner())
@with_parameter_docs
def rescore(
    run_or_snapshot: Annotated[str, Field(description=(
        "Run id, record id, snapshot id, or 'latest' (the newest run that covers its whole "
        "eval set and config)"))],
    evalset: Annotated[Text, Field(description=(
        f"Edited .evalset.json; empty: the frozen references; {RELATIVE}"))] = "",
    config: Annotated[Text, Field(description=(
        f"test_config.json; empty: the one beside the eval set, else the frozen rules; {RELATIVE}"))] = "",
    store: StoreParam = "",
    reuse: Annotated[bool, Field(description="Reuse complete, compatible earlier units")] = True,
    force: Annotated[bool, Field(description="Score every unit again")] = False,
    metrics: Annotated[Names, Field(description=(
        "Only these metrics, comma-separated; empty: every metric"))] = "",
    cases: Annotated[Names, Field(description=(
        "Only these eval_ids, comma-separated; empty: every case with frozen inference. A "
        "rescore of some cases or metrics is a subset: never 'latest'"))] = "",
    code_paths: Annotated[Names, Field(description=(
        "Directories to import custom metrics from, comma-separated; empty: the agent "
        f"package's parent beside the eval set or config; {RELATIVE}"))] = "",
    concurrency: Annotated[int, Field(ge=1, description="Units scored at once per metric")] = 8,
    task_runner: Annotated[RunnerChoice, Field(
        description="Where scoring tasks run: threads, or dask (a local cluster, or the "
                    "scheduler at dask_address); default: $EVALSNAP_TASK_RUNNER, else "
                    "threads")] = "default",
    dask_address: DaskAddressParam = "",
    agent: Annotated[Text, Field(description=(
        "The agent package, imported first in every process that scores (as for a run: "
        f"models or evaluators it registers are there); it is never called; {RELATIVE}"))] = "",
    agent_name: Annotated[Text, Field(description="Sub-agent of agent; empty: none")] = "",
    baseline: BaselineParam = "",
    tolerance: ToleranceParam = 0.0,
    fail_on: FailOnParam = "quality",
    repetition_gate: GateParam = "mean",
    alpha: AlphaParam = 0.05,
) -> Any:
    """Never calls the agent: freezes the earlier inference with the given references and
    rules; the flow run ends Failed when ``fail_on`` says so."""
    spec = resolved(RunSpec.of_flow("rescore", **locals()))  # the parameters, nothing else yet
    if not spec.code_paths and (spec.evalsets or spec.config):
        # As the CLI does: custom metrics live in the agent package beside the eval set or
        # config, so its parent is the import root (a UI user sets no code paths).
        first = spec.evalsets[0] if spec.evalsets else str(spec.config)
        spec = spec.model_copy(update={"code_paths": [str(Path(first).parent.parent)]})
    with context.started(spec.store) as ctx:  # the run's store, limiter, progress, commits
        plan = plan_rescore(spec, ctx, good=lastgood.is_good)
        run = spec.run_options()
        tag_flow_run("evalsnap", f"evalset:{plan.eval_set.eval_set_id}")
        rename_flow_run(f"rescore-{plan.eval_set.eval_set_id}", plan.coverage().full)
        with RunProgress(len(plan.metric_names) + 1,
                         f"{plan.eval_set.eval_set_id}: rescoring, publish") as progress, \
                runners.task_runner_scope(spec.task_runner, spec.dask_address, ctx.settings):
            if run.reuse and not run.force:  # prove in bulk what the previous record implies
                hints.prime(ctx.store, plan.eval_set.eval_set_id)
            outcomes = plan.source_outcomes  # the frozen inference: the agent is never called
            snapshot_oid = freeze_task(as_data(plan.freeze_request(outcomes)))
            plan.release_cases()  # the snapshot has them: scoring and publish read it
            units = run_scoring(plan.score_requests(run, snapshot_oid), progress)
            request = plan.publish_request(run, snapshot_oid, outcomes, units)
            del units  # the request's now: publish lets them go once the record has them
            result = publish_task(as_data(request))
            progress.advance()  # published
        return finish(result, spec.fail_on, plan.store_url, ctx)
