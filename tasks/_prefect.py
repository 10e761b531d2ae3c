"""Prefect plumbing shared by the tasks: result storage and cache keys."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from evalsnap import repo


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
    Credentials are not put in the block: s3fs/gcsfs read their standard chains.
    """
    store = repo.open_store(store_url)
    base = store.prefect_storage_basepath()
    if "://" not in base or base.startswith("file://"):
        path = Path(base.removeprefix("file://"))
        path.mkdir(parents=True, exist_ok=True)
        return path
    from prefect.filesystems import RemoteFileSystem

    name = "evalsnap-" + hashlib.sha256(base.encode()).hexdigest()[:16]
    try:
        return RemoteFileSystem.load(name)
    except ValueError:
        block = RemoteFileSystem(basepath=base)
        block.save(name, overwrite=True)
        return block


def infer_cache_key(context: Any, parameters: dict[str, Any]) -> str:
    """Namespaced by task: Prefect cache keys are global per result storage."""
    return f"infer/{repo.hexof(parameters['fingerprint'])}"


def score_cache_key(context: Any, parameters: dict[str, Any]) -> str | None:
    """``score/<metric>/<digest of the unit keys>``; no caching unless reuse was asked for."""
    if not parameters.get("reuse") or parameters.get("force"):
        return None
    return f"score/{parameters['metric_name']}/{repo.hexof(parameters['units_digest'])}"


def wait_tracked(futures: list[Any], progress: Any = None) -> None:
    """Waits for every future, advancing the run's progress artifact as each completes."""
    from prefect.futures import as_completed

    for _future in as_completed(futures):
        if progress is not None:
            progress.advance()
