"""The custom metric contract (seed 002): calling convention, result contract, gate, errors.

Most tests call ``resolve_config`` / ``score_unit`` in-process; one module-scoped CLI run
checks the whole path (Prefect flow, record, ``show --json``, exit codes) and one CLI run
checks that a broken config stops before any agent call.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from google.adk.evaluation.conversation_scenarios import ConversationScenario
from google.adk.evaluation.eval_case import EvalCase
from google.adk.evaluation.eval_config import EvalConfig
from google.adk.evaluation.eval_metrics import EvalMetric

from evalsnap.adk.config import _split_extensions, resolve_config
from evalsnap.errors import ConfigError, MetricImportError
from evalsnap.reports.summary import score_table
from evalsnap.reports.summary_model import CaseResult, MetricResult, RecordResult
from tests.metric_fixtures import good, harness

GOOD = "tests.metric_fixtures.good"
BAD = "tests.metric_fixtures.bad"
SEED_PLUGIN = "tests.metric_fixtures.seed_final_state"


@pytest.fixture(scope="module")
def agent():
    return harness.shop_agent()


@pytest.fixture(scope="module")
def cases() -> dict[str, EvalCase]:
    return harness.shop_cases()


@pytest.fixture(scope="module")
def records(agent, cases):
    wanted = ("weather_paris", "cart_add_then_show", "greeting_then_weather")
    return {eval_id: harness.infer(agent, cases[eval_id]) for eval_id in wanted}


@pytest.fixture(autouse=True)
def _clear_calls():
    good.CALLS.clear()


def _one(name: str, path: str, case: EvalCase, record, threshold: float = 1.0, **entry):
    loaded = resolve_config({"criteria": {name: threshold}, "customMetrics": {
        name: {"codeConfig": {"name": path}, **entry}}}, where="<test>")
    return harness.score(loaded, name, case, record)


# ---- calling convention -------------------------------------------------------------------------

@pytest.mark.parametrize("fn", ["sync_ones", "async_ones"])
def test_functions_get_four_positional_values(fn, cases, records) -> None:
    case = cases["cart_add_then_show"]
    unit = _one("mine", f"{GOOD}.{fn}", case, records["cart_add_then_show"], threshold=0.75)
    assert unit.status == "PASSED" and unit.complete and [r.score for r in unit.rows] == [1, 1]
    ((called, metric, actual, expected, scenario),) = good.CALLS
    assert called == fn
    assert isinstance(metric, EvalMetric) and metric.metric_name == "mine"
    assert metric.criterion.threshold == 0.75 and metric.threshold is None  # read the criterion
    assert len(actual) == 2 and expected == case.conversation and scenario is None


def test_expected_is_none_for_scenario_cases(cases, records) -> None:
    scenario = ConversationScenario(starting_prompt="What's the weather in Paris?",
                                    conversation_plan="Ask about the weather in Paris, then stop.")
    case = EvalCase(eval_id="simulated", conversation_scenario=scenario)
    record = records["weather_paris"].model_copy(update={"eval_id": "simulated"})
    assert _one("mine", f"{GOOD}.sync_ones", case, record).status == "PASSED"
    ((_, _, actual, expected, got_scenario),) = good.CALLS
    assert expected is None and got_scenario == scenario and len(actual) == 1


# ---- result contract ----------------------------------------------------------------------------

def test_wrong_row_count_is_not_evaluated_and_names_the_counts(cases, records) -> None:
    unit = _one("rows", f"{BAD}.too_few_rows", cases["cart_add_then_show"],
                records["cart_add_then_show"])
    assert unit.status == unit.metric_status == "NOT_EVALUATED" and not unit.complete
    assert "returned 1 per-invocation results for 2 actual invocations" in unit.reason
    assert [r.score for r in unit.rows] == [None, None]
    # Another metric on the same case, and the same metric's neighbours, are unaffected.
    assert _one("mine", f"{GOOD}.sync_ones", cases["cart_add_then_show"],
                records["cart_add_then_show"]).status == "PASSED"


def test_a_metric_that_raises_is_recorded_not_evaluated(cases, records) -> None:
    unit = _one("boom", f"{BAD}.raises", cases["weather_paris"], records["weather_paris"])
    assert unit.status == "NOT_EVALUATED" and not unit.complete
    assert "RuntimeError: boom from the metric" in unit.reason


def test_final_turn_only_metric_passes_the_gate(cases, records) -> None:
    unit = _one("last", f"{GOOD}.final_turn_only", cases["greeting_then_weather"],
                records["greeting_then_weather"])
    assert [(r.score, r.status) for r in unit.rows] == [(None, "NOT_EVALUATED"), (1.0, "PASSED")]
    assert unit.gate_score == unit.score == 1.0
    assert unit.status == unit.metric_status == "PASSED" and unit.complete and unit.reason is None


def test_score_outside_the_interval_is_not_evaluated(cases, records) -> None:
    case, record = cases["weather_paris"], records["weather_paris"]
    unit = _one("big", f"{BAD}.out_of_interval", case, record)
    assert unit.status == "NOT_EVALUATED"
    assert "outside its declared interval [0.0, 1.0]" in unit.reason
    # A declared metricInfo interval is honoured; its metricName is replaced by the map key.
    info = {"metricName": "something_else",
            "metricValueInfo": {"interval": {"minValue": 0.0, "maxValue": 2.0}}}
    unit = _one("big", f"{BAD}.out_of_interval", case, record, metricInfo=info)
    assert unit.status == "PASSED" and unit.score == 1.5
    loaded = resolve_config({"criteria": {"big": 1.0}, "customMetrics": {"big": {
        "codeConfig": {"name": f"{BAD}.out_of_interval"}, "metricInfo": info}}})
    assert loaded.rules[0].metric_info["metricName"] == "big"


def test_non_result_return_is_a_contract_violation(cases, records) -> None:
    unit = _one("d", f"{BAD}.returns_dict", cases["weather_paris"], records["weather_paris"])
    assert unit.status == "NOT_EVALUATED" and "not an ADK EvaluationResult" in unit.reason


def test_entirely_unscored_metric_does_not_pass(cases, records) -> None:
    unit = _one("none", f"{GOOD}.no_evidence", cases["cart_add_then_show"],
                records["cart_add_then_show"])
    assert unit.status == "NOT_EVALUATED" and not unit.complete and unit.gate_score is None
    assert "scored no invocation" in unit.reason


def test_gate_and_metric_disagreement_is_shown_in_record_and_table(cases, records) -> None:
    unit = _one("odd", f"{GOOD}.disagreeing", cases["weather_paris"], records["weather_paris"])
    assert unit.metric_status == "PASSED" and unit.score == 1.0
    assert unit.status == "FAILED" and unit.gate_score == 0.0 and unit.complete
    assert "metric reports PASSED" in unit.reason and "gives FAILED" in unit.reason
    result = RecordResult(
        eval_set_id="s", run_id="r", kind="run", record_id="sha256:r", scored_units=1,
        complete=True, passed=False, exit_code=1, cases=[CaseResult(
            eval_id="weather_paris", metrics={"odd": MetricResult(
                score=unit.score, status=unit.status, metric_status=unit.metric_status)})])
    assert "(metric: PASSED)" in _render(score_table(result))


def _render(table) -> str:
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(table)
    return console.export_text()


# ---- config errors: exit 2 with the troubleshooting hint ----------------------------------------

@pytest.mark.parametrize(("raw", "error", "hint"), [
    ({"criteria": {"x": 1.0}, "customMetrics": {"x": {"codeConfig": {"name": "nope.mod.fn"}}}},
     MetricImportError, "must match the module file and function names"),
    ({"criteria": {"x": 1.0}, "customMetrics": {"x": {"codeConfig": {"name": f"{BAD}.missing"}}}},
     MetricImportError, "must match the module file and function names"),
    ({"criteria": {"x": 1.0},
      "customMetrics": {"x": {"codeConfig": {"name": f"{BAD}.not_callable"}}}},
     MetricImportError, "must match the module file and function names"),
    ({"criteria": {"x": 1.0},
      "customMetrics": {"x": {"codeConfig": {"name": f"{BAD}.three_args"}}}},
     ConfigError, "four positional arguments"),
    ({"criteria": {"response_mention_city": 1.0},
      "customMetrics": {"response_mentions_city": {"codeConfig": {"name": f"{GOOD}.sync_ones"}}}},
     ConfigError, "name it under both `criteria` and `customMetrics`"),
    ({"criteria": {"x": 1.0}, "customMetrics": {"x": {"description": "no codeConfig"}}},
     ConfigError, "Each entry needs codeConfig.name"),
    ({"criteria": {"x": 1.0}, "customMetrics": {"x": {"codeConfig": {}}}},
     ConfigError, "Each entry needs codeConfig.name"),
    ({"criteria": {"x": 1.0}, "customMetrics": {"x": {"codeConfig": {"name": f"{GOOD}.sync_ones"},
                                                      "version": None}}},
     ConfigError, "non-empty version string"),
    ({"criteria": {"x": 1.0}, "evalsnapPlugins": ["tests.metric_fixtures.nope"]},
     MetricImportError, "evalsnapPlugins"),
])
def test_config_errors_are_exit_2_with_a_hint(raw, error, hint) -> None:
    with pytest.raises(error) as info:
        resolve_config(raw, where="cfg.json")
    assert info.value.exit_code == 2
    assert hint in str(info.value) and "cfg.json" in str(info.value)


def test_unknown_metric_suggests_the_near_name() -> None:
    raw = {"criteria": {"response_mention_city": 1.0}, "customMetrics": {
        "response_mentions_city": {"codeConfig": {"name": f"{GOOD}.sync_ones"}}}}
    with pytest.raises(ConfigError, match="Did you mean 'response_mentions_city'"):
        resolve_config(raw)


def test_version_key_is_stripped_and_the_rest_is_what_adk_reads() -> None:
    raw = json.loads((harness.SHOP / "test_config.json").read_text("utf-8"))
    raw["metricVersions"] = {"final_state_match": "7"}
    raw["evalsnapPlugins"] = []
    adk_raw, versions = _split_extensions(raw, "<shop>")
    assert versions == {"response_mentions_city": "1", "final_state_match": "7"}
    assert "version" not in adk_raw["customMetrics"]["response_mentions_city"]
    assert not {"metricVersions", "evalsnapPlugins"} & set(adk_raw)
    assert "version" in raw["customMetrics"]["response_mentions_city"]  # input not mutated
    stripped = EvalConfig.model_validate(adk_raw)
    assert stripped == EvalConfig.model_validate(
        {k: v for k, v in raw.items() if k not in ("metricVersions", "evalsnapPlugins")})
    from evalsnap.agents.base import ensure_importable

    ensure_importable(harness.SHOP)  # the custom metric lives in the agent package
    loaded = resolve_config(raw)
    rules = {r.metric_name: r for r in loaded.rules}
    assert rules["response_mentions_city"].evaluator.version == "1"
    assert rules["response_mentions_city"].evaluator.trusted
    assert rules["final_state_match"].evaluator.version == "7"


def test_unversioned_custom_function_is_never_trusted() -> None:
    loaded = resolve_config({"criteria": {"x": 1.0}, "customMetrics": {
        "x": {"codeConfig": {"name": f"{GOOD}.sync_ones"}}}})
    assert loaded.rules[0].evaluator.kind == "custom_function"
    assert not loaded.rules[0].evaluator.trusted


# ---- end to end through the CLI -----------------------------------------------------------------

CLI_METRICS = {
    "good_sync": f"{GOOD}.sync_ones", "good_async": f"{GOOD}.async_ones",
    "last_turn": f"{GOOD}.final_turn_only", "disagree": f"{GOOD}.disagreeing",
    "rows": f"{BAD}.too_few_rows", "boom": f"{BAD}.raises", "big": f"{BAD}.out_of_interval",
}
CLI_CASES = ("weather_paris", "cart_add_then_show", "cart_state_mismatch")


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    from tests._cli import run_inproc
    from tests.conftest import EVALSET, SHOP

    tmp = tmp_path_factory.mktemp("custom")
    config = {
        "evalsnapPlugins": [SEED_PLUGIN],
        "criteria": {"tool_trajectory_avg_score": 1.0, "final_state_match": 1.0,
                     **{name: 1.0 for name in CLI_METRICS}},
        "customMetrics": {name: {"codeConfig": {"name": path}}
                          for name, path in CLI_METRICS.items()},
    }
    (tmp / "test_config.json").write_text(json.dumps(config))
    store = tmp / "store"
    case_args = [a for c in CLI_CASES for a in ("--case", c)]
    run = run_inproc("run", str(SHOP), str(EVALSET), "--config", str(tmp / "test_config.json"),
                  "--store", str(store), "--json", *case_args)
    show = run_inproc("show", run.json["record_id"], "--store", str(store), "--json")
    return run, show


def test_cli_run_isolates_bad_metrics_and_exits_3(cli_run) -> None:
    run, _ = cli_run
    assert run.code == 3, run.stderr[-3000:]
    out = run.json
    assert out["complete"] is False and out["passed"] is False
    by_case = {c["eval_id"]: c["metrics"] for c in out["cases"]}
    assert set(by_case) == set(CLI_CASES)
    for eval_id, metrics in by_case.items():
        assert metrics["good_sync"]["status"] == metrics["good_async"]["status"] == "PASSED"
        assert metrics["last_turn"]["status"] == "PASSED"
        assert metrics["tool_trajectory_avg_score"]["status"] == "PASSED"
        for bad in ("rows", "boom", "big"):
            assert metrics[bad]["status"] == "NOT_EVALUATED", (eval_id, bad)
            assert metrics[bad]["complete"] is False
        assert "boom from the metric" in metrics["boom"]["reason"]
        assert "outside its declared interval" in metrics["big"]["reason"]
        assert metrics["disagree"]["status"] == "FAILED"
        assert metrics["disagree"]["metric_status"] == "PASSED"
    assert "per-invocation results for 2 actual invocations" in (
        by_case["cart_add_then_show"]["rows"]["reason"])
    # The seed's evaluator, registered by the evalsnapPlugins module, ran in the flow.
    assert by_case["cart_state_mismatch"]["final_state_match"]["status"] == "FAILED"
    assert by_case["weather_paris"]["final_state_match"]["status"] == "PASSED"


def test_cli_show_json_has_states_reasons_and_rules(cli_run) -> None:
    _, show = cli_run
    assert show.code == 0, show.stderr[-3000:]
    full = show.json
    cases = {c["eval_id"]: c for c in full["cases"]}
    cart = cases["cart_add_then_show"]
    assert cart["initial_session_state"] == {}
    assert cart["final_session_state"] == {"cart": [{"item": "lemon", "quantity": 3}]}
    assert cases["weather_paris"]["initial_session_state"] == {}
    assert cases["cart_state_mismatch"]["reference"]["final_session_state"] == {
        "cart": [{"item": "banana", "quantity": 2}]}
    disagree = cart["metrics"]["disagree"]
    assert "metric reports PASSED" in disagree["reason"]
    assert [r["score"] for r in cart["metrics"]["last_turn"]["rows"]] == [None, 1.0]
    rules = {r["metric_name"]: r for r in full["snapshot"]["rules"]}
    assert rules["final_state_match"]["evaluator"]["name"].startswith(SEED_PLUGIN)


def test_cli_config_error_stops_before_any_agent_call(tmp_path: Path) -> None:
    from tests._cli import run_inproc
    from tests.conftest import EVALSET, SHOP

    config = tmp_path / "test_config.json"
    config.write_text(json.dumps({"criteria": {"x": 1.0}, "customMetrics": {
        "x": {"codeConfig": {"name": "shop_agent.metricz.fn"}}}}))
    store = tmp_path / "store"
    run = run_inproc("run", str(SHOP), str(EVALSET), "--config", str(config), "--store", str(store),
                  "--json")
    assert run.code == 2
    assert "must match the module file and function names" in run.stderr
    assert not [p for p in store.rglob("*") if p.is_file() and "inference" in str(p)]
