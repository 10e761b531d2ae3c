"""The offline demo runs the full ADK eval path: scripted agent, tools, state, judge.

Everything here goes through ADK's own ``LocalEvalService`` and evaluators, so a change in
ADK's prompts, parsers or aggregation that breaks the offline models fails these tests.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from google.adk.evaluation.base_eval_service import (
    EvaluateConfig,
    EvaluateRequest,
    InferenceConfig,
    InferenceRequest,
    InferenceResult,
    InferenceStatus,
)
from google.adk.evaluation.eval_case import Invocation, get_all_tool_calls
from google.adk.evaluation.eval_config import EvalConfig, get_eval_metrics_from_config
from google.adk.evaluation.eval_metrics import (
    EvalMetric,
    EvalStatus,
    HallucinationsCriterion,
    JudgeModelOptions,
    LlmAsAJudgeCriterion,
    RubricsBasedCriterion,
)
from google.adk.evaluation.eval_result import EvalCaseResult
from google.adk.evaluation.eval_rubrics import Rubric, RubricContent
from google.adk.evaluation.eval_set import EvalSet
from google.adk.evaluation.final_response_match_v2 import FinalResponseMatchV2Evaluator as V2
from google.adk.evaluation.hallucinations_v1 import HallucinationsV1Evaluator as Halluc
from google.adk.evaluation.in_memory_eval_sets_manager import InMemoryEvalSetsManager
from google.adk.evaluation.local_eval_service import LocalEvalService
from google.adk.evaluation.metric_evaluator_registry import (
    DEFAULT_METRIC_EVALUATOR_REGISTRY,
    register_custom_metrics_from_config,
)
from google.adk.evaluation.rubric_based_final_response_quality_v1 import (
    RubricBasedFinalResponseQualityV1Evaluator as RubricFinal,
)
from google.adk.evaluation.rubric_based_tool_use_quality_v1 import (
    RubricBasedToolUseV1Evaluator as RubricToolUse,
)
from google.adk.models.llm_request import LlmRequest
from google.adk.models.registry import LLMRegistry
from google.genai import types

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
# examples/ plays the role of the agent dir's parent, which is how `shop_agent.metrics` (the
# codeConfig path) and `shop_agent.offline_models` (the config's evalsnapPlugins) resolve.
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))

import shop_agent  # noqa: E402  (needs the sys.path entry above)
from shop_agent import offline_models  # noqa: E402

AGENT_DIR = EXAMPLES / "shop_agent"
APP = "shop_agent"
GATED = (
    "tool_trajectory_avg_score",
    "response_match_score",
    "final_response_match_v2",
    "rubric_based_final_response_quality_v1",
    "hallucinations_v1",
    "response_mentions_city",
)
# evalsnap's own metrics: ADK 2.13.0's LocalEvalService cannot run them (it never calls
# evaluate_with_context), so the ADK run below leaves them out; tests/test_state.py scores
# them through evalsnap.
EVALSNAP_ONLY = ("final_state_match",)
# The cases built to fail, and the metrics they fail; every other (case, metric) passes.
DESIGNED_FAILURES = {
    "weather_paris_stale_reference": {"response_match_score", "final_response_match_v2"},
    "cart_add_wrong_trajectory": {"tool_trajectory_avg_score"},
    "out_of_scope_flight": {"response_mentions_city"},
    "cart_state_mismatch": {"final_state_match"},
}
NUM_SAMPLES = 3  # judgeModelOptions.numSamples of final_response_match_v2 in test_config.json
RUBRIC_SAMPLES = 1  # ... of rubric_based_final_response_quality_v1
HALLUCINATION_CALLS = 2  # hallucinations_v1: one segmenter + one validator call per invocation


def _clear_demo_env(mp: pytest.MonkeyPatch) -> None:
    """Start from the models' defaults whatever the calling shell exported."""
    for key in [k for k in os.environ if k.startswith("EVALSNAP_DEMO_")]:
        mp.delenv(key)


def _eval_set() -> EvalSet:
    return EvalSet.model_validate_json((AGENT_DIR / "shop.evalset.json").read_text("utf-8"))


def _config() -> EvalConfig:
    return EvalConfig.model_validate_json((AGENT_DIR / "test_config.json").read_text("utf-8"))


def _service(eval_set: EvalSet, config: EvalConfig) -> LocalEvalService:
    manager = InMemoryEvalSetsManager()
    manager.create_eval_set(APP, eval_set.eval_set_id)
    for case in eval_set.eval_cases:
        manager.add_eval_case(APP, eval_set.eval_set_id, case)
    # A fork, so the custom metric does not leak into ADK's process-wide registry.
    registry = register_custom_metrics_from_config(config, DEFAULT_METRIC_EVALUATOR_REGISTRY.fork())
    return LocalEvalService(
        root_agent=shop_agent.agent.root_agent,
        eval_sets_manager=manager,
        metric_evaluator_registry=registry,
    )


async def _infer(service: LocalEvalService, eval_set_id: str) -> list[InferenceResult]:
    request = InferenceRequest(
        app_name=APP, eval_set_id=eval_set_id, inference_config=InferenceConfig()
    )
    return [r async for r in service.perform_inference(request)]


@dataclass
class ShopRun:
    eval_set: EvalSet
    inferences: dict[str, InferenceResult]
    results: dict[str, EvalCaseResult]
    after_inference: Counter[str]
    after_eval: Counter[str]


@pytest.fixture(scope="module")
def shop_run() -> ShopRun:
    """One real run of the whole eval set; the tests below only read it."""
    with pytest.MonkeyPatch.context() as mp:
        _clear_demo_env(mp)
        eval_set, config = _eval_set(), _config()
        service = _service(eval_set, config)
        offline_models.reset_counters()

        async def run() -> tuple[list[InferenceResult], Counter[str], list[EvalCaseResult]]:
            inferences = await _infer(service, eval_set.eval_set_id)
            after_inference = offline_models.counters()
            metrics = [
                m for m in get_eval_metrics_from_config(config)
                if m.metric_name not in EVALSNAP_ONLY
            ]
            request = EvaluateRequest(
                inference_results=inferences, evaluate_config=EvaluateConfig(eval_metrics=metrics)
            )
            return inferences, after_inference, [r async for r in service.evaluate(request)]

        inferences, after_inference, results = asyncio.run(run())
        return ShopRun(
            eval_set=eval_set,
            inferences={r.eval_case_id: r for r in inferences},
            results={r.eval_id: r for r in results},
            after_inference=after_inference,
            after_eval=offline_models.counters(),
        )


def _metric(result: EvalCaseResult, name: str) -> Any:
    return next(m for m in result.overall_eval_metric_results if m.metric_name == name)


def test_eval_set_and_config_are_valid_adk_files() -> None:
    eval_set, config = _eval_set(), _config()
    ids = [c.eval_id for c in eval_set.eval_cases]
    assert len(ids) >= 10 and len(set(ids)) == len(ids)
    assert {len(c.conversation or []) for c in eval_set.eval_cases} >= {1, 2}
    assert any(c.session_input for c in eval_set.eval_cases)
    assert any(c.session_input is None for c in eval_set.eval_cases)
    assert set(DESIGNED_FAILURES) <= set(ids)
    names = [m.metric_name for m in get_eval_metrics_from_config(config)]
    assert set(GATED) | set(EVALSNAP_ONLY) <= set(names)
    raw = json.loads((AGENT_DIR / "test_config.json").read_text("utf-8"))
    custom = raw["customMetrics"]["response_mentions_city"]
    assert custom["codeConfig"]["name"] == "shop_agent.metrics.response_mentions_city"
    assert custom["version"] == "1"  # evalsnap's key; ADK ignores it
    # The demo registers its own models (evalsnap's key; ADK ignores it too).
    assert raw["evalsnapPlugins"] == ["shop_agent.offline_models"]


def test_every_case_infers(shop_run: ShopRun) -> None:
    assert set(shop_run.inferences) == {c.eval_id for c in shop_run.eval_set.eval_cases}
    for case in shop_run.eval_set.eval_cases:
        inference = shop_run.inferences[case.eval_id]
        assert inference.status == InferenceStatus.SUCCESS, inference.error_message
        assert len(inference.inferences or []) == len(case.conversation or [])


def test_scripted_trajectories_follow_the_table(shop_run: ShopRun) -> None:
    for case in shop_run.eval_set.eval_cases:
        actual = shop_run.inferences[case.eval_id].inferences or []
        for got, want in zip(actual, case.conversation or [], strict=True):
            calls = [(c.name, c.args) for c in get_all_tool_calls(got.intermediate_data)]
            expected = [(c.name, c.args) for c in get_all_tool_calls(want.intermediate_data)]
            if case.eval_id == "cart_add_wrong_trajectory":
                assert calls == [("add_to_cart", {"item": "apple", "quantity": 2})]
            else:
                assert calls == expected, case.eval_id


def test_judge_answers_parse_and_every_invocation_is_scored(shop_run: ShopRun) -> None:
    # NOT_EVALUATED here would mean the judge's answer did not parse.
    for eval_id, result in shop_run.results.items():
        assert _metric(result, "final_response_match_v2").score is not None, eval_id
        for row in result.eval_metric_result_per_invocation:
            scores = {m.metric_name: m.score for m in row.eval_metric_results}
            assert all(scores[name] is not None for name in GATED), eval_id
            assert scores["final_response_match_v2"] in (0.0, 1.0), eval_id


def test_designed_failures_fail_and_everything_else_passes(shop_run: ShopRun) -> None:
    for eval_id, result in shop_run.results.items():
        failing = DESIGNED_FAILURES.get(eval_id, set()) & set(GATED)
        for name in GATED:
            want = EvalStatus.FAILED if name in failing else EvalStatus.PASSED
            assert _metric(result, name).eval_status == want, (eval_id, name)
        want_final = EvalStatus.FAILED if failing else EvalStatus.PASSED
        assert result.final_eval_status == want_final, eval_id


def test_tools_write_the_expected_session_state(shop_run: ShopRun) -> None:
    cart = shop_run.results["cart_add_two_items"].session_details
    assert cart is not None
    assert cart.state["cart"] == [
        {"item": "apple", "quantity": 2},
        {"item": "banana", "quantity": 1},
    ]
    for case in shop_run.eval_set.eval_cases:
        if case.session_input is None or not case.final_session_state:
            continue
        if "final_state_match" in DESIGNED_FAILURES.get(case.eval_id, set()):
            continue  # the reference is wrong on purpose
        session = shop_run.results[case.eval_id].session_details
        assert session is not None, case.eval_id
        for key, value in case.final_session_state.items():
            assert session.state.get(key) == value, (case.eval_id, key)


def test_call_counters_match_turns_tool_calls_and_samples(shop_run: ShopRun) -> None:
    invocations = [i for r in shop_run.inferences.values() for i in (r.inferences or [])]
    tool_calls = sum(len(get_all_tool_calls(i.intermediate_data)) for i in invocations)
    # One agent call per tool call plus one for each turn's answer; the judge runs only
    # while scoring: per invocation, numSamples times for final_response_match_v2 (3) and
    # the rubric metric (1), and twice for hallucinations_v1 (segmenter + validator).
    n = len(invocations)
    assert shop_run.after_inference["agent_calls"] == n + tool_calls == 30
    assert shop_run.after_inference["judge_calls"] == 0
    assert shop_run.after_eval["agent_calls"] == shop_run.after_inference["agent_calls"]
    per_invocation = NUM_SAMPLES + RUBRIC_SAMPLES + HALLUCINATION_CALLS
    assert shop_run.after_eval["judge_calls"] == n * per_invocation == 90
    assert shop_run.after_eval["judge_calls.final_response_match_v2"] == n * NUM_SAMPLES == 45
    assert shop_run.after_eval["judge_calls.rubric_based_final_response_quality_v1"] == n
    assert shop_run.after_eval["judge_calls.hallucinations_v1_segmenter"] == n
    assert shop_run.after_eval["judge_calls.hallucinations_v1_validator"] == n
    assert shop_run.after_eval["agent_errors"] == shop_run.after_eval["judge_garbled"] == 0


def _paris(shop_run: ShopRun) -> Invocation:
    (invocation,) = shop_run.inferences["weather_paris"].inferences or []
    assert invocation.app_details is not None  # the judge prompts need tool declarations
    return invocation


def _options() -> JudgeModelOptions:
    return JudgeModelOptions(judge_model=offline_models.JUDGE_MODEL, num_samples=NUM_SAMPLES)


def _rubric_metric(name: str, rubrics: dict[str, str]) -> EvalMetric:
    return EvalMetric(
        metric_name=name,
        criterion=RubricsBasedCriterion(
            threshold=0.5,
            judge_model_options=_options(),
            rubrics=[
                Rubric(rubric_id=rid, rubric_content=RubricContent(text_property=text))
                for rid, text in rubrics.items()
            ],
        ),
    )


def _evaluate(evaluator: Any, invocation: Invocation) -> Any:
    return asyncio.run(evaluator.evaluate_invocations([invocation], None))


def test_judge_answers_rubric_prompts(shop_run: ShopRun) -> None:
    invocation = _paris(shop_run)
    offline_models.reset_counters()
    rubrics = {"city": "Names the city 'Paris'.", "rain": "Says it is 'rainy'."}
    final = RubricFinal(_rubric_metric("rubric_based_final_response_quality_v1", rubrics))
    result = _evaluate(final, invocation)
    assert {s.rubric_id: s.score for s in result.overall_rubric_scores} == {"city": 1, "rain": 0}
    assert result.overall_score == 0.5 and result.overall_eval_status == EvalStatus.PASSED
    rubrics = {"weather": "Calls 'get_weather' with \"Paris\".", "cart": "Calls 'add_to_cart'."}
    tool_use = RubricToolUse(_rubric_metric("rubric_based_tool_use_quality_v1", rubrics))
    result = _evaluate(tool_use, invocation)
    assert {s.rubric_id: s.score for s in result.overall_rubric_scores} == {"weather": 1, "cart": 0}
    counts = offline_models.counters()
    assert counts["judge_calls.rubric_based_final_response_quality_v1"] == NUM_SAMPLES
    assert counts["judge_calls.rubric_based_tool_use_quality_v1"] == NUM_SAMPLES


def _hallucinations() -> Halluc:
    metric = EvalMetric(
        metric_name="hallucinations_v1",
        criterion=HallucinationsCriterion(threshold=0.8, judge_model_options=_options()),
    )
    return Halluc(metric)


def test_judge_answers_hallucination_prompts(shop_run: ShopRun) -> None:
    invocation = _paris(shop_run)
    offline_models.reset_counters()
    grounded = _evaluate(_hallucinations(), invocation)
    assert grounded.overall_score == 1.0
    # Same turn, but the answer invents a temperature the tool never returned.
    invented = invocation.model_copy(
        update={
            "final_response": types.Content(
                role="model",
                parts=[types.Part(text="It is sunny and 35°C in Paris. Thanks for asking!")],
            )
        }
    )
    result = _evaluate(_hallucinations(), invented)
    assert result.overall_score == 0.5  # one unsupported sentence, one not applicable
    counts = offline_models.counters()
    # No sampling here: one segmenter and one validator call per evaluated response.
    assert counts["judge_calls.hallucinations_v1_segmenter"] == 2
    assert counts["judge_calls.hallucinations_v1_validator"] == 2


def test_garbled_judge_leaves_every_judge_metric_unevaluated(
    shop_run: ShopRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    invocation = _paris(shop_run)
    (case,) = [c for c in shop_run.eval_set.eval_cases if c.eval_id == "weather_paris"]
    monkeypatch.setenv("EVALSNAP_DEMO_JUDGE_GARBLE", "1")
    offline_models.reset_counters()
    v2 = V2(
        EvalMetric(
            metric_name="final_response_match_v2",
            criterion=LlmAsAJudgeCriterion(threshold=0.5, judge_model_options=_options()),
        )
    )
    result = asyncio.run(v2.evaluate_invocations([invocation], case.conversation))
    assert result.overall_eval_status == EvalStatus.NOT_EVALUATED
    rubric = RubricFinal(
        _rubric_metric("rubric_based_final_response_quality_v1", {"r": "Says 'Paris'."})
    )
    assert _evaluate(rubric, invocation).overall_score is None
    assert _evaluate(_hallucinations(), invocation).overall_score is None
    assert offline_models.counters()["judge_garbled"] == 2 * NUM_SAMPLES + 1


def _one_case_set(eval_id: str, text: str) -> EvalSet:
    data = _eval_set().model_dump(mode="json")
    case = next(c for c in data["eval_cases"] if c["eval_id"] == "weather_paris")
    case["eval_id"] = eval_id
    case["conversation"][0]["user_content"]["parts"][0]["text"] = text
    return EvalSet.model_validate({"eval_set_id": eval_id, "eval_cases": [case]})


def test_fail_model_keyword_fails_the_inference(monkeypatch: pytest.MonkeyPatch) -> None:
    _clear_demo_env(monkeypatch)
    eval_set = _one_case_set("boom", "What's the weather in Paris? FAIL_MODEL")
    offline_models.reset_counters()
    (result,) = asyncio.run(_infer(_service(eval_set, _config()), "boom"))
    assert result.status == InferenceStatus.FAILURE
    assert "FAIL_MODEL" in (result.error_message or "")
    assert offline_models.counters()["agent_errors"] == 1


def test_transient_failures_hit_only_the_first_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    _clear_demo_env(monkeypatch)
    monkeypatch.setenv("EVALSNAP_DEMO_AGENT_FAIL_FIRST", "1")
    eval_set = _one_case_set("flaky", "What's the weather in Paris?")
    service = _service(eval_set, _config())
    offline_models.reset_counters()
    (first,) = asyncio.run(_infer(service, "flaky"))
    (second,) = asyncio.run(_infer(service, "flaky"))  # what a retry would do
    assert first.status == InferenceStatus.FAILURE
    assert "transient" in (first.error_message or "")
    assert second.status == InferenceStatus.SUCCESS
    assert offline_models.counters()["agent_transient_errors"] == 1


async def _ask(llm: Any, text: str) -> tuple[float, str]:
    """(seconds taken, answer text) for one direct model call."""
    request = LlmRequest(contents=[types.Content(role="user", parts=[types.Part(text=text)])])
    start = time.monotonic()
    (response,) = [r async for r in llm.generate_content_async(request)]
    return time.monotonic() - start, response.content.parts[0].text or ""


def test_simulated_latency(monkeypatch: pytest.MonkeyPatch) -> None:
    _clear_demo_env(monkeypatch)
    monkeypatch.setenv("EVALSNAP_DEMO_LATENCY_MS", "400")
    monkeypatch.setenv("EVALSNAP_DEMO_JUDGE_LATENCY_MS", "0")  # the specific one wins
    assert asyncio.run(_ask(offline_models.ScriptedAgentLlm(), "hi"))[0] >= 0.4
    assert asyncio.run(_ask(offline_models.OfflineJudgeLlm(), "hi"))[0] < 0.3


def test_register_is_idempotent_and_unknown_prompts_do_not_parse() -> None:
    offline_models.register()
    offline_models.register()
    assert LLMRegistry.resolve("offline-agent-v1") is offline_models.ScriptedAgentLlm
    assert LLMRegistry.resolve("offline-judge-v7") is offline_models.OfflineJudgeLlm
    offline_models.reset_counters()
    _, text = asyncio.run(_ask(offline_models.OfflineJudgeLlm(), "Rate this, please."))
    assert "Verdict" not in text and "is_the_agent_response_valid" not in text
    assert offline_models.counters()["judge_calls.unrecognised"] == 1


# What a production process gets from installing evalsnap: no demo package, no demo model.
_OUTSIDE_PROBE = """
import importlib.util, json, sys
from importlib.metadata import entry_points
from pathlib import Path
from evalsnap.agents.base import ensure_importable
from evalsnap.adk.config import load_config, resolve_config
from evalsnap.errors import ConfigError
from google.adk.models.registry import LLMRegistry

out = {"examples": importlib.util.find_spec("examples") is not None,
       "bench": importlib.util.find_spec("bench") is not None,
       "entry_points": sorted(ep.value for ep in entry_points(group="evalsnap.plugins"))}
judge_only = {"criteria": {"final_response_match_v2": {"threshold": 0.5, "judgeModelOptions": {
    "judgeModel": "offline-judge-v1", "numSamples": 1}}}}
try:
    resolve_config(judge_only, where="<rules of the snapshot>")
    out["unregistered"] = None
except ConfigError as exc:
    out["unregistered"] = str(exc)
copy = Path(sys.argv[1])
ensure_importable(copy)  # as `evalsnap run` does: the agent's parent on sys.path
load_config(copy / "test_config.json")
judge = LLMRegistry.resolve("offline-judge-v1")
out["judge"] = judge.__module__ + "." + judge.__qualname__
out["judge_file"] = sys.modules[judge.__module__].__file__
out["agent_model"] = LLMRegistry.resolve("offline-agent-v1").__module__
print(json.dumps(out))
"""


def test_installed_evalsnap_has_no_demo_and_the_demo_config_registers_its_models(
        shop_copy: Path, tmp_path: Path) -> None:
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", _OUTSIDE_PROBE, str(shop_copy)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["examples"] is False and out["bench"] is False
    assert out["entry_points"] == ["evalsnap.metrics:register"]
    message = out["unregistered"]
    assert message and "'offline-judge-v1' is not registered" in message
    assert "evalsnapPlugins" in message and "--config" in message
    # The copy's own models, under the one canonical name the config gives them.
    assert out["judge"] == "shop_agent.offline_models.OfflineJudgeLlm"
    assert out["agent_model"] == "shop_agent.offline_models"
    assert Path(out["judge_file"]).resolve().parent == shop_copy.resolve()
