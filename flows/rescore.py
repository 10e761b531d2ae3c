"""The rescore flow: score frozen inference again with new references or rules."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated, Any

from prefect import flow
from prefect.runtime import flow_run
from pydantic import Field

from evalsnap.pipeline import runners
from evalsnap.pipeline.plan import RunOptions, plan_rescore
from evalsnap.reports.artifacts import RunProgress
from flows.evaluate import DEFAULT_STORE
from tasks import freeze_task, publish_task, run_scoring
from tasks.support import as_data, tag_flow_run, with_parameter_docs


def _run_name() -> str:
    params = flow_run.parameters or {}
    return f"rescore-{str(params.get('run_or_snapshot', ''))[:20]}-{dt.datetime.now(dt.UTC):%Y-%m-%d-%H%M}"


@flow(name="evalsnap-rescore", flow_run_name=_run_name, validate_parameters=True,
      task_runner=runners.thread_runner())
@with_parameter_docs
def rescore(
    run_or_snapshot: Annotated[str, Field(description="Run id, record id, snapshot id, or 'latest'")],
    evalset: Annotated[str | None, Field(description="Edited .evalset.json (default: the frozen references)")] = None,
    config: Annotated[str | None, Field(
        description="test_config.json (default: beside the eval set, else the frozen rules)")] = None,
    store: Annotated[str, Field(description="Store URL: a local path, s3://…, gs://…")] = DEFAULT_STORE,
    reuse: Annotated[bool, Field(description="Reuse complete, compatible earlier units")] = True,
    force: Annotated[bool, Field(description="Score every unit again")] = False,
    metrics: Annotated[list[str] | None, Field(description="Only these metrics (default: all)")] = None,
    cases: Annotated[list[str] | None, Field(description="Only these eval_ids (default: all)")] = None,
    code_paths: Annotated[list[str] | None, Field(
        description="Directories to import custom metrics from (e.g. the agent's parent)")] = None,
    concurrency: Annotated[int, Field(ge=1, description="Units scored at once per metric")] = 8,
    task_runner: Annotated[runners.TaskRunnerName | None, Field(
        description="Where scoring tasks run: threads, or dask (a local cluster, or the "
                    "scheduler at dask_address). Default: $EVALSNAP_TASK_RUNNER, else "
                    "threads")] = None,
    dask_address: Annotated[str | None, Field(
        description="Existing Dask scheduler, e.g. tcp://10.0.0.5:8786 (implies dask)")] = None,
    agent: Annotated[str | None, Field(description=(
        "The agent package, imported first in every process that scores (as for a run: "
        "models or evaluators it registers are there); it is never called"))] = None,
    agent_name: Annotated[str | None, Field(description="Sub-agent of --agent, if any")] = None,
) -> dict[str, Any]:
    """Never calls the agent: freezes the earlier inference with the given references and rules."""
    if code_paths is None and (evalset or config):
        # As the CLI does: custom metrics live in the agent package beside the eval set or
        # config, so its parent is the import root (a UI user sets no code paths).
        code_paths = [str(Path(evalset or config or ".").resolve().parent.parent)]
    plan = plan_rescore(run_or_snapshot, store, evalset, config, metrics, cases, code_paths,
                        agent, agent_name)
    run = RunOptions(kind="rescore", reuse=reuse, force=force, concurrency=concurrency)
    tag_flow_run("evalsnap", f"evalset:{plan.eval_set.eval_set_id}")
    progress = RunProgress(len(plan.metric_names) + 1,
                           f"{plan.eval_set.eval_set_id}: rescoring, publish")
    with runners.task_runner_scope(task_runner, dask_address):
        outcomes = plan.source_outcomes  # the frozen inference: the agent is never called
        snapshot_oid = freeze_task(as_data(plan.freeze_request(outcomes)))
        units = run_scoring(plan.score_requests(run, snapshot_oid), progress)
        result = publish_task(as_data(plan.publish_request(run, snapshot_oid, outcomes, units)))
    progress.advance()  # published
    return result
