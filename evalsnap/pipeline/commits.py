"""The commit of a run (its record, pointers and manifest), as the CLI's signal handling
sees it: a signal that arrives while a run commits waits for the commit to end, so no run is
left half published, and the CLI's last message says truthfully what was published.

One :class:`Commits` per run, held by its :class:`~evalsnap.pipeline.context.RunContext`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Published:
    eval_set_id: str
    record_oid: str
    run_id: str


class Commits:
    """A run's commits: the one in progress (a lock) and the records it published."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._published: list[Published] = []

    @contextlib.contextmanager
    def committing(self) -> Iterator[None]:
        """Held from the record's write to the manifest's (the run's commit)."""
        with self._lock:
            yield

    def mark_published(self, eval_set_id: str, record_oid: str, run_id: str) -> None:
        self._published.append(Published(eval_set_id, record_oid, run_id))

    def published(self) -> list[Published]:
        """The records this run published (their manifests are written)."""
        return list(self._published)

    def hold(self, timeout: float) -> bool:
        """Waits up to ``timeout`` s for a commit in progress to end and keeps any other from
        starting (the process is about to end); False if the commit did not end in time."""
        return self._lock.acquire(timeout=timeout)
