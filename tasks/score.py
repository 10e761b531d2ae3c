"""Scoring task, one per metric: a thin adapter over ``evalsnap.pipeline.score``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from typing import Any

from prefect import task
from pydantic import ValidationError

from evalsnap import startup
from evalsnap.errors import EvalsnapError
from evalsnap.pipeline import context, reuse
from evalsnap.pipeline.outcomes import UnitOutcome
from evalsnap.pipeline.plan import Plan
from evalsnap.pipeline.score import ScoreRequest, score_metric, units_lost
from evalsnap.records import outcomes
from evalsnap.rows import Rows
from evalsnap.spec import RunOptions
from tasks.support import cached, wait_tracked


@task(name="score", task_run_name="score {request.metric_name}",
      cache_key_fn=reuse.score_cache_key)
def score_task(request: ScoreRequest) -> Rows[UnitOutcome]:
    """Scores (or reuses) one metric on every frozen case. Sync on purpose (see
    ``tasks.inference``): the event loop lives inside the task. Its units' outcomes are
    :class:`~evalsnap.rows.Rows` (their JSON, past a few MB in a temporary file): a run of
    30,000 cases held 210,000 of them as dicts and again as models until publish."""
    ctx = context.of(request.store_url)
    try:
        rows = score_metric(request, ctx)
        # what Prefect persists is the handle of the rows kept as one object
        # (evalsnap.records.outcomes), not the rows: a few bytes, not ~6 copies of 29 MB
        reuse.keep_outcomes(ctx, reuse.score_cache_key(None, {"request": request}), rows)
        return rows
    finally:
        startup.give_back_freed()  # its chunks (a scoring process scores several metrics)


def run_scoring(requests: list[ScoreRequest], progress: Any = None,
                pool: Any = None) -> Rows[UnitOutcome]:
    """Submits one task per metric, waits, and returns every unit outcome (in metric order).

    With a ``pool`` (:func:`scoring_pool`), the code metrics and every second judge metric
    score there, on another core, and the other judge metrics in the flow's task runner: a
    code metric keeps an interpreter busy, a judge metric mostly waits on its model.
    """
    units = Rows(UnitOutcome)
    if not requests:
        return units
    run = cached(score_task, requests[0])
    judges = [r for r in requests if r.judge]
    here = {r.metric_name for r in (judges or requests)[::2]} if pool is not None else None
    futures = [run.submit(r) if here is None or r.metric_name in here
               else pool.submit(run, {"request": r}) for r in requests]
    wait_tracked(futures, progress)
    if pool is not None:  # the scoring process's store requests are the run's too
        _count_pool_requests(pool, requests[0].store_url)
    for r, f in zip(requests, futures, strict=True):
        metric = _units_of(r, f)
        if isinstance(metric, Rows):
            units.extend_json(metric.json_items())
            metric.clear()  # a scoring process's rows: the file it sent them in, too
        elif isinstance(metric, dict):  # a cached result: the handle of its outcomes
            kept = _kept_rows(r, metric)
            units.extend_json(kept.json_items())
            kept.clear()
        else:  # a cached result of an earlier evalsnap: the list of each unit's data
            units.extend(UnitOutcome.model_validate(u) for u in metric)
    return units


def _kept_rows(request: ScoreRequest, kept: dict[str, Any]) -> Rows[UnitOutcome]:
    """A cached scoring result's rows, read from the object its handle names a row at a
    time (checked already, as Prefect's cache read it: :mod:`tasks.results`); if it is
    damaged or gone since, the metric's units say so and the run goes on."""
    rows = Rows(UnitOutcome)
    try:
        oid = outcomes.handle_oid(kept)
        if oid is None:
            raise ValueError("it names no stored outcomes")
        rows.extend(UnitOutcome.model_validate(u)
                    for u in outcomes.stored_items(context.of(request.store_url).store, oid))
    except (ValueError, ValidationError, EvalsnapError) as exc:
        rows.clear()
        return units_lost(request, f"its cached outcomes could not be read back ({exc}); "
                                   "score it again (`evalsnap verify` names what is damaged)",
                          context.of(request.store_url))
    return rows


def _units_of(request: ScoreRequest, future: Any
              ) -> Rows[UnitOutcome] | dict[str, Any] | list[Any]:
    """A metric task's units; when its scoring process died under it (user code that called
    ``os._exit``, a crash), the metric's units say so instead of the run failing."""
    try:
        return future.result()  # type: ignore[no-any-return]
    except BrokenProcessPool as exc:
        return units_lost(request, f"the scoring process ended while this metric was being "
                                   f"scored there ({exc}); user code may have ended it "
                                   "(os._exit, a crash) — score it again to see",
                          context.of(request.store_url))


@task(name="store requests", persist_result=False)
def store_requests_task(store_url: str) -> dict[str, int]:
    """The store requests this process sent in this run (asked of the scoring process)."""
    return context.of(store_url).store.requests.snapshot()


def _count_pool_requests(pool: Any, store_url: str) -> None:
    try:
        counts = pool.submit(store_requests_task, {"store_url": store_url}).result()
    except Exception:  # noqa: BLE001 - a dead scoring process: its units say so already
        return
    here = context.of(store_url).store.requests
    for kind, n in counts.items():
        if kind != "total":
            here.add(kind, int(n))


@task(name="prepare scoring process", persist_result=False)
def prepare_scoring_task() -> None:
    """Starts the pool's process now, so that its imports overlap the run's inference."""


def _warm(store_url: str, storage_options: dict[str, str], flow_run_id: str | None,
          sys_paths: list[str], metric_names: list[str],
          agent: tuple[str | None, str | None] = (None, None),
          parent_pid: int | None = None) -> None:
    """Initializer of a scoring process: it dies with the flow's process, then imports what
    its tasks would import first."""
    from evalsnap import rows, startup
    from evalsnap.pipeline.context import RunContext, serve
    from evalsnap.pipeline.score import ensure_paths, import_agent

    if parent_pid is not None:
        startup.die_with_parent(parent_pid)
    startup.apply_defaults()
    rows.send_by_file()  # its results go to the flow's process on this machine
    startup.exit_without_teardown()
    # this process serves the tasks of one flow run: its store, with the flow's options
    serve(RunContext(store_url, storage_options=storage_options), flow_run_id)
    ensure_paths(sys_paths)
    import_agent(*agent)  # before the config: what the agent package registers is needed
    import evalsnap.adk.config  # noqa: F401  (ADK's evaluators and their registry)

    thread = startup.preload(metric_names)
    if thread is not None:
        thread.join()


@contextmanager
def scoring_pool(plan: Plan, run: RunOptions, runner: str) -> Iterator[Any]:
    """Prefect's ``ProcessPoolTaskRunner`` for half of a run's metrics, or None.

    Only where it pays: the default thread runner (one interpreter, bound by its lock),
    two or more cores (``EVALSNAP_SCORE_PROCESSES``), a run that scores its units itself
    (no ``--reuse``, or ``--force``) and at least ``EVALSNAP_SCORE_POOL_MIN_UNITS`` of them.
    Started at once, with a warm-up task: its process imports during the inference.
    Never for a ``memory://`` store: it lives in this process's memory only, so another
    process would find none of the run's snapshot and inference there.
    """
    s = plan.context.settings
    units = plan.inference_total * len(plan.metric_names)
    if (runner != "threads" or s.scoring_process_count < 1 or len(plan.metric_names) < 2
            or plan.store_url.startswith("memory://")
            or (run.reuse and not run.force) or units < s.score_pool_min_units):
        yield None
        return
    from prefect.task_runners import ProcessPoolTaskRunner

    from evalsnap import startup

    # the start-up tricks first (child_start), then _warm: its imports come after them
    with ProcessPoolTaskRunner(
            max_workers=s.scoring_process_count, initializer=startup.child_start,
            initargs=("tasks.score:_warm", plan.store_url,
                      plan.context.storage_options, _flow_run_id(), plan.sys_paths,
                      plan.metric_names, (plan.agent_dir, plan.agent_name),
                      os.getpid())) as pool:
        # Its processes start now, before the inference: Prefect's submit hands the call to
        # the executor from a thread of its own, later, so a process could otherwise start
        # during the inference and be stopped there as a process the agent's tools left
        # (pipeline/leftovers.py). The executor starts a process per call while none is idle.
        executor = getattr(pool, "_executor", None)
        if executor is not None:
            for _ in range(s.scoring_process_count):
                executor.submit(int)
        pool.submit(prepare_scoring_task, {})
        yield pool


def _flow_run_id() -> str | None:
    from prefect.runtime import flow_run

    return flow_run.get_id()
