"""The temporary API (``python -m evalsnap._tempapi``) is Prefect's server app; its automation
services (triggers, actions) start only when its database holds an enabled automation, or
when the environment says so.

The end-to-end test starts the real server twice on one fresh ``PREFECT_HOME``: without
automations it runs without the services; an automation created through its API makes the
next start run them."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import types
from pathlib import Path

import httpx
import pytest

from evalsnap import _tempapi
from evalsnap.startup import wait_healthy


def test_sqlite_path() -> None:
    assert _tempapi.sqlite_path("sqlite+aiosqlite:////home/u/.prefect/prefect.db") == \
        "/home/u/.prefect/prefect.db"
    assert _tempapi.sqlite_path("sqlite:///rel.db?timeout=5") == "rel.db"
    assert _tempapi.sqlite_path("sqlite+aiosqlite:///:memory:") is None
    assert _tempapi.sqlite_path("postgresql+asyncpg://u:p@db/prefect") is None


def _db(path: Path, rows: list[int] | None) -> str:
    with sqlite3.connect(path) as db:
        if rows is not None:
            db.execute("CREATE TABLE automation (id TEXT, enabled BOOLEAN)")
            db.executemany("INSERT INTO automation VALUES ('a', ?)", [(r,) for r in rows])
        else:
            db.execute("CREATE TABLE flow (id TEXT)")
    return str(path)


def test_holds_automations(tmp_path: Path) -> None:
    assert not _tempapi.holds_automations(str(tmp_path / "none-yet.db"))
    assert not _tempapi.holds_automations(_db(tmp_path / "no-table.db", None))
    assert not _tempapi.holds_automations(_db(tmp_path / "empty.db", []))
    assert not _tempapi.holds_automations(_db(tmp_path / "disabled.db", [0, 0]))
    assert _tempapi.holds_automations(_db(tmp_path / "enabled.db", [0, 1]))
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database" * 100)
    assert _tempapi.holds_automations(str(garbage))  # cannot tell: maybe


def _settings(enabled: bool, url: str) -> types.SimpleNamespace:
    secret = types.SimpleNamespace(get_secret_value=lambda: url)
    return types.SimpleNamespace(server=types.SimpleNamespace(
        services=types.SimpleNamespace(triggers=types.SimpleNamespace(enabled=enabled)),
        database=types.SimpleNamespace(connection_url=secret)))


def test_automations_wanted(tmp_path: Path) -> None:
    none = "sqlite+aiosqlite:///" + str(tmp_path / "none.db")
    some = "sqlite+aiosqlite:///" + _db(tmp_path / "some.db", [1])
    assert not _tempapi.automations_wanted(_settings(True, none), {})
    assert _tempapi.automations_wanted(_settings(True, some), {})
    assert _tempapi.automations_wanted(_settings(True, "postgresql+asyncpg://db/p"), {})
    assert not _tempapi.automations_wanted(_settings(False, some), {})  # switched off
    # the environment's switch is followed as it is
    on = {"PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED": "true"}
    assert _tempapi.automations_wanted(_settings(True, none), on)
    assert not _tempapi.automations_wanted(
        _settings(False, some), {"PREFECT_API_SERVICES_TRIGGERS_ENABLED": "false"})


def _start(home: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PREFECT_API_", "PREFECT_SERVER_SERVICES_TRIGGERS"))}
    env.update(PREFECT_HOME=str(home), PREFECT_UI_ENABLED="0",
               PREFECT_SERVER_LOGGING_LEVEL="DEBUG", PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_API_BLOCKS_REGISTER_ON_START="false")
    process = subprocess.Popen([sys.executable, "-m", "evalsnap._tempapi", "127.0.0.1",
                                str(port)], env=env, stdout=subprocess.DEVNULL,
                               stderr=log.open("wb"))
    url = f"http://127.0.0.1:{port}/api"
    if not wait_healthy(url, process, 90):
        process.kill()
        pytest.fail(f"the temporary API did not start: {log.read_text()[-2000:]}")
    return process, url


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def test_the_services_start_only_for_an_automation(tmp_path: Path) -> None:
    home = tmp_path / "home"
    first, second = tmp_path / "first.log", tmp_path / "second.log"
    process, url = _start(home, first)
    try:
        time.sleep(0.5)  # the services have started (they start before the health check)
        created = httpx.post(f"{url}/automations/", json={
            "name": "evalsnap regression", "trigger": {
                "type": "event", "posture": "Reactive", "expect": ["evalsnap.run.regressed"],
                "threshold": 1, "within": 0},
            "actions": [{"type": "do-nothing"}]}, timeout=30)
        assert created.status_code == 201, created.text
    finally:
        _stop(process)
    log = first.read_text()
    assert "Skipping disabled perpetual service: evaluate_proactive_triggers_periodic" in log
    assert "ReactiveTriggers starting" not in log
    process, _ = _start(home, second)
    try:
        time.sleep(0.5)
    finally:
        _stop(process)
    log = second.read_text()
    assert "ReactiveTriggers starting" in log
    assert "Registered perpetual service: evaluate_proactive_triggers_periodic" in log


def test_a_failing_look_leaves_the_settings_as_they_were(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever fails while the launcher looks (another Prefect's settings, a database it
    cannot read) leaves the services as Prefect's settings say: the server still starts."""
    monkeypatch.delenv("PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED", raising=False)

    def broken(settings: object, environ: object = None) -> bool:
        raise AttributeError("no such setting")

    monkeypatch.setattr(_tempapi, "automations_wanted", broken)
    _tempapi._leave_out_automations()
    assert "PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED" not in os.environ
