"""``evalsnap replay`` and ``run --reuse`` over the judge ledger, through the real CLI.

Four CLI runs in all (module-scoped); the rest calls ``evalsnap.reports.replay`` in-process.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from google.adk.evaluation import final_response_match_v2 as frm2
from google.adk.evaluation.llm_as_judge import AutoRaterScore
from typer.testing import CliRunner

from evalsnap.cli import app
from evalsnap.records import LedgerEntry, ScoreUnit, repo
from evalsnap.reports.replay import ReplayMismatchError, replay
from shop_agent import offline_models  # the demo's (examples/ on sys.path)
from tests._cli import run_inproc, score_status
from tests.conftest import EVALSET, SHOP

FRM = "final_response_match_v2"
# a few cases keep the CLI runs short: one and two invocations, and the designed FRM failure
CASES = ["weather_paris", "weather_paris_stale_reference", "cart_add_then_show"]
ONLY = [a for c in CASES for a in ("--case", c)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("replay")
    store = str(base / "store")
    demo_off = {"EVALSNAP_DEMO_JUDGE_GARBLE": "", "EVALSNAP_DEMO_JUDGE_FAIL_FIRST": ""}
    first = run_inproc("run", str(SHOP), str(EVALSET), "--store", store, *ONLY, "--json",
                    env=demo_off)
    replayed = run_inproc("replay", "latest", "--store", store, "--json", env=demo_off)
    config = json.loads((SHOP / "test_config.json").read_text("utf-8"))
    config["criteria"][FRM]["threshold"] = 0.0
    (base / "threshold.json").write_text(json.dumps(config))
    threshold = run_inproc("run", str(SHOP), str(EVALSET), "--config", str(base / "threshold.json"),
                        "--store", store, "--reuse", *ONLY, "--json", env=demo_off)
    garbled_store = str(base / "garbled")
    garbled = run_inproc("run", str(SHOP), str(EVALSET), "--store", garbled_store, "--metric", FRM,
                      "--case", "weather_paris", "--json",
                      env={**demo_off, "EVALSNAP_DEMO_JUDGE_GARBLE": "1"})
    return dict(store=store, first=first, replayed=replayed, threshold=threshold,
                garbled=garbled, garbled_store=garbled_store)


def test_replay_gives_identical_scores_with_zero_judge_calls(runs: dict[str, Any]) -> None:
    first, replayed = runs["first"], runs["replayed"]
    assert first.json["judge_calls"] > 0, first.stderr[-2000:]
    assert replayed.code == first.code, replayed.stderr[-2000:]
    r = replayed.json
    assert r["kind"] == "replay" and r["judge_calls"] == 0 and r["replay_changes"] == []
    assert r["replayed_record"] == first.json["record_id"]
    assert score_status(r) == score_status(first.json)
    assert all(m["judge_calls"] == 0 for c in r["cases"] for m in c["metrics"].values())


def test_replay_calls_no_model(runs: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    async def forbidden(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("replay called the judge model")
        yield  # pragma: no cover

    monkeypatch.setattr(offline_models.OfflineJudgeLlm, "generate_content_async", forbidden)
    offline_models.reset_counters()
    result = asyncio.run(replay(repo.open_store(runs["store"]), runs["first"].json["run_id"]))
    result = result.model_dump(mode="json")  # the --json object of `evalsnap replay`
    assert offline_models.counters()["judge_calls"] == 0
    assert score_status(result) == score_status(runs["first"].json) and result["complete"] is \
        runs["first"].json["complete"]


def test_replay_after_a_parser_change_recomputes_from_the_same_raw_answers(
        runs: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    # A "new parser": every valid answer now reads as invalid, under a new aggregation version.
    real = frm2.FinalResponseMatchV2Evaluator.convert_auto_rater_response_to_score

    def stricter(self: Any, response: Any) -> AutoRaterScore:
        score = real(self, response)
        return AutoRaterScore(score=0.0) if score.score is not None else score

    monkeypatch.setattr(frm2.FinalResponseMatchV2Evaluator,
                        "convert_auto_rater_response_to_score", stricter)
    monkeypatch.setattr(frm2.FinalResponseMatchV2Evaluator, "evalsnap_aggregation_version",
                        "test/stricter-parser", raising=False)
    offline_models.reset_counters()
    result = asyncio.run(replay(repo.open_store(runs["store"]), runs["first"].json["run_id"]))
    result = result.model_dump(mode="json")  # the --json object of `evalsnap replay`
    assert offline_models.counters()["judge_calls"] == 0 and result["judge_calls"] == 0
    before, after = score_status(runs["first"].json), score_status(result)
    frm_keys = [k for k in before if k[1] == FRM]
    assert frm_keys and all(after[k] == (0.0, "FAILED") for k in frm_keys)
    assert any(before[k] != after[k] for k in frm_keys)
    assert all(after[k] == before[k] for k in before if k[1] != FRM)
    changed = {c["eval_id"] for c in result["replay_changes"] if c["metric_name"] == FRM}
    assert changed == {k[0] for k in frm_keys}
    change = result["replay_changes"][0]
    assert change["aggregation_version"] == "test/stricter-parser"
    assert change["recorded_aggregation_versions"][0].startswith("adk-")
    assert result["passed"] is False and result["exit_code"] in (1, 3)


def test_a_request_that_no_longer_matches_the_ledger_fails_naming_case_and_metric(
        runs: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(frm2, "_FINAL_RESPONSE_MATCH_V2_PROMPT",
                        "Changed template.\n" + frm2._FINAL_RESPONSE_MATCH_V2_PROMPT)
    with pytest.raises(ReplayMismatchError, match=r"case 'weather_paris'.*metric "
                                                  r"'final_response_match_v2'.*does not match"):
        asyncio.run(replay(repo.open_store(runs["store"]), runs["first"].json["run_id"]))
    result = CliRunner().invoke(app, ["replay", runs["first"].json["run_id"], "--store",
                                      runs["store"], "--json"])
    assert result.exit_code == 2
    assert "final_response_match_v2" in result.output and "does not match" in result.output


def test_threshold_only_change_with_reuse_makes_zero_judge_calls(runs: dict[str, Any]) -> None:
    r = runs["threshold"]
    assert r.code in (0, 1, 3), r.stderr[-2000:]
    out = r.json
    assert out["judge_calls"] == 0 and out["agent_calls"] == 0
    assert out["reused_judge_samples"] > 0
    stale = next(c for c in out["cases"] if c["eval_id"] == "weather_paris_stale_reference")
    before = next(c for c in runs["first"].json["cases"]
                  if c["eval_id"] == "weather_paris_stale_reference")
    assert before["metrics"][FRM]["status"] == "FAILED"
    assert stale["metrics"][FRM]["status"] == "PASSED"  # recomputed under threshold 0.0
    assert stale["metrics"][FRM]["reused"] is False and stale["metrics"][FRM]["threshold"] == 0.0


def test_unparseable_judge_answer_exits_3_with_the_raw_answer_recorded(
        runs: dict[str, Any]) -> None:
    r = runs["garbled"]
    assert r.code == 3, r.stderr[-2000:]
    metric = r.json["cases"][0]["metrics"][FRM]
    assert metric["status"] == "NOT_EVALUATED" and metric["complete"] is False
    store = repo.open_store(runs["garbled_store"])
    ref = next(u for u in repo.resolve_record(store, "latest")[1].units)
    unit = repo.get(store, ScoreUnit, ref.unit_oid)
    got = [repo.get(store, LedgerEntry, oid) for oid in unit.ledger]
    assert len(got) == 3 and all(e.raw_response and "garbled" in e.raw_response for e in got)
    assert not any(e.parse_ok for e in got)
    assert not list(Path(runs["garbled_store"]).rglob("index/judge/*"))  # never reused
