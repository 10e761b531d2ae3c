"""Judge ledger: one entry per judge sample, trace coverage, failures, retries, reuse.

The pipeline runs in this process through the real flows (``flows.evaluate``,
``flows.rescore``) on the session's Prefect server: one module-scoped run of the example
eval set; the reuse tests rescore it with new rules. In-process, so the offline judge's
own counters see every judge call.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from google.adk.evaluation.eval_set import EvalSet

from evalsnap.adk.config import eval_metric_for, resolve_config
from evalsnap.pipeline import ledger as _ledger
from evalsnap.pipeline.freeze import FreezeRequest, freeze
from evalsnap.pipeline.outcomes import InferenceOutcome
from evalsnap.pipeline.unit import score_unit
from evalsnap.records import EvaluationRecord, LedgerEntry, ScoreUnit, repo
from flows.evaluate import evaluate
from flows.rescore import rescore
from shop_agent import _judge_answers, offline_models  # the demo's (examples/ on sys.path)

ROOT = Path(__file__).resolve().parent.parent
SHOP = ROOT / "examples" / "shop_agent"
FRM = "final_response_match_v2"
RUBRIC = "rubric_based_final_response_quality_v1"
HALLUC = "hallucinations_v1"


# ---- runs through the real flows -------------------------------------------------------------

def example_config() -> dict[str, Any]:
    return json.loads((SHOP / "test_config.json").read_text("utf-8"))


def only_judges(config: dict[str, Any], names: tuple[str, ...] = (FRM, RUBRIC, HALLUC)) -> dict:
    return {"criteria": {k: v for k, v in config["criteria"].items() if k in names},
            "evalsnapPlugins": config.get("evalsnapPlugins", [])}


@dataclass(frozen=True)
class UnitView:
    """A published unit as these tests read it: the record's reference + the stored unit."""

    eval_id: str
    metric_name: str
    unit_oid: str
    why: str
    judge_calls: int
    reused_judge_samples: int


def _published(url: str, record_oid: str) -> tuple[EvaluationRecord, list[UnitView]]:
    store = repo.open_store(url)
    record = repo.get(store, EvaluationRecord, record_oid)
    views = []
    for ref in record.units:
        unit = repo.get(store, ScoreUnit, ref.unit_oid)
        reused = sum(1 for oid in unit.ledger
                     if repo.get(store, LedgerEntry, oid).source == "ledger")
        views.append(UnitView(ref.eval_id, ref.metric_name, ref.unit_oid, ref.why,
                              unit.judge_calls, reused))
    return record, views


def score_all(first: dict[str, Any], config: dict[str, Any], *,
              reuse: bool) -> tuple[str, EvaluationRecord, list[UnitView], int]:
    """``rescore`` of the first run with ``config`` (the real flow); + live judge calls."""
    path = Path(first["url"]).parent / f"config-{len(os.listdir(Path(first['url']).parent))}.json"
    path.write_text(json.dumps(config), "utf-8")
    before = offline_models.counters()["judge_calls"]
    result = rescore(run_or_snapshot=first["run_id"], config=str(path), store=first["url"],
                     reuse=reuse, code_paths=[str(SHOP.parent)], fail_on="never")
    calls = offline_models.counters()["judge_calls"] - before
    record, units = _published(first["url"], result["record_id"])
    assert result["judge_calls"] == calls, "--json judge_calls counts the calls made"
    return result["record_id"], record, units, calls


def units_of(store_url: str, units: list[UnitView]) -> dict[tuple[str, str], ScoreUnit]:
    store = repo.open_store(store_url)
    return {(u.eval_id, u.metric_name): repo.find(store, ScoreUnit, u.unit_oid) for u in units}


def entries(store_url: str, unit: ScoreUnit) -> list[LedgerEntry]:
    store = repo.open_store(store_url)
    return [repo.find(store, LedgerEntry, oid) for oid in unit.ledger]


def samples_of(config: dict[str, Any], metric: str) -> int:
    return config["criteria"][metric]["judgeModelOptions"].get("numSamples", 1)


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The example eval set, every metric, scored once without --reuse (the evaluate flow)."""
    with pytest.MonkeyPatch.context() as mp:
        for key in [k for k in os.environ if k.startswith("EVALSNAP_DEMO_")]:
            mp.delenv(key)
        url = str(tmp_path_factory.mktemp("ledger") / "store")
        before = offline_models.counters()["judge_calls"]
        result = evaluate(agent_dir=str(SHOP), evalset=str(SHOP / "shop.evalset.json"),
                          store=url, fail_on="never")
        calls = offline_models.counters()["judge_calls"] - before
        record, units = _published(url, result["record_id"])
        store = repo.open_store(url)
        outcomes = [InferenceOutcome(eval_id=i.eval_id, repetition=i.repetition,
                                     oid=i.inference_oid, fingerprint=i.inference_fingerprint,
                                     status=i.status, run_id=record.run_id)
                    for i in record.inference]
        n_inv = {o.eval_id: len(repo.get_inference(store, o.oid).invocations) for o in outcomes}
        eval_set = EvalSet.model_validate_json((SHOP / "shop.evalset.json").read_text("utf-8"))
        return dict(url=url, run_id=record.run_id, eval_set=eval_set, outcomes=outcomes,
                    config=example_config(), record=record, units=units_of(url, units),
                    judge_calls=calls, n_inv=n_inv)


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
                                     "class": "shop_agent.offline_models.OfflineJudgeLlm"}
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
    snapshot = freeze(FreezeRequest(store_url=first["url"],
                                     eval_set_json=first["eval_set"].model_dump_json(),
                                     rules=loaded.rules, outcomes=first["outcomes"],
                                     app_name="shop_agent"), store)
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
    _, record, outcomes, calls = score_all(first, config, reuse=True)
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
    _, record, outcomes, calls = score_all(first, config, reuse=True)
    n = sum(first["n_inv"].values())
    assert calls == record.summary.judge_calls == 2 * n
    for u in outcomes:
        assert u.judge_calls == 2 * first["n_inv"][u.eval_id]
        assert u.reused_judge_samples == 3 * first["n_inv"][u.eval_id]
        got = entries(first["url"], units_of(first["url"], [u])[(u.eval_id, FRM)])
        assert sorted((e.sample_index, e.source) for e in got) == sorted(
            [(i, "ledger") for i in range(3)] * first["n_inv"][u.eval_id]
            + [(i, "model") for i in (3, 4)] * first["n_inv"][u.eval_id])
