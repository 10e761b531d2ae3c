"""Scale-out: the same flow on a DaskTaskRunner (LocalCluster, 2 worker processes) gives
the same record contents as the default thread runner."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.conftest import EVALSET

CASES = ["weather_paris", "cart_add_two_items", "greeting_then_weather"]
METRICS = ["tool_trajectory_avg_score", "final_response_match_v2", "response_mentions_city"]


def _contents(store: Path, run_id: str) -> dict:
    """What must not depend on where tasks ran: fingerprints, statuses, scores."""
    from evalsnap.records import repo
    from evalsnap.reports.show import full_record

    s = repo.open_store(str(store))
    oid, rec = repo.resolve_record(s, run_id)
    full = full_record(s, oid, rec)
    return {
        (c["eval_id"], c["repetition"]): {
            "inference": (c["inference"]["inference_fingerprint"], c["inference"]["status"]),
            "case_fingerprint": c["case_fingerprint"],
            "metrics": {name: (m["unit_fingerprint"], m["rule_fingerprint"], m["status"],
                               m["score"], m["complete"])
                        for name, m in c["metrics"].items()},
        }
        for c in full["cases"]
    }


def test_runner_choice():
    from evalsnap.errors import UsageError
    from evalsnap.pipeline.runners import resolve_runner

    assert resolve_runner(None, None) == ("threads", None)
    assert resolve_runner(None, "tcp://sched:8786") == ("dask", "tcp://sched:8786")
    with pytest.raises(UsageError, match="spark"):
        resolve_runner("spark", None)
    with pytest.raises(UsageError, match="dask"):
        resolve_runner("threads", "tcp://sched:8786")


def test_dask_local_cluster_matches_threads(shop_copy, tmp_path, monkeypatch):
    pytest.importorskip("prefect_dask")
    from prefect_dask import DaskTaskRunner

    import shop_agent.offline_models as offline  # the demo's models (examples/ on sys.path)
    from evalsnap.pipeline import runners
    from flows.evaluate import evaluate

    args = [str(shop_copy), str(shop_copy / EVALSET.name)]
    threads = evaluate(agent_dir=args[0], evalset=args[1], store=str(tmp_path / "threads"),
                       cases=CASES, metrics=METRICS, task_runner="threads", fail_on="never")

    built: list = []
    build = runners._dask_runner

    def spy(*a, **kw):
        built.append(build(*a, **kw))
        return built[-1]

    from evalsnap import settings

    monkeypatch.setenv("EVALSNAP_DASK_WORKERS", "1")  # one worker process: enough to
    # show every model call leaves this process (each more costs its own imports)
    settings.reload()
    monkeypatch.setattr(runners, "_dask_runner", spy)
    logging.getLogger("distributed").setLevel(logging.ERROR)
    offline.reset_counters()
    result = evaluate(agent_dir=args[0], evalset=args[1], store=str(tmp_path / "dask"),
                      cases=CASES, metrics=METRICS, task_runner="dask", fail_on="never")

    monkeypatch.delenv("EVALSNAP_DASK_WORKERS")
    settings.reload()  # the environment as it was, for later tests
    [runner] = built
    assert isinstance(runner, DaskTaskRunner)
    assert runner.cluster_kwargs == {"processes": True, "threads_per_worker": 1, "n_workers": 1}
    # Every model call happened in the Dask worker processes, none in this one.
    assert result["agent_calls"] > 0 and result["judge_calls"] > 0
    assert offline.counters()["agent_calls"] == 0
    assert offline.counters()["judge_calls"] == 0

    assert _contents(tmp_path / "dask", result["run_id"]) == \
        _contents(tmp_path / "threads", threads["run_id"])
    same = ("passed", "complete", "exit_code", "agent_calls", "judge_calls", "scored_units")
    assert {k: result[k] for k in same} == {k: threads[k] for k in same}
