"""ADK's efficiency metrics, token counts and the estimated cost, through the real CLI.

The efficiency metrics are computed at publish with ADK's own evaluators; these tests check
them against ADK's ``LocalEvalService`` on the same stored inference, the token counts
against the usage the offline models report, and the cost against tokens x prices by hand.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests._adk_parity import local_eval_service
from tests._cli import run_inproc
from tests.conftest import SHOP, CliResult

AGENT_MODEL, JUDGE_MODEL = "offline-agent-v1", "offline-judge-v1"
PRICES = {AGENT_MODEL: {"inputPerMillion": 0.3, "outputPerMillion": 2.5},
          JUDGE_MODEL: {"inputPerMillion": 1.25, "outputPerMillion": 10.0}}
EFFICIENCY = {"tool_call_count_v1", "inference_call_count_v1", "token_usage_v1",
              "invocation_duration_v1"}
ZERO = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0, "cached_tokens": 0,
        "thoughts_tokens": 0}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, golden_demo: Any) -> dict[str, Any]:
    """A cold run without a price table (the session's cold run of the demo, copied:
    tests._golden), a --reuse rerun with one, a cold run with one, and a run with a
    malformed table."""
    base = tmp_path_factory.mktemp("efficiency")
    agent, plain_store, cold = golden_demo.copy(base)
    evalset = agent / "shop.evalset.json"
    config = json.loads((agent / "test_config.json").read_text())
    # the configs live beside the agent's directory, not in it: the cold run saw none of them
    priced = base / "priced_config.json"
    priced.write_text(json.dumps({**config, "evalsnapPrices": PRICES}))
    bad = base / "bad_prices_config.json"
    bad.write_text(json.dumps({**config, "evalsnapPrices": {
        AGENT_MODEL: {"inputPerMillion": 0.3, "outputPerMillion": "2.5"}}}))
    priced_store = base / "priced"

    def run(*extra: str) -> CliResult:
        return run_inproc("run", str(agent), str(evalset), "--json", *extra)

    # one after the other, in this process (tests._cli): no start-up to overlap
    results = {"cold": cold,
               "priced_cold": run("--store", str(priced_store), "--config", str(priced)),
               "malformed": run("--store", str(base / "bad"), "--config", str(bad))}
    results["priced_reuse"] = run("--store", str(plain_store), "--config", str(priced),
                                  "--reuse")
    record_id = results["cold"].json["record_id"]
    results["shown"] = run_inproc("show", record_id, "--store", str(plain_store), "--json")
    results["table"] = run_inproc("show", record_id, "--store", str(plain_store),
                               env={"COLUMNS": "400"})
    return {**results, "agent": agent, "evalset": evalset, "plain_store": plain_store}


def _events(invocation: dict[str, Any]) -> list[dict[str, Any]]:
    return (invocation.get("intermediate_data") or {}).get("invocation_events") or []


def _word_counts(request: dict[str, Any], answer: str) -> tuple[int, int]:
    """What the offline judge reports: words of the last user prompt and of its answer."""
    users = [c for c in request["contents"] if c.get("role") == "user"]
    prompt = "\n".join(p["text"] for p in users[-1].get("parts") or [] if p.get("text"))
    return len(prompt.split()), len(answer.split())


def _live_judge_entries(shown: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for c in shown["cases"] for m in c["metrics"].values() for e in m["ledger"]
            if e.get("source") == "model" and e.get("raw_response") is not None]


# ---- through the CLI -------------------------------------------------------------------------

def test_efficiency_values_equal_adk_local_eval_service(runs):
    """Same stored inference through ADK's LocalEvalService with the efficiency metrics ADK
    appends to every eval: same value, status and breakdown for each case."""
    from google.adk.evaluation.eval_config import append_default_efficiency_metrics
    from google.adk.evaluation.eval_set import EvalSet

    shown = runs["shown"].json
    eval_set = EvalSet.model_validate_json(runs["evalset"].read_text())
    metrics = append_default_efficiency_metrics([])
    assert {m.metric_name for m in metrics} == EFFICIENCY
    case_results = local_eval_service("shop_agent", eval_set, shown["cases"], metrics)
    results = [c for c in shown["cases"] if c["inference"]["status"] == "success"]
    adk = {}
    for case_result in case_results:
        for m in case_result.overall_eval_metric_results:
            details = m.details.token_usage_details or m.details.duration_details
            adk[(case_result.eval_id, m.metric_name)] = {
                "value": m.score, "status": m.eval_status.name,
                "details": details.model_dump() if details is not None else None}
    ours = {(c["eval_id"], name): value for c in shown["cases"]
            for name, value in c["efficiency"].items()}
    assert len(adk) == len(results) * len(EFFICIENCY) and len(results) >= 10
    assert ours == adk
    # the same values in `run --json`, and none of them vacuous
    cold = {(c["eval_id"], n): v for c in runs["cold"].json["cases"]
            for n, v in c["efficiency"].items()}
    assert cold == ours
    assert {v["status"] for v in ours.values()} == {"INFORMATIONAL"}
    assert max(v["value"] for (_, n), v in ours.items() if n == "tool_call_count_v1") >= 2
    assert all(v["value"] and v["details"]["total_tokens"] == v["value"]
               for (_, n), v in ours.items() if n == "token_usage_v1")


def test_agent_tokens_are_the_sums_the_scripted_model_reports(runs):
    shown, cold = runs["shown"].json, runs["cold"].json
    totals = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}
    for case in shown["cases"]:
        usages = [e["usage_metadata"] for i in case["inference"]["invocations"]
                  for e in _events(i) if e.get("usage_metadata")]
        prompt = sum(u["prompt_token_count"] for u in usages)
        answer = sum(u["candidates_token_count"] for u in usages)
        assert sum(u["total_token_count"] for u in usages) == prompt + answer
        expected = {"input_tokens": prompt, "output_tokens": answer,
                    "total_tokens": prompt + answer, "cached_tokens": None,
                    "thoughts_tokens": None}
        assert usages and case["tokens"] == expected, case["eval_id"]
        assert case["tokens_by_model"] == {AGENT_MODEL: expected}
        # ADK's token_usage_v1 is the per-turn average of the same counts
        turns = len(case["inference"]["invocations"])
        assert case["efficiency"]["token_usage_v1"]["value"] * turns == pytest.approx(
            prompt + answer)
        for key in totals:
            totals[key] += expected[key]
    expected_run = {**totals, "cached_tokens": None, "thoughts_tokens": None}
    assert cold["agent_tokens"] == expected_run
    assert cold["inference_tokens"] == expected_run  # all of it run now
    assert cold["model_tokens"][AGENT_MODEL] == expected_run
    assert cold["agent_calls"] == sum(len([e for i in c["inference"]["invocations"]
                                           for e in _events(i) if e.get("usage_metadata")])
                                      for c in shown["cases"])


def test_judge_tokens_are_the_sums_the_offline_judge_reports(runs):
    shown, cold = runs["shown"].json, runs["cold"].json
    entries = _live_judge_entries(shown)
    assert len(entries) == cold["judge_calls"] > 0
    prompt = answer = 0
    for entry in entries:
        usage = entry["usage_metadata"]
        assert entry["model_version"] == JUDGE_MODEL
        # what was recorded is what the model computed from the request and its answer
        assert (usage["prompt_token_count"], usage["candidates_token_count"]) == \
            _word_counts(entry["request"], entry["raw_response"])
        prompt += usage["prompt_token_count"]
        answer += usage["candidates_token_count"]
    expected = {"input_tokens": prompt, "output_tokens": answer, "total_tokens": prompt + answer,
                "cached_tokens": None, "thoughts_tokens": None}
    assert cold["judge_tokens"] == expected
    assert cold["model_tokens"] == {AGENT_MODEL: cold["agent_tokens"], JUDGE_MODEL: expected}


def test_no_price_table_means_no_cost(runs):
    cold = runs["cold"].json
    assert cold["estimated_cost"] is None and cold["prices"] == {}
    assert "evalsnapPrices" in cold["cost_note"]


def test_cost_is_tokens_times_prices(runs):
    priced, cold = runs["priced_cold"].json, runs["cold"].json
    assert runs["priced_cold"].code == runs["cold"].code
    agent, judge = priced["model_tokens"][AGENT_MODEL], priced["model_tokens"][JUDGE_MODEL]
    # the offline models are deterministic: the same tokens as the run without prices
    assert (agent, judge) == (cold["agent_tokens"], cold["judge_tokens"])
    by_hand = (agent["input_tokens"] * 0.3 + agent["output_tokens"] * 2.5
               + judge["input_tokens"] * 1.25 + judge["output_tokens"] * 10.0) / 1_000_000
    assert by_hand > 0
    assert priced["estimated_cost"] == pytest.approx(by_hand, rel=1e-12)
    assert priced["cost_note"] is None
    assert priced["prices"] == {
        m: {"input_per_million": p["inputPerMillion"], "output_per_million": p["outputPerMillion"]}
        for m, p in PRICES.items()}


def test_reuse_rerun_spends_no_tokens_and_the_price_table_changes_no_fingerprint(runs):
    """Adding a price table to the config: every inference and complete unit is reused."""
    warm, cold = runs["priced_reuse"].json, runs["cold"].json
    assert runs["priced_reuse"].code == runs["cold"].code, runs["priced_reuse"].stderr[-2000:]
    assert (warm["agent_calls"], warm["judge_calls"]) == (0, 0)
    incomplete = [(c["eval_id"], n) for c in cold["cases"] for n, m in c["metrics"].items()
                  if not m["complete"]]
    assert warm["reused_units"] == cold["scored_units"] - len(incomplete)
    assert all(c["inference_reused"] for c in warm["cases"])
    assert warm["agent_tokens"] == ZERO and warm["judge_tokens"] == ZERO
    assert warm["model_tokens"] == {}
    # the record still says what its (reused) inference cost whoever ran it
    assert warm["inference_tokens"] == cold["agent_tokens"] is not None
    # the same inference: the same efficiency values, durations (measured when it ran) included
    assert [c["efficiency"] for c in warm["cases"]] == [c["efficiency"] for c in cold["cases"]]
    assert [c["tokens"] for c in warm["cases"]] == [c["tokens"] for c in cold["cases"]]


def test_reuse_rerun_with_prices_costs_nothing(runs):
    warm = runs["priced_reuse"].json
    assert warm["estimated_cost"] == 0.0 and warm["cost_note"] is None


def test_malformed_price_table_is_exit_2_naming_the_key(runs):
    bad = runs["malformed"]
    assert bad.code == 2, bad.stderr[-2000:]
    assert f"evalsnapPrices.{AGENT_MODEL}.outputPerMillion" in bad.stderr
    assert "inputPerMillion" in bad.stderr and not bad.stdout.strip()


def test_show_json_and_table_show_efficiency_and_tokens(runs):
    shown, cold = runs["shown"].json, runs["cold"].json
    for key in ("agent_tokens", "judge_tokens", "inference_tokens", "model_tokens",
                "estimated_cost", "cost_note"):
        assert shown[key] == cold[key], key
    assert shown["record"]["summary"]["agent_tokens"] == cold["agent_tokens"]
    assert all(set(c["efficiency"]) == EFFICIENCY for c in shown["cases"])
    table = runs["table"]
    assert table.code == 0, table.stderr[-2000:]
    assert "agent tokens" in table.stdout
    assert f"tokens this run: agent {cold['agent_tokens']['total_tokens']:,}" in table.stdout


def test_summary_artifact_shows_tokens_cost_and_efficiency(runs):
    from evalsnap.reports.artifacts import efficiency_rows, summary_markdown

    cold = runs["cold"].json
    text = summary_markdown(cold, "store")
    assert f"| agent tokens spent now | {cold['agent_tokens']['total_tokens']:,} |" in text
    assert "| estimated cost | — (no price table" in text
    rows = {r["metric"]: r for r in efficiency_rows(cold)}
    assert set(rows) == EFFICIENCY
    calls = [c["efficiency"]["tool_call_count_v1"]["value"] for c in cold["cases"]]
    assert rows["tool_call_count_v1"]["mean"] == pytest.approx(sum(calls) / len(calls))
    assert rows["tool_call_count_v1"]["max"] == max(calls)


def test_records_of_older_runs_still_load_and_show(runs):
    """A record and a ledger entry written before these fields existed."""
    from evalsnap.records import EvaluationRecord, LedgerEntry, repo
    from evalsnap.reports.summary import score_table, summary

    shown = runs["shown"].json
    old = json.loads(json.dumps(shown["record"]))
    for ref in old["inference"]:
        for key in ("efficiency", "tokens", "tokens_by_model"):
            del ref[key]
    for key in ("agent_tokens", "judge_tokens", "inference_tokens", "model_tokens",
                "estimated_cost", "prices", "cost_note"):
        del old["summary"][key]
    record = EvaluationRecord.from_data(old)
    store = repo.open_store(str(runs["plain_store"]))
    result = summary(store, shown["record_id"], record)
    assert result.agent_tokens is None and result.estimated_cost is None
    assert all(c.efficiency == {} and c.tokens is None for c in result.cases)
    score_table(result)  # renders
    entry = dict(shown["cases"][0]["metrics"]["final_response_match_v2"]["ledger"][0])
    for key in ("oid", "usage_metadata", "model_version"):
        entry.pop(key, None)
    assert LedgerEntry.from_data(entry).usage_metadata is None


# ---- the pieces, without the CLI -------------------------------------------------------------

def test_counts_keep_not_reported_apart_from_zero():
    from google.genai import types

    from evalsnap.pipeline import efficiency

    full = efficiency.counts_of(types.GenerateContentResponseUsageMetadata(
        prompt_token_count=100, tool_use_prompt_token_count=5, candidates_token_count=20,
        thoughts_token_count=7, cached_content_token_count=40, total_token_count=132))
    assert full.model_dump() == {"input_tokens": 105, "output_tokens": 27, "total_tokens": 132,
                                 "cached_tokens": 40, "thoughts_tokens": 7}
    only_total = efficiency.counts_of(
        types.GenerateContentResponseUsageMetadata(total_token_count=9))
    assert only_total.model_dump() == {"input_tokens": None, "output_tokens": None,
                                       "total_tokens": 9, "cached_tokens": None,
                                       "thoughts_tokens": None}
    assert efficiency.total([]) is None
    summed = efficiency.total([full, None, only_total])
    assert summed is not None
    assert (summed.input_tokens, summed.total_tokens, summed.cached_tokens) == (105, 141, 40)


def test_cost_estimate_rules():
    from evalsnap.pipeline.efficiency import estimate_cost
    from evalsnap.records.record import ModelPrice, TokenCounts

    spent = {"m1": TokenCounts(input_tokens=2_000_000, output_tokens=1_000_000,
                               total_tokens=3_000_000),
             "idle": TokenCounts(input_tokens=0, output_tokens=0, total_tokens=0)}
    prices = {"m1": ModelPrice(input_per_million=0.5, output_per_million=2.0),
              "unused": ModelPrice(input_per_million=9.0, output_per_million=9.0)}
    cost, used, note = estimate_cost(spent, prices, 0)
    assert (cost, list(used), note) == (3.0, ["m1"], None)
    cost, _, note = estimate_cost({**spent, "m2": spent["m1"]}, prices, 0)
    assert cost is None and note is not None and "m2" in note
    cost, _, note = estimate_cost(spent, prices, 3)
    assert cost is None and note is not None and "3 model call(s)" in note
    assert estimate_cost(spent, None, 0)[0] is None
    cost, _, note = estimate_cost({"m1": TokenCounts(total_tokens=5)}, prices, 0)
    assert cost is None and note is not None and "split" in note
    assert estimate_cost({}, prices, 0)[:2] == (0.0, {})


@pytest.mark.parametrize("table, where", [
    ([1, 2], "`evalsnapPrices` must be an object"),
    ({"m": {"inputPerMillion": -1, "outputPerMillion": 1}}, "evalsnapPrices.m.inputPerMillion"),
    ({"m": {"inputPerMillion": 1}}, "evalsnapPrices.m.outputPerMillion"),
    ({"m": {"inputPerMillion": 1, "outputPerMillion": True}}, "evalsnapPrices.m.outputPerMillion"),
    ({"m": {"inputPerMilion": 1, "outputPerMillion": 1}}, "evalsnapPrices.m.inputPerMilion"),
    ({"m": 0.3}, "evalsnapPrices.m"),
    ({" ": {"inputPerMillion": 1, "outputPerMillion": 1}}, "empty model name"),
])
def test_malformed_price_tables_name_the_key(table: Any, where: str):
    from evalsnap.adk.config import read_prices
    from evalsnap.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        read_prices({"evalsnapPrices": table}, "cfg.json")
    assert where in str(info.value) and str(info.value).startswith("cfg.json: ")
    assert info.value.exit_code == 2


def test_price_table_is_read_and_is_no_part_of_any_rule():
    from evalsnap.adk.config import resolve_config

    base = json.loads((SHOP / "test_config.json").read_text())
    plain = resolve_config(base, where="plain")
    priced = resolve_config({**base, "evalsnapPrices": PRICES}, where="priced")
    assert plain.prices is None
    assert priced.prices is not None and priced.prices[JUDGE_MODEL].output_per_million == 10.0
    assert [r.model_dump() for r in priced.rules] == [r.model_dump() for r in plain.rules]


def test_judge_usage_is_the_last_reported_of_a_call():
    from google.adk.models.llm_response import LlmResponse
    from google.genai import types

    from evalsnap.pipeline.judge import response_usage

    def usage(n: int) -> types.GenerateContentResponseUsageMetadata:
        return types.GenerateContentResponseUsageMetadata(prompt_token_count=10,
                                                          candidates_token_count=n)

    chunks = [LlmResponse(usage_metadata=usage(1)), LlmResponse(usage_metadata=usage(4),
                                                                 model_version="judge-001"),
              LlmResponse()]
    assert response_usage(chunks) == ({"prompt_token_count": 10, "candidates_token_count": 4},
                                      "judge-001")
    assert response_usage([LlmResponse()]) == (None, None)


def test_publish_request_carries_prices():
    from evalsnap.pipeline.publish import PublishRequest
    from evalsnap.records.record import ModelPrice

    req = PublishRequest(store_url="x", run_id="r", kind="run", snapshot_oid="s", inference=[],
                         units=[], reuse=False, force=False,
                         prices={"m": ModelPrice(input_per_million=1, output_per_million=2)})
    assert PublishRequest.model_validate(req.model_dump()).prices == req.prices
