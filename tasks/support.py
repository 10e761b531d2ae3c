"""Prefect plumbing shared by the tasks and flows: retries, caching, tags, progress, docs."""

from __future__ import annotations

import functools
import hashlib
import inspect
import logging
import typing
from typing import Any

from evalsnap import settings

logger = logging.getLogger(__name__)

T = typing.TypeVar("T")


def as_data(value: T) -> T:
    """Marks a large task argument as plain data (``prefect.utilities.annotations.quote``).

    Prefect otherwise walks every nested value of every argument, looking for futures to
    resolve and upstream runs to link: about 1 s per call for a 300-case run's lists. For
    tasks called in the flow's own process (freeze, publish); a submitted task gets a JSON
    string instead, since a Dask worker sees the annotation itself in a cache key function.
    """
    from prefect.utilities.annotations import quote

    return typing.cast(T, quote(value))


def tag_flow_run(*names: str) -> None:
    """Adds tags to the running flow run (one API call), for filtering runs in the UI.

    Task runs carry no tags on purpose: Prefect asks the API for a tag-concurrency lease
    before every tagged task run, which under a busy local API took up to 2 s per task.
    Model calls are limited by the global limits in :mod:`evalsnap.pipeline.runners` instead.
    """
    from prefect.client.orchestration import get_client
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    if ctx is None or ctx.flow_run is None:
        return
    current = list(ctx.flow_run.tags or [])
    merged = current + [n for n in names if n not in current]
    if merged == current:
        return
    try:
        with get_client(sync_client=True) as client:
            client.update_flow_run(ctx.flow_run.id, tags=merged)
        ctx.flow_run.tags = merged
    except Exception as exc:  # noqa: BLE001 - tags are for the UI; the run goes on
        logger.warning("could not tag the flow run: %s", exc)


def retry_options() -> dict[str, Any]:
    """Prefect task retries: ``EVALSNAP_RETRIES`` retries, ``EVALSNAP_RETRY_DELAYS`` apart."""
    s = settings.get()
    return {"retries": s.task_retries, "retry_delay_seconds": list(s.retry_delays)}


def cached(task: T, request: Any) -> T:
    """``task`` for ``request``, its result cached in the store (:mod:`tasks.results`) as
    the reuse authority says (read only when the request reuses)."""
    from evalsnap.pipeline.reuse import refresh_cache
    from tasks.results import IdsSerializer

    return task.with_options(  # type: ignore[attr-defined, no-any-return]
        result_storage=_results_block(request.store_url), result_serializer=IdsSerializer(),
        persist_result=True, refresh_cache=refresh_cache(request))


@functools.lru_cache(maxsize=16)
def _results_block(store_url: str) -> Any:
    """The saved result-storage block of a store (Prefect needs result storage saved
    server-side); it holds the store URL and nothing else, never credentials."""
    from tasks.results import StoreResults

    name = "evalsnap-results-" + hashlib.sha256(store_url.encode()).hexdigest()[:16]
    try:
        block = typing.cast(StoreResults, StoreResults.load(name))
        if block.store_url == store_url:
            return block
    except ValueError:  # not saved yet (a new store, or a new Prefect server)
        pass
    block = StoreResults(store_url=store_url)
    block.save(name, overwrite=True)
    return block


def wait_tracked(futures: list[Any], progress: Any = None,
                 weights: list[int] | None = None) -> None:
    """Waits for every future, advancing the run's progress artifact as each completes
    (by its weight: the number of cases in an inference batch)."""
    from concurrent.futures.process import BrokenProcessPool

    from prefect.futures import as_completed

    weight = {id(f): w for f, w in zip(futures, weights or [1] * len(futures), strict=True)}
    for _future in as_completed(futures):
        # wait() pins the engine's final state on the future; without it `future.state`
        # is read back from the API, which can still say RUNNING for a finished task.
        try:
            _future.wait()
        except BrokenProcessPool:
            pass  # its result() raises it again, for the caller (tasks.score) to handle
        if progress is not None:
            progress.advance(weight[id(_future)])


def with_parameter_docs(fn: Any) -> Any:
    """Writes each ``Annotated[..., Field(description=...)]`` into an ``Args:`` docstring.

    Prefect builds a flow's parameter schema (what the UI renders) from the signature and
    the Google-style docstring only; the description of an annotated pydantic ``Field`` is
    dropped. Put this decorator under ``@flow`` so the descriptions are written once.
    """
    hints = typing.get_type_hints(fn, include_extras=True)
    lines = []
    for name in inspect.signature(fn).parameters:
        for meta in getattr(hints.get(name), "__metadata__", ()):
            description = getattr(meta, "description", None)
            if description:
                lines.append(f"    {name}: {' '.join(description.split())}")
    if lines:
        fn.__doc__ = (inspect.getdoc(fn) or "").rstrip() + "\n\nArgs:\n" + "\n".join(lines)
    return fn
