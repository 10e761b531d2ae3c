"""Scoring on a second core through Prefect's ``ProcessPoolTaskRunner`` (``tasks.score``):
the same units as in one process, the pool's process really used, and nothing left behind."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

from tests._cli import run_inproc
from tests.conftest import prefect_api, run_cli


def _scores(result: dict) -> dict[tuple[str, str], tuple]:
    return {(c["eval_id"], name): (m["score"], m["status"], m["complete"])
            for c in result["cases"] for name, m in c["metrics"].items()}


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _task_run_names(run_id_store: str) -> list[str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.client.schemas.sorting import FlowRunSort

    with get_client(sync_client=True) as client:
        runs = [fr for fr in client.read_flow_runs(sort=FlowRunSort.START_TIME_DESC, limit=100)
                if fr.parameters.get("store") == run_id_store]
        assert runs, f"no flow run for store {run_id_store}"
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(
            id=FlowRunFilterId(any_=[runs[0].id])))
    return [t.name for t in tasks]


def test_a_scoring_process_gives_the_units_of_one_process(shop_copy: Path, tmp_path: Path,
                                                          golden_demo, recording_prefect_api):
    from evalsnap import settings

    evalset = str(shop_copy / "shop.evalset.json")
    # The one-process run: the session's cold run of the demo (the same agent, eval set and
    # config), too few units for a scoring process at the default threshold.
    one = golden_demo.copy(tmp_path / "golden")[2]
    units = len(one.json["cases"]) * len(one.json["cases"][0]["metrics"])
    assert units < settings.get().score_pool_min_units
    marker = uuid.uuid4().hex
    pooled_store = str(tmp_path / "pooled")
    pooled = run_cli("run", str(shop_copy), evalset, "--store", pooled_store, "--json",
                     env={"EVALSNAP_SCORE_PROCESSES": "1", "EVALSNAP_SCORE_POOL_MIN_UNITS": "0",
                          "PREFECT_API_URL": recording_prefect_api,  # its task runs, read below
                          "EVALSNAP_TEST_MARK": marker})
    assert pooled.code == one.code == 3, pooled.stderr[-3000:]  # the demo's designed outcome
    assert _scores(pooled.json) == _scores(one.json)
    same = ("agent_calls", "judge_calls", "scored_units", "complete", "passed")
    assert {k: pooled.json[k] for k in same} == {k: one.json[k] for k in same}
    with prefect_api(recording_prefect_api):
        names = _task_run_names(os.path.abspath(pooled_store))
    assert "prepare scoring process" in " ".join(names), names  # the pool was started
    assert len([n for n in names if n.startswith("score ")]) == len(one.json["cases"][0]["metrics"])
    deadline = time.monotonic() + 20
    while _processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _processes_with(marker) == [], "the scoring process outlived the CLI"
    verify = run_inproc("verify", "--store", pooled_store)
    assert verify.code == 0, verify.stdout + verify.stderr[-2000:]


def test_the_pool_starts_its_processes_before_the_inference(tmp_path: Path) -> None:
    """Prefect's pool submits from a thread of its own, later: a scoring process started
    during the inference would be stopped there as one the agent's tools left behind
    (``pipeline/leftovers.py``). The pool's processes exist when ``scoring_pool`` yields."""
    from types import SimpleNamespace

    import psutil

    from evalsnap.settings import Settings
    from tasks.score import scoring_pool
    from tests.conftest import SHOP

    settings = Settings(score_processes=1, score_pool_min_units=0)
    plan = SimpleNamespace(
        context=SimpleNamespace(settings=settings, storage_options={}),
        inference_total=2, metric_names=["a", "b"], store_url=str(tmp_path / "store"),
        sys_paths=[str(SHOP.parent)], agent_dir=str(SHOP), agent_name=None)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with scoring_pool(plan, SimpleNamespace(reuse=False, force=False), "threads") as pool:
        assert pool is not None
        started = [p for p in psutil.Process().children(recursive=True)
                   if p.pid not in before and "spawn_main" in " ".join(p.cmdline())]
        assert len(started) == 1, [p.cmdline() for p in started]
