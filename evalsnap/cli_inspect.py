"""CLI commands: explain, diff, ls. Registered on ``evalsnap.cli.app``."""

from __future__ import annotations

from evalsnap.cli import app  # noqa: F401
