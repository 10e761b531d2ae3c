"""In-process progress hooks (a terminal progress bar in the CLI; no-op elsewhere)."""

from __future__ import annotations

import threading
from collections.abc import Callable

_lock = threading.Lock()
_listeners: list[Callable[[str], None]] = []


def subscribe(listener: Callable[[str], None]) -> Callable[[], None]:
    with _lock:
        _listeners.append(listener)

    def unsubscribe() -> None:
        with _lock:
            if listener in _listeners:
                _listeners.remove(listener)

    return unsubscribe


def advance(stage: str) -> None:
    with _lock:
        listeners = list(_listeners)
    for listener in listeners:
        listener(stage)
