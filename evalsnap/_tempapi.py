"""The temporary Prefect API the CLI starts (:func:`evalsnap.startup.prestart_ephemeral_api`):
Prefect's own server app (``prefect.server.api.server:create_app`` under uvicorn, as
Prefect's ephemeral server runs it), run as ``python -m evalsnap._tempapi HOST PORT``.

One difference: Prefect's automation services (*triggers* and *actions*) start only when the
API's database holds an enabled automation. They are a third of a second of the server's
start-up, and a temporary API's database rarely holds one (a user who created automations
without a server, with ``prefect automation create`` on the ephemeral API, keeps them: they
are in that database, and then the services start). ``PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED``
(or Prefect's older ``PREFECT_API_SERVICES_TRIGGERS_ENABLED``) in the environment is
followed as it is.
"""

from __future__ import annotations

import os
import sys
from typing import Any

_TRIGGER_SWITCHES = ("PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED",
                     "PREFECT_API_SERVICES_TRIGGERS_ENABLED")


def sqlite_path(url: str) -> str | None:
    """The file of a ``sqlite`` database URL (``sqlite+aiosqlite:///path``), else None (an
    in-memory database, or another kind)."""
    for prefix in ("sqlite+aiosqlite:///", "sqlite:///"):
        if url.startswith(prefix):
            path = url[len(prefix):].split("?", 1)[0]
            return path if path and path != ":memory:" else None
    return None


def holds_automations(path: str) -> bool:
    """Whether the SQLite database at ``path`` may hold an enabled automation: True unless a
    read-only look says none (no file yet: none)."""
    import sqlite3

    if not os.path.exists(path):
        return False
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=2) as db:
            row = db.execute("SELECT 1 FROM automation WHERE enabled LIMIT 1").fetchone()
    except sqlite3.Error as exc:
        # a database Prefect has not made its tables in yet has none; anything else: maybe
        return "no such table" not in str(exc)
    return row is not None


def automations_wanted(settings: Any, environ: Any = os.environ) -> bool:
    """Whether this temporary API starts Prefect's triggers and actions services."""
    if any(name in environ for name in _TRIGGER_SWITCHES):
        return bool(settings.server.services.triggers.enabled)  # as the user says
    if not settings.server.services.triggers.enabled:
        return False
    url = settings.server.database.connection_url
    path = sqlite_path(url.get_secret_value() if hasattr(url, "get_secret_value") else str(url))
    return path is None or holds_automations(path)


def _leave_out_automations() -> None:
    """Switches the automation services off for this process (every thread's settings, and
    the environment of any process the server starts) unless :func:`automations_wanted`.
    Only a start-up saving: whatever fails here leaves Prefect's settings as they were."""
    name = _TRIGGER_SWITCHES[0]
    before = os.environ.get(name)
    try:
        from prefect.context import refresh_global_settings_context
        from prefect.settings import get_current_settings

        if automations_wanted(get_current_settings()):
            return
        os.environ[name] = "false"
        refresh_global_settings_context()
    except Exception:  # noqa: BLE001 - another Prefect's settings: its services, as they were
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def main(argv: list[str]) -> None:
    host, port = argv
    _leave_out_automations()
    import uvicorn

    uvicorn.run("prefect.server.api.server:create_app", factory=True, host=host,
                port=int(port), log_level="error", lifespan="on")


if __name__ == "__main__":
    main(sys.argv[1:])
