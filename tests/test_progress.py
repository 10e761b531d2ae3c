"""The run's progress artifact (:class:`evalsnap.reports.artifacts.RunProgress`): its API
calls are made by a thread of its own, newest percentage only, and the last one is sent
when it closes. Prefect's two artifact functions are replaced by recorders here (the
artifact through a real API: ``tests/test_prefect_deployments.py``)."""

from __future__ import annotations

import threading

import prefect.artifacts
import pytest

from evalsnap.reports.artifacts import RunProgress


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> dict:
    calls: dict = {"created": [], "updates": [], "threads": set(), "gate": threading.Event(),
                   "entered": threading.Event()}
    calls["gate"].set()

    def create(progress: float, description: str) -> str:
        calls["created"].append((progress, description))
        calls["threads"].add(threading.current_thread().name)
        return "artifact-1"

    def update(artifact_id: str, progress: float) -> None:
        calls["entered"].set()
        calls["gate"].wait(10)
        calls["updates"].append((artifact_id, progress))
        calls["threads"].add(threading.current_thread().name)

    monkeypatch.setattr(prefect.artifacts, "create_progress_artifact", create)
    monkeypatch.setattr(prefect.artifacts, "update_progress_artifact", update)
    return calls


def test_updates_come_from_its_thread_and_close_sends_the_last(sent: dict) -> None:
    with RunProgress(4, "set: inference, scoring, publish") as progress:
        progress.advance()  # the first is sent at once
        progress.advance(3)  # final: always sent
    assert sent["created"] == [(0.0, "set: inference, scoring, publish")]
    assert sent["updates"][-1] == ("artifact-1", 100.0)
    assert {u[1] for u in sent["updates"]} <= {25.0, 100.0}
    assert sent["threads"] == {"evalsnap-progress"}
    assert not progress._thread.is_alive()


def test_a_slow_update_is_not_waited_for_and_only_the_newest_follows(sent: dict) -> None:
    sent["gate"].clear()  # the API takes its time with the first update
    progress = RunProgress(10, "d")
    progress.advance()  # 10 %: sent, and blocks in the API
    assert sent["entered"].wait(10)
    progress.MIN_INTERVAL_S = 0.0  # every advance asks for an update from here on
    for _ in range(5):
        progress.advance()  # returns while the first is still in the API
    assert sent["updates"] == []
    sent["gate"].set()
    progress.close()
    # the first, then only the newest of the five asked for meanwhile
    assert sent["updates"] == [("artifact-1", 10.0), ("artifact-1", 60.0)]


def test_grow_moves_the_goal(sent: dict) -> None:
    progress = RunProgress(2, "d")
    progress.MIN_INTERVAL_S = 0.0
    progress.advance(2)
    progress.grow(2)  # more work became known: 50 %
    progress.close()
    assert progress.percent == 50.0
    assert sent["updates"][-1] == ("artifact-1", 50.0)


def test_an_api_that_fails_is_a_warning(monkeypatch: pytest.MonkeyPatch,
                                        caplog: pytest.LogCaptureFixture) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError("no API here")

    monkeypatch.setattr(prefect.artifacts, "create_progress_artifact", refuse)
    with caplog.at_level("WARNING", logger="evalsnap.reports.artifacts"):
        with RunProgress(1, "d") as progress:
            progress.advance()
    assert "could not create the progress artifact: no API here" in caplog.text
    assert not progress._thread.is_alive()
