"""Progress events of a run (a terminal progress bar in the CLI; no-op elsewhere).

A listener is called ``listener(stage, advance, total)``: ``expect(stage, n)`` announces
``total=n`` units of a stage, ``advance(stage)`` one more done. One :class:`Progress` per
run, held by its :class:`~evalsnap.pipeline.context.RunContext`; events of a task that runs
in another process (a scoring process, a Dask worker) reach that process's sink only.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

Listener = Callable[[str, int, "int | None"], None]


class Progress:
    """The progress sink of a run: its listeners."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listeners: list[Listener] = []

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        with self._lock:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unsubscribe

    def _emit(self, stage: str, advance: int, total: int | None) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(stage, advance, total)
            except Exception:  # noqa: BLE001 - a display must never stop the work it shows
                pass

    def expect(self, stage: str, total: int) -> None:
        self._emit(stage, 0, total)

    def advance(self, stage: str) -> None:
        self._emit(stage, 1, None)
