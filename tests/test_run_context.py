"""The run context (:mod:`evalsnap.pipeline.context`): one per run, found, never shared."""

from __future__ import annotations

import contextvars
import threading

import pytest

from evalsnap.pipeline import context
from evalsnap.pipeline.context import RunContext, Verdicts


def test_a_flow_takes_the_context_its_caller_gave_and_a_task_thread_finds_it() -> None:
    url = "memory://run-context/given"
    given = RunContext(url, storage_options={})
    with context.given(given), context.started(url) as ctx:
        assert ctx is given, "expected the flow to take its caller's context"
        assert context.of(url) is ctx
        assert context.of(ctx.store.url) is ctx, "expected the store's own spelling to match"
        seen: list[RunContext] = []
        # as Prefect's ThreadPoolTaskRunner submits a task: in a copy of the flow's context
        thread = threading.Thread(target=contextvars.copy_context().run,
                                  args=(lambda: seen.append(context.of(url)),))
        thread.start()
        thread.join(10)
        assert seen == [ctx], "expected a task thread to find its flow's context"
    assert context.of(url) is not given, "expected nothing kept once the run has ended"


def test_each_run_starts_with_a_new_context() -> None:
    url = "memory://run-context/new"
    with context.started(url) as first:
        first.commits.mark_published("set", "sha256:" + "0" * 64, "run-1")
        store = first.store
    with context.started(url) as second:
        assert second is not first and second.store is not store, \
            "expected a new run to get a new context and store"
        assert second.commits.published() == [], "expected no published records of another run"
    assert context.of(url) is not context.of(url), \
        "expected no registry of contexts outside a flow run"


def test_a_given_context_for_another_store_is_not_taken() -> None:
    given = RunContext("memory://run-context/one")
    with context.given(given), context.started("memory://run-context/two") as ctx:
        assert ctx is not given and ctx.store_url == "memory://run-context/two"


def test_a_process_that_serves_runs_keeps_the_contexts_of_the_last_two(
        monkeypatch: pytest.MonkeyPatch) -> None:
    url = "memory://run-context/worker"
    run = {"id": "flow-run-a"}
    monkeypatch.setattr(context, "_flow_run_id", lambda: run["id"])
    a = context.of(url)
    assert context.of(url) is a, "expected the tasks of one flow run to share its context"
    run["id"] = "flow-run-b"
    b = context.of(url)
    assert b is not a
    run["id"] = "flow-run-c"
    context.of(url)
    run["id"] = "flow-run-a"
    assert context.of(url) is not a, "expected the oldest flow run's context forgotten"
    served = RunContext(url, storage_options={"skip_instance_cache": "true"})
    context.serve(served, "flow-run-d")
    run["id"] = "flow-run-d"
    assert context.of(url) is served, "expected a scoring process to use the context it serves"


def test_verdicts_are_bounded() -> None:
    verdicts = Verdicts(size=3)
    for i in range(5):
        verdicts.put((f"key{i}", "digest"), i % 2 == 0)
    assert verdicts.get(("key0", "digest")) is None, "expected the oldest verdict forgotten"
    assert verdicts.get(("key4", "digest")) is True
    assert verdicts.get(("key3", "digest")) is False
