"""Prefect plumbing shared by the tasks and flows: retries, caching, tags, progress, docs."""

from __future__ import annotations

import functools
import hashlib
import inspect
import logging
import re
import typing
from typing import TYPE_CHECKING, Any

from prefect.exceptions import Abort
from pydantic import BeforeValidator

from evalsnap import settings

if TYPE_CHECKING:
    from evalsnap.reports.summary_model import Summary

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
    """Prefect task retries: ``EVALSNAP_RETRIES`` retries, ``EVALSNAP_RETRY_DELAYS`` apart,
    only for what a retry can fix (:func:`worth_a_retry`)."""
    s = settings.get()
    return {"retries": s.task_retries, "retry_delay_seconds": list(s.retry_delays),
            "retry_condition_fn": worth_a_retry}


def worth_a_retry(task: Any, task_run: Any, state: Any) -> bool:
    """Whether a failed task run is tried again: its batch had failures a retry can fix
    (``InferenceFailed``), or the task itself failed in a way that can pass (a timeout, a
    lost connection, 408/429/5xx: :func:`evalsnap.agents.failures.is_transient`). A failure
    that would repeat (the agent package fails to import, say) is not retried."""
    from evalsnap.agents.failures import is_transient

    try:
        exc = state.result(raise_on_failure=False)
    except Exception:  # noqa: BLE001 - the error cannot be read back: retry, as before
        return True
    if not isinstance(exc, BaseException):
        return True
    return type(exc).__name__ == "InferenceFailed" or is_transient(exc)


def cached(task: T, request: Any) -> T:
    """``task`` for ``request``, its result cached in the store (:mod:`tasks.results`) as
    the reuse authority says (read only when the request reuses)."""
    from evalsnap.pipeline.reuse import refresh_cache
    from tasks.results import IdsSerializer

    # not cached in memory by Prefect's ResultStore (an LRU of 1,000 records that lives as
    # long as the flow): a scoring task's result is a list of every unit's outcome, ~2 KB a
    # case held to the end of the run; the future's state holds it while it is needed
    return task.with_options(  # type: ignore[attr-defined, no-any-return]
        result_storage=_results_block(request.store_url), result_serializer=IdsSerializer(),
        persist_result=True, refresh_cache=refresh_cache(request),
        cache_result_in_memory=False)


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


# ---- the form: parameters as a person fills them in ------------------------------------------

def _joined(value: Any) -> Any:
    """A list given by the CLI or the Python API, as the form's comma-separated text."""
    if isinstance(value, list | tuple):
        return ",".join(str(v).strip() for v in value)
    return "" if value is None else value


#: A comma-separated list in one text box ("" = all); lists are accepted too (CLI, API).
Names = typing.Annotated[str, BeforeValidator(_joined)]
#: An optional text box: "" means the default its description names (None is accepted).
Text = typing.Annotated[str, BeforeValidator(lambda v: "" if v is None else v)]


def names(value: str) -> list[str] | None:
    """The names of a comma-separated parameter; None (all) when it names none."""
    found = [n.strip() for n in value.split(",") if n.strip()]
    return found or None


def absolute(path: str) -> str:
    """A path parameter resolved against the flow run's working directory (a deployment's:
    the project directory its pull step sets), so every error names the resolved path;
    ``""`` stays ``""`` (the default), and URLs (``s3://…``) are kept."""
    import os

    if not path or "://" in path:
        return path
    return os.path.abspath(os.path.expanduser(path))


def absolute_evalset(spec: str) -> str:
    """An eval set parameter with its file or directory part resolved (``FILE:ID,ID`` keeps
    its case ids); an eval set id of the agent (no path, no ``.json``) is kept as it is."""
    import os

    file, sep, ids = spec.partition(":") if not os.path.exists(spec) else (spec, "", "")
    if os.sep in file or "/" in file or file.endswith(".json") or os.path.exists(file):
        return absolute(file) + sep + ids
    return spec


#: What an empty store parameter means: one store setting for every deployment (the work
#: pool's job variables, or the worker's environment), not one per deployment.
STORE_DEFAULT = "$EVALSNAP_STORE (e.g. in the work pool's job variables), else .evalsnap"


def resolved(spec: Any) -> Any:
    """A flow's :class:`~evalsnap.spec.RunSpec` with its paths resolved against the flow
    run's working directory (:func:`absolute`), so every error names the resolved path, and
    an empty store the one store setting (``EVALSNAP_STORE``, else ``.evalsnap``)."""
    def path(value: str | None) -> str | None:
        return absolute(value) or None if value else None

    return spec.model_copy(update={
        "store": spec.store or settings.get().store,  # "": the one store setting
        "agent_dir": path(spec.agent_dir), "config": path(spec.config),
        "initial_session_file": path(spec.initial_session_file),
        "evalsets": [absolute_evalset(e) for e in spec.evalsets],
        "code_paths": [absolute(p) for p in spec.code_paths]})


# ---- the run's outcome: its name, its events and its final state ---------------------------

#: The end of the names evalsnap generates: ``…-20261201-020003-a1f3``.
GENERATED_NAME = re.compile(r"-\d{8}-\d{6}-[0-9a-f]{4}$")


#: The shape of the random names Prefect gives a run: the server's two words
#: (``clever-otter``) and the UI's prefilled "Run Name" (``nu5-xultun``, ``omega5-enedwaith-f``):
#: two or three lowercase words joined by dashes.
RANDOM_NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+){1,2}$")


def typed_name(name: str | None) -> bool:
    """Whether a flow run's name was chosen by a person (the UI's "Run Name", a name given
    through the API), rather than made up: two or three lowercase words joined by dashes,
    as Prefect's random names are, or a name evalsnap generated."""
    return bool(name) and not GENERATED_NAME.search(name or "") and \
        not RANDOM_NAME.match(name or "")


def generated_name(what: str, full: bool | None) -> str:
    """``<what>-<full|subset>-<UTC yyyymmdd-hhmmss>-<4 hex>``: unique and telling."""
    import datetime as dt
    import secrets

    kind = "" if full is None else ("-full" if full else "-subset")
    return f"{what}{kind}-{dt.datetime.now(dt.UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def run_name(what: str, full: bool | None) -> str:
    """The flow run's name: the one it was created with if a person typed it, else
    :func:`generated_name` (for ``flow_run_name``, which Prefect applies unconditionally)."""
    from prefect.runtime import flow_run

    current = flow_run.name
    return current if typed_name(current) else generated_name(what, full)


def rename_flow_run(what: str, full: bool) -> None:
    """Once the plan is known: the generated name of the running flow run, with its eval
    set and whether it is full (a typed name is kept)."""
    from prefect.client.orchestration import get_client
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    if ctx is None or ctx.flow_run is None or typed_name(ctx.flow_run.name):
        return
    if ctx.flow_run.name.startswith(f"{what}-{'full' if full else 'subset'}-"):
        return  # the name made up at the start already says it
    name = generated_name(what, full)
    try:
        with get_client(sync_client=True) as client:
            client.set_flow_run_name(ctx.flow_run.id, name)
        ctx.flow_run.name = name
    except Exception as exc:  # noqa: BLE001 - the name is for the UI; the run goes on
        logger.warning("could not rename the flow run: %s", exc)


def emit_run_events(result: Summary, store_url: str) -> None:
    """One Prefect event per record: ``evalsnap.run.passed|failed|incomplete``, and
    ``evalsnap.run.regressed`` too when it regressed against its baseline; the resource is
    the record, labelled with eval set, store, record and run (automations match them)."""
    from prefect.events import emit_event

    from evalsnap.reports.regressions import gate_message
    from evalsnap.reports.summary_model import parts

    flow_run_url = current_flow_run_url()

    for part in parts(result):
        outcome = ("incomplete" if not part.complete else
                   "passed" if part.passed else "failed")
        resource = {"prefect.resource.id": f"evalsnap.record.{part.record_id}",
                    "prefect.resource.name": f"{part.eval_set_id} {part.run_id}",
                    "evalsnap.eval-set": part.eval_set_id, "evalsnap.store": store_url,
                    "evalsnap.record": part.record_id, "evalsnap.run": part.run_id,
                    "evalsnap.full": str(part.full).lower()}
        payload = {"message": gate_message(part), "exit_code": part.exit_code,
                   "regressions": [r.model_dump(mode="json") for r in part.regressions[:20]],
                   "fixes": [f.model_dump(mode="json") for f in part.fixes[:20]],
                   "baseline": part.baseline.model_dump(mode="json") if part.baseline else None,
                   # links a person follows from an alert: the report, the flow run in the UI
                   "report_url": part.report_url, "flow_run_url": flow_run_url}
        names = [f"evalsnap.run.{outcome}"] + (["evalsnap.run.regressed"]
                                               if part.regressions else [])
        for event in names:
            try:
                emit_event(event=event, resource=resource, payload=payload)
            except Exception as exc:  # noqa: BLE001 - events are for automations; never lose a run
                logger.warning("could not emit %s: %s", event, exc)


class GateFailed(Abort):
    """The gate (``fail_on``) failed a run whose records are published: the data of the
    ``Failed`` state the flow run ends in, holding the run's summary (``summary``).

    Prefect's engine raises a ``Failed`` state's data when a deployment's flow run ends
    (``engine.result()``): a dict there is a ``TypeError`` logged at ERROR with the whole
    summary, and any ``Exception`` is logged at ERROR with its traceback by the flow run's
    logger and again by the engine. An :class:`~prefect.exceptions.Abort` is the one
    exception it lets end the process quietly (exit 0, one INFO line): the flow run's
    state, Failed with the one-line message, is on the server already."""

    def __init__(self, message: str, summary: dict[str, Any]) -> None:
        super().__init__(message)
        self.summary = summary

    def __reduce__(self) -> Any:
        return GateFailed, (str(self), self.summary)


def summary_of_failed(data: Any) -> dict[str, Any] | None:
    """The summary (the ``--json`` object) a gate-failed flow run's state holds
    (:class:`GateFailed`), else None."""
    return data.summary if isinstance(data, GateFailed) else None


def finish(result: Summary, fail_on: str, store_url: str, ctx: Any = None) -> Any:
    """The flow's return value once every record is published: ``result`` with its exit
    codes under ``fail_on`` as its ``--json`` object (plain JSON data, as a flow run's result
    is best kept), or Prefect's ``Failed`` state (a one-line message naming what failed, and
    that object as its data's ``summary``: :class:`GateFailed`) when the gate fails.
    Returning the state, rather than raising, keeps the result for the caller
    (:func:`evalsnap.api.run_spec`), is no exception for Prefect to retry, and logs no
    ERROR or traceback anywhere: a gate failure is a verdict, not a crash.

    When the run's context ``ctx`` says its caller in this process reads the summary from
    there (``keeps_summary``: the CLI, the Python API), the model is left there and the
    flow returns only the object's head (:func:`summary_head`): the whole object as JSON
    data next to its model doubled what a large run holds at its end."""
    from prefect.states import Failed

    from evalsnap.reports.regressions import gate

    gated, message = gate(result, fail_on)
    emit_run_events(gated, store_url)
    if ctx is not None and ctx.keeps_summary:
        ctx.summary = gated
        data = summary_head(gated)
    else:
        data = gated.model_dump(mode="json")
    if message is None:
        return data
    _run_logger().warning("%s", message)  # in the flow run's logs: the UI shows why
    return Failed(message=message, data=GateFailed(message, data))


#: What :func:`summary_head` keeps of a summary: what names the run and its verdict.
_HEAD = ("kind", "run_id", "run_ids", "record_id", "record_ids", "eval_set_id", "eval_set_ids",
         "complete", "passed", "exit_code", "fail_on")


def summary_head(result: Summary) -> dict[str, Any]:
    """The flow's return value when its caller takes the summary from the run's context:
    the keys that name the run and its verdict, and where the rest is."""
    return {**result.model_dump(mode="json", include=set(_HEAD)),
            "summary": "handed to the caller in this process (evalsnap.api.run_spec)"}


def _run_logger() -> Any:
    """The running flow run's logger (its records go to the server), else this module's."""
    from prefect.exceptions import MissingContextError
    from prefect.logging import get_run_logger

    try:
        return get_run_logger()
    except MissingContextError:
        return logger


def current_flow_run_url() -> str | None:
    """The Prefect UI's page of the flow run this runs in; None outside a flow run, without
    a UI URL, or on the CLI's temporary API (it is gone when the run ends: a page must not
    link it). A link is a view: never an error."""
    from prefect.runtime import flow_run

    from evalsnap import startup

    if startup.on_temporary_api():
        return None
    try:
        url = flow_run.ui_url
    except Exception:  # noqa: BLE001 - a link is a view; what needs it goes on without
        return None
    return url if isinstance(url, str) and url else None
