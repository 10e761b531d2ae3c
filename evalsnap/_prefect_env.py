"""Prefect settings evalsnap applies before Prefect is imported (CLI processes only)."""

from __future__ import annotations

import os


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
