"""Judge ledger: one entry per judge sample, trace coverage, failures, retries, reuse.

The pipeline runs in-process through ``evalsnap.pipeline.stages`` (no Prefect): one module-scoped
run of the example eval set; the reuse tests freeze new rules over the same inference.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from google.adk.evaluation.eval_set import EvalSet

from evalsnap.adk.config import eval_metric_for, resolve_config
from evalsnap.pipeline import ledger as _ledger
from evalsnap.pipeline import publish, stages
from evalsnap.pipeline.judge import ProcessLimiter
from evalsnap.pipeline.outcomes import InferenceOutcome, UnitOutcome
from evalsnap.pipeline.unit import score_unit
from evalsnap.records import EvaluationRecord, LedgerEntry, ScoreUnit, repo
from examples import _judge_answers, offline_models

ROOT = Path(__file__).resolve().parent.parent
SHOP = ROOT / "examples" / "shop_agent"
FRM = "final_response_match_v2"
RUBRIC = "rubric_based_final_response_quality_v1"
HALLUC = "hallucinations_v1"


# ---- a run without Prefect -------------------------------------------------------------------

def example_config() -> dict[str, Any]:
    return json.loads((SHOP / "test_config.json").read_text("utf-8"))


def only_judges(config: dict[str, Any], names: tuple[str, ...] = (FRM, RUBRIC, HALLUC)) -> dict:
    return {"criteria": {k: v for k, v in config["criteria"].items() if k in names}}


def infer_all(store_url: str) -> tuple[EvalSet, list[InferenceOutcome]]:
    eval_set = EvalSet.model_validate_json((SHOP / "shop.evalset.json").read_text("utf-8"))

    async def go() -> list[InferenceOutcome]:
        return list(await asyncio.gather(*(
            stages.infer_case(store_url, str(SHOP), c.model_dump(mode="json"),
                              eval_set.eval_set_id, 0, "infer", reuse=True)
            for c in eval_set.eval_cases)))
    return eval_set, asyncio.run(go())


def score_all(store_url: str, eval_set: EvalSet, outcomes: list[InferenceOutcome],
              config: dict[str, Any], *, reuse: bool) -> tuple[str, EvaluationRecord,
                                                               list[UnitOutcome], int]:
    """freeze → score every metric → publish, as the flows wire it; + live judge calls."""
    loaded = resolve_config(copy.deepcopy(config), where="<test config>")
    run_id = stages.new_run_id()
    before = offline_models.counters()["judge_calls"]
    snapshot_oid = stages.freeze(store_url, eval_set, loaded.rules, outcomes, "shop_agent")

    async def go() -> list[UnitOutcome]:
        out: list[UnitOutcome] = []
        for rule in loaded.rules:
            out += await stages.score_metric(
                store_url, snapshot_oid, rule.metric_name, json.dumps(config, sort_keys=True),
                "<test config>", [str(SHOP.parent)], run_id, reuse, False, concurrency=16)
        return out

    units = asyncio.run(go())
    calls = offline_models.counters()["judge_calls"] - before
    oid, record = publish.publish(store_url, run_id=run_id, kind="rescore",
                                  snapshot_oid=snapshot_oid, inference=outcomes, units=units,
                                  reuse=reuse, force=False)
    return oid, record, units, calls


def units_of(store_url: str, units: list[UnitOutcome]) -> dict[tuple[str, str], ScoreUnit]:
    store = repo.open_store(store_url)
    return {(u.eval_id, u.metric_name): repo.get(store, ScoreUnit, u.unit_oid) for u in units}


def entries(store_url: str, unit: ScoreUnit) -> list[LedgerEntry]:
    store = repo.open_store(store_url)
    return [repo.get(store, LedgerEntry, oid) for oid in unit.ledger]


def samples_of(config: dict[str, Any], metric: str) -> int:
    return config["criteria"][metric]["judgeModelOptions"].get("numSamples", 1)


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The example eval set, every metric, scored once without --reuse."""
    with pytest.MonkeyPatch.context() as mp:
        for key in [k for k in __import__("os").environ if k.startswith("EVALSNAP_DEMO_")]:
            mp.delenv(key)
        url = str(tmp_path_factory.mktemp("ledger") / "store")
        repo.open_store(url).check()
        eval_set, outcomes = infer_all(url)
        config = example_config()
        oid, record, units, calls = score_all(url, eval_set, outcomes, config, reuse=False)
        store = repo.open_store(url)
        n_inv = {o.eval_id: len(repo.get_inference(store, o.oid).invocations) for o in outcomes}
        return dict(url=url, eval_set=eval_set, outcomes=outcomes, config=config, record=record,
                    units=units_of(url, units), judge_calls=calls, n_inv=n_inv)


# ---- what is recorded ------------------------------------------------------------------------

def test_one_ledger_entry_per_judge_sample(first: dict[str, Any]) -> None:
    total = 0
    for (eval_id, metric), unit in first["units"].items():
        if metric not in (FRM, RUBRIC, HALLUC):
            continue
        n = first["n_inv"][eval_id]
        # hallucinations_v1 asks twice per answer (segmenter, validator); the others numSamples
        per = 2 if metric == HALLUC else samples_of(first["config"], metric)
        got = entries(first["url"], unit)
        assert len(got) == n * per, (eval_id, metric)
        total += len(got)
        assert Counter(e.invocation_index for e in got) == {i: per for i in range(n)}
        for e in got:
            assert (e.metric_name, e.eval_id, e.attempt, e.source) == (metric, eval_id, 1, "model")
            assert e.request["contents"][0]["parts"][0]["text"]  # the rendered prompt
            assert e.raw_response and e.parse_ok and e.error is None
            assert e.judge_model == {"model": "offline-judge-v1",
                                     "class": "examples.offline_models.OfflineJudgeLlm"}
            assert e.aggregation_version.startswith("adk-") and e.evaluator.endswith("Evaluator")
        if metric == FRM:
            assert sorted(e.sample_index for e in got) == sorted(list(range(3)) * n)
            assert {e.parsed["label"] for e in got} <= {"valid", "invalid"}
            assert all(e.parsed["rationale"] for e in got)
        if metric == RUBRIC:
            assert all(e.parsed["verdicts"] and e.parsed["rubric_scores"] for e in got)
        if metric == HALLUC:
            assert Counter(e.role for e in got) == {"segmenter": n, "validator": n}
    assert total == first["judge_calls"] == first["record"].summary.judge_calls > 0


def test_trace_coverage(first: dict[str, Any]) -> None:
    for (_, metric), unit in first["units"].items():
        if metric in (FRM, RUBRIC, HALLUC):
            assert unit.trace == "complete" and unit.ledger, metric
        else:
            assert unit.trace == "not_needed" and not unit.ledger and unit.judge_calls == 0


def _one_unit(first: dict[str, Any], criteria: dict[str, Any], metric: str,
              eval_id: str = "weather_paris") -> tuple[ScoreUnit, Any]:
    loaded = resolve_config({"criteria": criteria}, where="<test>")
    rule = next(r for r in loaded.rules if r.metric_name == metric)
    store = repo.open_store(first["url"])
    outcome = next(o for o in first["outcomes"] if o.eval_id == eval_id)
    snapshot = stages.freeze(first["url"], first["eval_set"], loaded.rules, first["outcomes"],
                             "shop_agent")
    frozen = next(c for c in repo.get_snapshot(store, snapshot).cases if c.eval_id == eval_id)
    return asyncio.run(score_unit(rule, eval_metric_for(rule, None), frozen,
                                  repo.get_inference(store, outcome.oid), loaded.registry))


def test_credentials_and_headers_are_never_recorded(first: dict[str, Any],
                                                    tmp_path: Path) -> None:
    criteria = {FRM: {"threshold": 0.5, "judgeModelOptions": {
        "judgeModel": "offline-judge-v1", "numSamples": 1, "judgeModelConfig": {
            "temperature": 0.25,
            "httpOptions": {"headers": {"x-goog-api-key": "SECRET-API-KEY-123",
                                        "Authorization": "Bearer SECRET-TOKEN-456"},
                            "baseUrl": "https://SECRET-HOST.example"}}}}}
    unit, recorder = _one_unit(first, criteria, FRM)
    assert unit.status == "PASSED" and recorder.calls
    url = str(tmp_path / "clean")
    store = repo.open_store(url)
    store.check()
    oids = _ledger.write_entries(store, _ledger.entries_for(recorder, unit_rule(criteria),
                                                            _frozen(first), "r"))
    entry = repo.get(store, LedgerEntry, oids[0])
    assert entry.generation_config["temperature"] == 0.25  # the config that matters is kept
    blob = b"".join(p.read_bytes() for p in Path(url).rglob("*") if p.is_file())
    assert blob and b"SECRET" not in blob and b"http_options" not in blob.lower()


def unit_rule(criteria: dict[str, Any]) -> Any:
    return resolve_config({"criteria": criteria}, where="<test>").rules[0]


def _frozen(first: dict[str, Any]) -> Any:
    store = repo.open_store(first["url"])
    snapshot = repo.get_snapshot(store, first["record"].snapshot_oid)
    return next(c for c in snapshot.cases if c.eval_id == "weather_paris")


# ---- failures --------------------------------------------------------------------------------

def test_garbled_answer_is_recorded_raw_and_not_evaluated(first: dict[str, Any],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVALSNAP_DEMO_JUDGE_GARBLE", "1")
    unit, recorder = _one_unit(first, only_judges(first["config"], (FRM,))["criteria"], FRM)
    assert unit.status == "NOT_EVALUATED" and not unit.complete and unit.trace == "complete"
    assert [c.raw_response for c in recorder.calls] == [_judge_answers.GARBLED_ANSWER] * 3
    assert not any(c.parse_ok for c in recorder.calls)
    assert "unparseable" in (unit.reason or "")


def test_one_unparseable_sample_makes_the_invocation_not_evaluated(
        first: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    # ADK's majority vote would score the invocation from the 2 good samples; evalsnap
    # does not: a failed sample leaves the invocation NOT_EVALUATED and the unit incomplete.
    real, seen = offline_models.answer_prompt, []

    def second_garbled(prompt: str) -> tuple[str | None, str]:
        seen.append(prompt)
        return (None, "garbled") if len(seen) == 2 else real(prompt)

    monkeypatch.setattr(offline_models, "answer_prompt", second_garbled)
    unit, recorder = _one_unit(first, only_judges(first["config"], (FRM,))["criteria"], FRM)
    assert [c.parse_ok for c in recorder.calls].count(False) == 1
    assert unit.rows[0].status == "NOT_EVALUATED" and unit.rows[0].score is None
    assert unit.status == "NOT_EVALUATED" and not unit.complete


def test_transient_judge_errors_are_retried_and_every_attempt_recorded(
        first: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVALSNAP_DEMO_JUDGE_FAIL_FIRST", "1")
    monkeypatch.setenv("EVALSNAP_RETRY_DELAYS", "0.01,0.01")
    offline_models.reset_counters()
    unit, recorder = _one_unit(first, only_judges(first["config"], (FRM,))["criteria"], FRM)
    failed = [c for c in recorder.calls if c.error]
    assert len(failed) == 1 and "TransientModelError" in failed[0].error
    retried = [c for c in recorder.calls if c.sample_index == failed[0].sample_index]
    assert [c.attempt for c in retried] == [1, 2] and retried[1].parse_ok
    assert unit.complete and unit.status == "PASSED" and unit.judge_calls == 4


def test_judge_concurrency_is_bounded_across_event_loops() -> None:
    limiter, lock, state = ProcessLimiter(2), threading.Lock(), {"now": 0, "max": 0}

    async def one() -> None:
        async with limiter.slot():
            with lock:
                state["now"] += 1
                state["max"] = max(state["max"], state["now"])
            await asyncio.sleep(0.01)
            with lock:
                state["now"] -= 1

    async def many() -> None:
        await asyncio.gather(*(one() for _ in range(8)))

    threads = [threading.Thread(target=asyncio.run, args=(many(),)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert state["max"] == 2 and state["now"] == 0


def _free_slots(limiter) -> int:
    return limiter.free_slots()


def test_judge_limit_is_one_limit_across_processes() -> None:
    """The scoring worker inherits its parent's limiter: slots held in one process are
    missing in the other, and a process that dies holding slots can be made good."""
    import subprocess
    import sys

    from evalsnap.pipeline.judge import SHARED_LIMITER_ENV

    limiter = ProcessLimiter(3)

    async def take(n: int) -> None:
        for _ in range(n):
            await limiter.acquire()

    asyncio.run(take(2))  # the parent holds 2 of 3
    child = (
        "import asyncio\n"
        "from evalsnap.pipeline.judge import judge_limiter\n"
        "lim = judge_limiter()\n"
        "async def main():\n"
        "    await asyncio.wait_for(lim.acquire(), 5)\n"
        "    try:\n"
        "        await asyncio.wait_for(lim.acquire(), 0.5)\n"
        "        print('second', lim.slots)\n"
        "    except TimeoutError:\n"
        "        print('blocked', lim.slots)\n"
        "asyncio.run(main())\n")  # exits holding one slot
    env = {**os.environ, SHARED_LIMITER_ENV: ",".join(map(str, (*limiter.fds, 3)))}
    out = subprocess.run([sys.executable, "-c", child], pass_fds=limiter.fds, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["blocked", "3"], out.stderr
    assert _free_slots(limiter) == 0
    assert limiter.recover() == 1  # the child's slot, lost with it
    limiter.release()
    limiter.release()
    assert _free_slots(limiter) == 3
    assert limiter.recover() == 0


def test_a_cancelled_wait_for_a_judge_slot_loses_no_slot() -> None:
    limiter = ProcessLimiter(1)

    async def scenario() -> bool:
        await limiter.acquire()
        waiters = [asyncio.ensure_future(limiter.acquire()) for _ in range(3)]
        await asyncio.sleep(0.05)
        waiters[0].cancel()
        limiter.release()  # goes to the second waiter
        await asyncio.wait_for(waiters[1], 5)
        waiters[2].cancel()
        limiter.release()
        await asyncio.gather(*waiters, return_exceptions=True)
        await asyncio.sleep(0.05)
        return waiters[1].done() and not waiters[1].cancelled()

    assert asyncio.run(scenario())
    assert _free_slots(limiter) == 1


# ---- reuse -----------------------------------------------------------------------------------

def _changed(config: dict[str, Any], metric: str, **options: Any) -> dict[str, Any]:
    config = copy.deepcopy(config)
    criterion = config["criteria"][metric]
    for key, value in options.items():
        if key == "threshold":
            criterion["threshold"] = value
        else:
            criterion["judgeModelOptions"][key] = value
    return config


def test_threshold_only_change_with_reuse_makes_no_judge_call(first: dict[str, Any]) -> None:
    config = _changed(only_judges(first["config"], (FRM,)), FRM, threshold=0.0)
    offline_models.reset_counters()
    _, record, outcomes, calls = score_all(first["url"], first["eval_set"], first["outcomes"],
                                           config, reuse=True)
    n = sum(first["n_inv"].values())
    assert calls == 0 and record.summary.judge_calls == 0
    assert record.summary.reused_judge_samples == 3 * n
    assert all(u.why != "reused" and u.reused_judge_samples == 3 * first["n_inv"][u.eval_id]
               for u in outcomes)
    units = units_of(first["url"], outcomes)
    stale = units[("weather_paris_stale_reference", FRM)]
    assert first["units"][("weather_paris_stale_reference", FRM)].status == "FAILED"
    assert stale.status == "PASSED" and stale.threshold == 0.0 and stale.complete
    assert {e.source for e in entries(first["url"], stale)} == {"ledger"}


def test_more_samples_ask_the_judge_only_for_the_new_ones(first: dict[str, Any]) -> None:
    config = _changed(only_judges(first["config"], (FRM,)), FRM, numSamples=5)
    _, record, outcomes, calls = score_all(first["url"], first["eval_set"], first["outcomes"],
                                           config, reuse=True)
    n = sum(first["n_inv"].values())
    assert calls == record.summary.judge_calls == 2 * n
    for u in outcomes:
        assert u.judge_calls == 2 * first["n_inv"][u.eval_id]
        assert u.reused_judge_samples == 3 * first["n_inv"][u.eval_id]
        got = entries(first["url"], units_of(first["url"], [u])[(u.eval_id, FRM)])
        assert sorted((e.sample_index, e.source) for e in got) == sorted(
            [(i, "ledger") for i in range(3)] * first["n_inv"][u.eval_id]
            + [(i, "model") for i in (3, 4)] * first["n_inv"][u.eval_id])
