"""The inference batches of a run are made as they are submitted, a window of them ahead,
and their outcomes kept in the batches' order whatever order they finish in (issue 31:
30,000 cases submitted at once held every batch and outcome to the end of the inference).
A real Prefect flow and task runner; the task stands in for the inference task."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from typing import Any

from prefect import flow, task
from prefect.task_runners import ThreadPoolTaskRunner

import tasks.inference as inference
from evalsnap.pipeline import context
from evalsnap.pipeline.infer import InferBatch, InferItem


def _batch(store_url: str, first: int, size: int) -> InferBatch:
    return InferBatch(store_url=store_url, agent_dir=".", eval_set_id="s", run_id="r",
                      reuse=False, items=[InferItem(eval_id=f"case-{i}", repetition=0,
                                                    fingerprint=f"fp-{i}", case_json="{}")
                                          for i in range(first, first + size)])


def test_batches_are_made_a_window_ahead_and_outcomes_kept_in_order(tmp_path, monkeypatch):
    store_url = str(tmp_path / "store")
    ctx = context.RunContext(store_url)
    monkeypatch.setattr(inference, "WINDOW", 1)
    window = ctx.settings.max_workers  # batches submitted ahead: WINDOW per worker
    assert window < 15
    made: list[int] = []  # batches made, as run_inference asks for them
    done: list[int] = []  # batches whose task ended
    ahead: list[int] = []  # at each batch made: how many made whose task had not ended
    lock = threading.Lock()

    @task
    def stand_in(request: InferBatch) -> list[dict[str, Any]]:
        time.sleep(random.uniform(0, 0.05))  # finish out of order
        with lock:
            done.append(int(request.items[0].eval_id.split("-")[1]))
        return [{"eval_id": "wrong", "repetition": 9, "oid": f"sha256:{i.fingerprint}",
                 "fingerprint": i.fingerprint, "status": "success", "run_id": "r"}
                for i in request.items]

    monkeypatch.setattr(inference, "cached", lambda _task, _request: stand_in)

    def batches() -> Iterator[InferBatch]:
        for first in range(0, 3 * 2 * window, 3):
            with lock:
                ahead.append(len(made) - len(done))
                made.append(first)
            yield _batch(store_url, first, 3)

    @flow(task_runner=ThreadPoolTaskRunner(max_workers=2))
    def infer_all() -> list[tuple[str, int, str]]:
        with context.given(ctx):
            rows = inference.run_inference(batches())
        return [(o.eval_id, o.repetition, o.fingerprint) for o in rows]

    got = infer_all()
    assert got == [(f"case-{i}", 0, f"fp-{i}") for i in range(3 * 2 * window)]  # the batches' order,
    # named after the items (not after what the task returned)
    assert len(made) == 2 * window and sorted(done) == made
    assert max(ahead) <= window, ahead  # never more than a window made and not run
    assert max(ahead) >= window - 1, ahead  # and the window is used (the workers never idle)


def test_another_runner_gets_every_batch_at_once() -> None:
    """On a runner other than the flow's thread pool (a Dask cluster of any size) every
    batch is submitted at once, as before: a window sized by the threads would starve it."""
    from prefect.task_runners import ProcessPoolTaskRunner

    @flow(task_runner=ThreadPoolTaskRunner(max_workers=3))
    def threads() -> int:
        return inference._window(3)

    @flow(task_runner=ProcessPoolTaskRunner(max_workers=1))
    def processes() -> int:
        return inference._window(3)

    assert threads() == inference.WINDOW * 3
    assert processes() > 10**9
