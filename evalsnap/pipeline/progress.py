"""In-process progress events (a terminal progress bar in the CLI; no-op elsewhere).

A listener is called ``listener(stage, advance, total)``: ``expect(stage, n)`` announces
``total=n`` units of a stage, ``advance(stage)`` one more done.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

Listener = Callable[[str, int, "int | None"], None]
_lock = threading.Lock()
_listeners: list[Listener] = []


def subscribe(listener: Listener) -> Callable[[], None]:
    with _lock:
        _listeners.append(listener)

    def unsubscribe() -> None:
        with _lock:
            if listener in _listeners:
                _listeners.remove(listener)

    return unsubscribe


def _emit(stage: str, advance: int, total: int | None) -> None:
    with _lock:
        listeners = list(_listeners)
    for listener in listeners:
        try:
            listener(stage, advance, total)
        except Exception:  # noqa: BLE001 - a display must never stop the work it shows
            pass


def expect(stage: str, total: int) -> None:
    _emit(stage, 0, total)


def advance(stage: str) -> None:
    _emit(stage, 1, None)
