"""The nightly evaluation flow: inference → freeze → score → publish."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

from prefect import flow
from prefect.runtime import flow_run
from pydantic import Field

from evalsnap.pipeline import runners
from evalsnap.pipeline.plan import Plan, RunOptions, plan_runs
from evalsnap.reports.artifacts import RunProgress
from evalsnap.reports.suite import combined
from tasks import freeze_task, publish_task, run_inference, run_scoring, scoring_pool
from tasks.support import as_data, tag_flow_run, with_parameter_docs

DEFAULT_STORE = ".evalsnap"


def _run_name() -> str:
    params = flow_run.parameters or {}
    given = params.get("evalset", "eval")
    first = str(given[0] if isinstance(given, list) and given else given)
    evalset = first.split(":")[0].rstrip("/").rsplit("/", 1)[-1].removesuffix(".evalset.json")
    more = f"+{len(given) - 1}" if isinstance(given, list) and len(given) > 1 else ""
    return f"{evalset}{more}-{dt.datetime.now(dt.UTC):%Y-%m-%d-%H%M}"


@flow(name="evalsnap-evaluate", flow_run_name=_run_name, log_prints=False,
      validate_parameters=True, task_runner=runners.thread_runner())
@with_parameter_docs
def evaluate(
    agent_dir: Annotated[str, Field(description=(
        "ADK agent package directory (exposes root_agent, app or get_agent_async)"))],
    evalset: Annotated[str | list[str], Field(description=(
        "Eval set(s), as adk eval names them: an .evalset.json file, FILE:ID,ID, an eval "
        "set id of the agent, or a directory of *.test.json files (each scored with the "
        "test_config.json of its folder)"))],
    config: Annotated[str | None, Field(description="test_config.json; default: beside the eval set")] = None,
    store: Annotated[str, Field(description="Store URL: a local path, s3://…, gs://…")] = DEFAULT_STORE,
    reuse: Annotated[bool, Field(description="Reuse complete, compatible earlier work")] = False,
    force: Annotated[bool, Field(description="Score every unit again even if reusable")] = False,
    metrics: Annotated[list[str] | None, Field(description="Only these metrics (default: all)")] = None,
    cases: Annotated[list[str] | None, Field(description="Only these eval_ids (default: all)")] = None,
    repetitions: Annotated[int, Field(ge=1, description="Runs of the agent per case")] = 1,
    concurrency: Annotated[int, Field(ge=1, description=(
        "Cases run at once per inference task, and units scored at once per metric task "
        "(model calls stay within the Prefect limits evalsnap-agent-model and "
        "evalsnap-judge-model, where they exist)"))] = 8,
    task_runner: Annotated[runners.TaskRunnerName | None, Field(
        description="Where tasks run: threads in the flow's process, or dask (a local "
                    "cluster of worker processes, or the scheduler at dask_address). "
                    "Default: $EVALSNAP_TASK_RUNNER, else threads")] = None,
    dask_address: Annotated[str | None, Field(
        description="Existing Dask scheduler, e.g. tcp://10.0.0.5:8786 (implies dask). "
                    "Default: $EVALSNAP_DASK_ADDRESS")] = None,
    agent_name: Annotated[str | None, Field(
        description="Evaluate this sub-agent of the tree instead of the root agent")] = None,
    initial_session_file: Annotated[str | None, Field(description=(
        "Initial session state for old-format *.test.json files (AgentEvaluator's "
        "initial_session_file)"))] = None,
) -> dict[str, Any]:
    """Runs the agent on every case, freezes a snapshot, scores each metric, publishes:
    one record per eval set."""
    plans = plan_runs(agent_dir, evalset, config, store, metrics, cases, repetitions,
                      agent_name, initial_session_file)
    tag_flow_run("evalsnap", *(f"evalset:{p.eval_set.eval_set_id}" for p in plans))
    results = []
    with runners.task_runner_scope(task_runner, dask_address) as runner:
        for plan in plans:
            run = RunOptions(kind="run", reuse=reuse, force=force, concurrency=concurrency)
            results.append(_evaluate(plan, run, runner))
    return combined(results)


def _evaluate(plan: Plan, run: RunOptions, runner: str) -> dict[str, Any]:
    """One eval set: inference → freeze → score → publish."""
    progress = RunProgress(plan.inference_total + len(plan.metric_names) + 1,
                           f"{plan.eval_set.eval_set_id}: inference, scoring, publish")
    with scoring_pool(plan, run, runner) as pool:
        outcomes = run_inference(plan.inference_batches(run), progress)
        snapshot_oid = freeze_task(as_data(plan.freeze_request(outcomes)))
        units = run_scoring(plan.score_requests(run, snapshot_oid), progress, pool)
        result = publish_task(as_data(plan.publish_request(run, snapshot_oid, outcomes, units)))
    progress.advance()  # published
    return result
