"""Prefect settings evalsnap applies before Prefect is imported (CLI processes only)."""

from __future__ import annotations

import os
from typing import Any


def apply_defaults() -> None:
    import warnings

    # ADK marks its whole eval API experimental and warns on every construction.
    warnings.filterwarnings("ignore", message=r"\[EXPERIMENTAL\]", category=UserWarning)
    # No telemetry from an offline tool; keep Prefect's own console quiet on stdout.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
    os.environ.setdefault("PREFECT_RESULTS_PERSIST_BY_DEFAULT", "false")


_starter: Any = None


def prestart_ephemeral_api() -> None:
    """Starts Prefect's ephemeral API in the background when no API URL is configured.

    The ephemeral server takes seconds to become healthy; starting it while the CLI
    imports ADK and validates the inputs hides most of that. ``wait_for_ephemeral_api``
    joins before the first flow call, so the flow never races a half-started server.
    """
    global _starter
    if _starter is not None or os.environ.get("PREFECT_API_URL"):
        return
    import threading

    def start() -> None:
        try:
            from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED

            if PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
                return
            from prefect.server.api.server import SubprocessASGIServer

            SubprocessASGIServer().start()
        except Exception:  # noqa: BLE001 - the flow call starts it again and reports errors
            return

    _starter = threading.Thread(target=start, name="evalsnap-prefect-api", daemon=True)
    _starter.start()


def wait_for_ephemeral_api() -> None:
    if _starter is not None:
        _starter.join()
