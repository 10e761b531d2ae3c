"""The nightly evaluation flow: inference → freeze → score → publish."""

from __future__ import annotations

import datetime as dt
import json
from typing import Annotated, Any

from prefect import flow, get_run_logger
from prefect.runtime import flow_run
from prefect.states import State
from pydantic import Field

from evalsnap.adk.inference import inference_fingerprint
from evalsnap.pipeline import runners, stages
from evalsnap.pipeline.outcomes import InferenceOutcome
from evalsnap.pipeline.plan import Plan, plan_run
from evalsnap.reports.artifacts import RunProgress
from flows._common import freeze_score_publish, scoring_worker
from tasks import infer_task
from tasks._prefect import (
    inference_batch_size,
    result_storage_for,
    tag_flow_run,
    wait_tracked,
    with_parameter_docs,
)
from tasks.inference import batches

DEFAULT_STORE = ".evalsnap"


def _run_name() -> str:
    params = flow_run.parameters or {}
    evalset = str(params.get("evalset", "eval")).rsplit("/", 1)[-1].removesuffix(".evalset.json")
    return f"{evalset}-{dt.datetime.now(dt.UTC):%Y-%m-%d-%H%M}"


def _agent(plan: Any) -> Any:
    assert plan.agent is not None  # plan_run always loads the agent
    return plan.agent


def _failure_message(state: State) -> tuple[str, int]:
    try:
        state.result(raise_on_failure=True)
    except Exception as exc:  # noqa: BLE001 - we want the task's exception text
        return str(exc), 1
    return str(state.message), 1


@flow(name="evalsnap-evaluate", flow_run_name=_run_name, log_prints=False,
      validate_parameters=True, task_runner=runners.thread_runner())
@with_parameter_docs
def evaluate(
    agent_dir: Annotated[str, Field(description="ADK agent package directory (exposes root_agent)")],
    evalset: Annotated[str, Field(description="Path of the .evalset.json file")],
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
) -> dict[str, Any]:
    """Runs the agent on every case, freezes a snapshot, scores each metric, publishes."""
    plan = plan_run(agent_dir, evalset, config, store, metrics, cases, repetitions)
    run_id = stages.new_run_id()
    tag_flow_run("evalsnap", f"evalset:{plan.eval_set.eval_set_id}")
    with runners.task_runner_scope(task_runner, dask_address) as runner, \
            scoring_worker(plan, runner, len(plan.case_ids) * plan.repetitions, reuse=reuse,
                           force=force):
        return _evaluate(plan, run_id, reuse=reuse, force=force, concurrency=concurrency)


def _evaluate(plan: Plan, run_id: str, *, reuse: bool, force: bool,
              concurrency: int) -> dict[str, Any]:
    logger = get_run_logger()
    agent_dir = str(_agent(plan).path)
    cases_by_id = {c.eval_id: c for c in plan.eval_set.eval_cases}
    items: list[dict[str, Any]] = []
    for case_id in plan.case_ids:
        case = cases_by_id[case_id]
        case_data = case.model_dump(mode="json")
        for rep in range(plan.repetitions):
            items.append({"case": case_data, "eval_id": case_id, "repetition": rep,
                          "fingerprint": inference_fingerprint(_agent(plan).identity, case, rep)})
    progress = RunProgress(len(items) + len(plan.metric_names) + 1,
                           f"{plan.eval_set.eval_set_id}: inference, scoring, publish")
    storage = result_storage_for(plan.store_url)
    infer = infer_task.with_options(result_storage=storage, refresh_cache=not reuse)
    parts = batches(len(items), runners.thread_workers(), inference_batch_size())
    submitted = []
    for part in parts:
        chunk = [items[i] for i in part]
        label = (f"{chunk[0]['eval_id']} ({part.start + 1} of {len(items)})" if len(chunk) == 1
                 else f"{chunk[0]['eval_id']} … {chunk[-1]['eval_id']} "
                      f"({part.start + 1}-{part.stop} of {len(items)})")
        future = infer.submit(plan.store_url, agent_dir, plan.eval_set.eval_set_id,
                              json.dumps(chunk), run_id, reuse, concurrency, label)
        submitted.append((chunk, future))
    wait_tracked([f for _, f in submitted], progress, weights=[len(c) for c, _ in submitted])

    def failed(chunk: list[dict[str, Any]], state: State) -> list[InferenceOutcome]:
        """A batch task that failed as a whole: each of its cases is a failed inference."""
        message, _ = _failure_message(state)
        logger.warning("inference task for %d cases failed: %s", len(chunk), message)
        return [stages.failed_inference(
            plan.store_url, agent_dir, item["case"], plan.eval_set.eval_set_id,
            item["repetition"], run_id, message, attempts=(infer.retries or 0) + 1)
            for item in chunk]

    def outcome_of(item: dict[str, Any], value: dict[str, Any]) -> InferenceOutcome:
        # Identical inputs share one inference (same fingerprint): the case identity
        # comes from the submission, not from a cached value.
        return InferenceOutcome.model_validate(value).model_copy(
            update={"eval_id": item["eval_id"], "repetition": item["repetition"]})

    outcomes: list[InferenceOutcome] = []
    again: list[dict[str, Any]] = []
    for chunk, future in submitted:
        state = future.state
        if not state.is_completed():
            outcomes += failed(chunk, state)
            continue
        for item, value in zip(chunk, future.result(), strict=True):
            outcome = outcome_of(item, value)
            if outcome.run_id != run_id and (outcome.status != "success" or not
                                             stages.inference_usable(plan.store_url,
                                                                     outcome.oid)):
                # Prefect's cache hands back ids without reading the objects: a failed
                # (never reused), damaged or missing inference runs again.
                logger.warning("cached inference %s of %s is unusable; running it again",
                               outcome.oid, item["eval_id"])
                again.append(item)
                continue
            outcomes.append(outcome)
    if again:
        future = infer.with_options(refresh_cache=True).submit(
            plan.store_url, agent_dir, plan.eval_set.eval_set_id, json.dumps(again), run_id, False,
            concurrency, f"{len(again)} unusable cached inferences")
        future.wait()
        if future.state.is_completed():
            outcomes += [outcome_of(item, value)
                         for item, value in zip(again, future.result(), strict=True)]
        else:
            outcomes += failed(again, future.state)
    result = freeze_score_publish(plan, run_id=run_id, kind="run", outcomes=outcomes,
                                  reuse=reuse, force=force, concurrency=concurrency,
                                  progress=progress)
    progress.advance()  # published
    return result
