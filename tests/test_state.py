"""Session state for metrics (seed 000): capture at inference, EvaluationContext, copies.

Everything here runs in-process (no Prefect): ``run_inference`` on the offline shop agent
and ``score_unit`` on the records it returns.
"""

from __future__ import annotations

import asyncio
import json
import sys

import pytest
from google.adk.evaluation.eval_case import EvalCase, SessionInput
from google.adk.evaluation.eval_metrics import Interval, MetricInfo, MetricValueInfo
from google.adk.evaluation.evaluator import Evaluator
from google.adk.evaluation.metric_evaluator_registry import DEFAULT_METRIC_EVALUATOR_REGISTRY

import evalsnap.adk.context  # noqa: F401  (the shim; also imported by evalsnap.adk.config)
from evalsnap.adk.inference import CapturingSessionService
from evalsnap.agents.base import clean_state
from evalsnap.records import InferenceRecord
from tests.metric_fixtures import good, harness

# Expected final_state_match verdicts on the example eval set (see its description).
FINAL_STATE = {
    "cart_state_mismatch": "FAILED",  # mismatch: the reference expects 2 bananas
    "out_of_scope_flight": "NOT_EVALUATED",  # explicit null: no expectation
}


@pytest.fixture(scope="module")
def agent():
    return harness.shop_agent()


@pytest.fixture(scope="module")
def cases() -> dict[str, EvalCase]:
    return harness.shop_cases()


@pytest.fixture(scope="module")
def records(agent, cases) -> dict[str, InferenceRecord]:
    """One offline inference per example case (about a second for all of them)."""
    return {eval_id: harness.infer(agent, case) for eval_id, case in cases.items()}


@pytest.fixture
def extra_evaluators(monkeypatch: pytest.MonkeyPatch):
    """Registers Evaluator subclasses in the default registry for one test only."""
    monkeypatch.setattr(DEFAULT_METRIC_EVALUATOR_REGISTRY, "_registry",
                        dict(DEFAULT_METRIC_EVALUATOR_REGISTRY._registry))

    def register(**classes: type[Evaluator]) -> None:
        for name, cls in classes.items():
            info = MetricInfo(metric_name=name, metric_value_info=MetricValueInfo(
                interval=Interval(min_value=0.0, max_value=1.0)))
            DEFAULT_METRIC_EVALUATOR_REGISTRY.register_evaluator(metric_info=info, evaluator=cls)

    good.CALLS.clear()
    good.CONTEXTS.clear()
    return register


# ---- capture at inference ---------------------------------------------------------------------

def test_new_session_initial_state_is_the_seed_and_final_is_read_back(records) -> None:
    record = records["cart_add_to_prefilled"]
    assert record.initial_session_state == {"cart": [{"item": "apple", "quantity": 3}]}
    assert record.final_session_state == {"cart": [{"item": "apple", "quantity": 4}]}
    two = records["cart_add_then_show"]  # two turns: the state after the *last* one
    assert two.initial_session_state == {}
    assert two.final_session_state == {"cart": [{"item": "lemon", "quantity": 3}]}


def test_empty_state_is_a_valid_snapshot_not_none(records) -> None:
    for eval_id in ("weather_paris", "greeting_then_weather"):  # no session_input at all
        assert records[eval_id].initial_session_state == {}
        assert records[eval_id].final_session_state == {}


def test_pinned_existing_session_uses_its_stored_state(agent, cases) -> None:
    stored = {"cart": [{"item": "apple", "quantity": 3}], "user:tier": "gold",
              "__llm_request_key__": "left over by an earlier eval"}
    case = cases["cart_add_to_prefilled"].model_copy(update={"session_input": SessionInput(
        app_name="shop_agent", user_id="user_pin", session_id="pinned-1",
        state={"cart": [{"item": "pear", "quantity": 9}]})})  # only used when creating
    sessions = CapturingSessionService()
    asyncio.run(sessions.create_session(app_name="shop_agent", user_id="user_pin",
                                        session_id="pinned-1", state=stored))
    # An unrelated session prepared in the same service is not mistaken for the eval session.
    asyncio.run(sessions.create_session(app_name="shop_agent", user_id="user_pin",
                                        session_id="other", state={"cart": []}))
    record = harness.infer(agent, case, sessions)
    assert record.ok, record.error
    assert sessions.key == ("shop_agent", "user_pin", "pinned-1")
    assert record.initial_session_state == {"cart": [{"item": "apple", "quantity": 3}],
                                            "user:tier": "gold"}
    assert record.final_session_state == {"cart": [{"item": "apple", "quantity": 4}],
                                          "user:tier": "gold"}
    # The snapshots are detached: later session updates do not reach the record.
    session = asyncio.run(sessions.get_session(app_name="shop_agent", user_id="user_pin",
                                               session_id="pinned-1"))
    assert "__llm_request_key__" in session.state  # still in the service, only stripped
    record.final_session_state["cart"].clear()
    assert session.state["cart"] == [{"item": "apple", "quantity": 4}]


def test_internal_keys_are_removed_from_snapshots(records) -> None:
    assert clean_state({"__llm_request_key__": "x", "__other__": 1, "cart": [], "_a": 2}) == {
        "cart": [], "_a": 2}
    assert clean_state(None) is None
    for record in records.values():
        for state in (record.initial_session_state, record.final_session_state):
            assert state is not None and not any(k.startswith("__") for k in state)


def test_records_without_state_load_with_none(records) -> None:
    data = json.loads(records["weather_paris"].model_dump_json())
    del data["initial_session_state"], data["final_session_state"]
    old = InferenceRecord.model_validate(data)
    assert old.initial_session_state is None and old.final_session_state is None


# ---- final_state_match (built-in) on the example eval set ---------------------------------------

def test_final_state_match_on_the_example_eval_set(records, cases) -> None:
    loaded = harness.config({"final_state_match": 1.0})
    assert loaded.rules[0].evaluator.kind == "custom_class"  # evalsnap's, versioned
    assert loaded.rules[0].evaluator.trusted
    kinds = {"match": 0, "omitted": 0}
    for eval_id, case in cases.items():
        unit = harness.score(loaded, "final_state_match", case, records[eval_id])
        want = FINAL_STATE.get(eval_id, "PASSED")
        assert unit.status == want, (eval_id, unit.reason)
        if want == "NOT_EVALUATED":
            assert unit.rows == [] or all(r.score is None for r in unit.rows)
            assert not unit.complete
            continue
        # The case-level score repeated on each invocation; the gate is their mean.
        assert [r.score for r in unit.rows] == [unit.score] * len(case.conversation or [])
        raw = json.loads(case.model_dump_json(exclude_unset=True))
        kinds["omitted" if "final_session_state" not in raw else "match"] += want == "PASSED"
    assert kinds["match"] >= 5 and kinds["omitted"] >= 3


def test_final_state_match_needs_both_states(records, cases) -> None:
    loaded = harness.config({"final_state_match": 1.0})
    old = records["weather_paris"].model_copy(update={"final_session_state": None})
    unit = harness.score(loaded, "final_state_match", cases["weather_paris"], old)
    assert unit.status == "NOT_EVALUATED" and unit.reason


# ---- EvaluationContext and evaluate_with_context ------------------------------------------------

def test_context_api_is_installed_under_the_seed_names() -> None:
    from google.adk.evaluation import EvaluationContext
    from google.adk.evaluation import evaluator as adk_evaluator

    assert adk_evaluator.EvaluationContext is EvaluationContext
    assert set(EvaluationContext.model_fields) == {
        "initial_session_state", "final_session_state", "expected_final_session_state"}
    assert EvaluationContext().final_session_state is None
    assert callable(Evaluator.evaluate_with_context)


@pytest.mark.parametrize("name", ["legacy_sync", "legacy_async"])
def test_default_evaluate_with_context_calls_evaluate_invocations_unchanged(
        name, extra_evaluators, records, cases) -> None:
    extra_evaluators(legacy_sync=good.LegacySync, legacy_async=good.LegacyAsync)
    loaded = harness.config({name: 1.0})
    case = cases["cart_add_then_show"]
    unit = harness.score(loaded, name, case, records["cart_add_then_show"])
    assert unit.status == "PASSED" and len(unit.rows) == 2
    ((called, _, actual, expected, scenario),) = good.CALLS
    assert called == name
    assert [i.user_content for i in actual] == [
        i.user_content for i in records["cart_add_then_show"].invocations]
    assert expected == case.conversation and scenario is None


def test_each_metric_gets_its_own_copy(extra_evaluators, records, cases) -> None:
    extra_evaluators(mutator=good.MutatingEvaluator, reader=good.AsyncContextReader)
    loaded = harness.config({"mutator": 1.0, "reader": 1.0})
    case, record = cases["cart_add_to_prefilled"], records["cart_add_to_prefilled"]
    stored = record.model_dump_json()
    reference = case.model_dump_json()
    for _ in range(2):  # the vandal first, then the reader; twice, to be sure
        assert harness.score(loaded, "mutator", case, record).status == "PASSED"
        assert harness.score(loaded, "reader", case, record).status == "PASSED"
    assert record.model_dump_json() == stored  # the inference record is untouched
    assert case.model_dump_json() == reference
    seen = [ctx for who, ctx in good.CONTEXTS if who == "reader"]
    assert len(seen) == 2
    for ctx in seen:  # what the reader saw is the original, not the vandal's edits
        assert ctx.initial_session_state == {"cart": [{"item": "apple", "quantity": 3}]}
        assert ctx.final_session_state == ctx.expected_final_session_state == {
            "cart": [{"item": "apple", "quantity": 4}]}


def test_expected_state_is_preserved_as_given(extra_evaluators, records, cases) -> None:
    extra_evaluators(reader=good.AsyncContextReader)
    loaded = harness.config({"reader": 1.0})
    harness.score(loaded, "reader", cases["weather_paris"], records["weather_paris"])
    harness.score(loaded, "reader", cases["out_of_scope_flight"], records["out_of_scope_flight"])
    (_, omitted), (_, null) = good.CONTEXTS
    assert omitted.expected_final_session_state == {}  # omitted in the file: {}
    assert null.expected_final_session_state is None  # explicit null: no expectation


def test_seed_example_runs_unchanged_through_evalsnap_plugins(monkeypatch, records,
                                                              cases) -> None:
    """The seed's FinalStateMatchEvaluator, registered on import by a config-named module."""
    monkeypatch.setattr(DEFAULT_METRIC_EVALUATOR_REGISTRY, "_registry",
                        dict(DEFAULT_METRIC_EVALUATOR_REGISTRY._registry))
    module = "tests.metric_fixtures.seed_final_state"
    monkeypatch.delitem(sys.modules, module, raising=False)
    loaded = harness.config({"final_state_match": 1.0}, evalsnapPlugins=[module])
    rule = loaded.rules[0]
    assert rule.evaluator.name == f"{module}.FinalStateMatchEvaluator"
    assert rule.evaluator.kind == "custom_class" and not rule.evaluator.trusted  # no version
    for eval_id in ("cart_add_two_items", "weather_paris", "cart_state_mismatch",
                    "out_of_scope_flight"):
        unit = harness.score(loaded, "final_state_match", cases[eval_id], records[eval_id])
        assert unit.status == FINAL_STATE.get(eval_id, "PASSED"), eval_id
