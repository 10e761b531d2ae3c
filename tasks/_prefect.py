"""Prefect plumbing shared by the tasks: result storage and cache keys."""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import typing
from pathlib import Path
from typing import Any

from evalsnap.records import repo

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


def retry_delays() -> list[float]:
    """Backoff between task retries; ``EVALSNAP_RETRY_DELAYS="1,4"`` (seconds) overrides."""
    raw = os.environ.get("EVALSNAP_RETRY_DELAYS", "1,4")
    return [float(x) for x in raw.split(",") if x.strip()]


def retries() -> int:
    return int(os.environ.get("EVALSNAP_RETRIES", str(len(retry_delays()))))


def result_storage_for(store_url: str) -> Any:
    """Prefect result storage under the store URL, so cache hits travel with the store.

    A local path is passed as a ``Path`` (no block needed); a remote URL becomes a
    saved ``RemoteFileSystem`` block — saved again automatically on a fresh machine.
    Credentials are never put in the block: s3fs/gcsfs read their standard chains. Only
    where to connect goes in (endpoint, anonymous emulator access), and the block name
    covers it, so a changed endpoint gets its own block.
    """
    store = repo.open_store(store_url)
    base = store.prefect_storage_basepath()
    if "://" not in base or base.startswith("file://"):
        path = Path(base.removeprefix("file://"))
        path.mkdir(parents=True, exist_ok=True)
        return path
    from prefect.filesystems import RemoteFileSystem

    settings = _remote_settings(base.split("://", 1)[0], repo.storage_options_of(store_url))
    key = json.dumps({"base": base, "settings": settings}, sort_keys=True)
    name = "evalsnap-" + hashlib.sha256(key.encode()).hexdigest()[:16]
    try:
        return RemoteFileSystem.load(name)
    except ValueError:
        block = RemoteFileSystem(basepath=base, settings=settings)
        block.save(name, overwrite=True)
        return block


# Storage options that say where to connect, never who connects: safe to keep in a block.
_ENDPOINT_OPTIONS = ("endpoint_url", "region_name", "project", "anon")


def _remote_settings(protocol: str, options: dict[str, str]) -> dict[str, Any]:
    """fsspec settings for the result-storage block, from env and non-secret options."""
    settings: dict[str, Any] = {}
    chosen = {k: v for k, v in options.items() if k in _ENDPOINT_OPTIONS}
    if options.get("token") == "anon":
        chosen["token"] = "anon"
    if protocol == "s3":
        endpoint = (chosen.pop("endpoint_url", None) or os.environ.get("AWS_ENDPOINT_URL_S3")
                    or os.environ.get("AWS_ENDPOINT_URL"))
        if endpoint:
            settings["client_kwargs"] = {"endpoint_url": endpoint}
        # fail fast on a dead endpoint, as the store itself does
        settings["config_kwargs"] = {"connect_timeout": 5, "read_timeout": 30,
                                     "retries": {"max_attempts": 3, "mode": "standard"}}
    elif protocol in ("gs", "gcs"):
        emulator = chosen.pop("endpoint_url", None) or os.environ.get("STORAGE_EMULATOR_HOST")
        if emulator and emulator != "default":
            if not emulator.startswith(("http://", "https://")):
                emulator = f"http://{emulator}"
            settings["endpoint_url"] = emulator
            settings["token"] = "anon"  # emulators need no auth
    settings.update(chosen)
    return settings


def inference_batch_size() -> int | None:
    """Cases per inference task (``EVALSNAP_INFER_BATCH``); default: chosen per run."""
    raw = os.environ.get("EVALSNAP_INFER_BATCH", "").strip()
    return int(raw) if raw else None


def score_cache_key(context: Any, parameters: dict[str, Any]) -> str | None:
    """``score/<metric>/<digest of the unit keys>``; no caching unless reuse was asked for."""
    if not parameters.get("reuse") or parameters.get("force") or not parameters.get("units_digest"):
        return None
    return f"score/{parameters['metric_name']}/{repo.hexof(parameters['units_digest'])}"


def wait_tracked(futures: list[Any], progress: Any = None,
                 weights: list[int] | None = None) -> None:
    """Waits for every future, advancing the run's progress artifact as each completes
    (by its weight: the number of cases in an inference batch)."""
    from prefect.futures import as_completed

    weight = {id(f): w for f, w in zip(futures, weights or [1] * len(futures), strict=True)}
    for _future in as_completed(futures):
        # wait() pins the engine's final state on the future; without it `future.state`
        # is read back from the API, which can still say RUNNING for a finished task.
        _future.wait()
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
