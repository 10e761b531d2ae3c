"""The commit of a run (its record, pointers and manifest), as the CLI's signal handling
sees it: a signal that arrives while a run commits waits for the commit to end, so no run is
left half published, and the CLI's last message says truthfully what was published."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass

_lock = threading.Lock()
_published: list[Published] = []


@dataclass(frozen=True)
class Published:
    eval_set_id: str
    record_oid: str
    run_id: str


@contextlib.contextmanager
def committing() -> Iterator[None]:
    """Held from the record's write to the manifest's (the run's commit)."""
    with _lock:
        yield


def mark_published(eval_set_id: str, record_oid: str, run_id: str) -> None:
    _published.append(Published(eval_set_id, record_oid, run_id))


def published() -> list[Published]:
    """The runs this process published (their manifests are written)."""
    return list(_published)


def hold(timeout: float) -> bool:
    """Waits up to ``timeout`` s for a commit in progress to end and keeps any other from
    starting (the process is about to end); False if the commit did not end in time."""
    return _lock.acquire(timeout=timeout)
