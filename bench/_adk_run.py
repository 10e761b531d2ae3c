"""Baseline: ADK's own LocalEvalService (perform_inference + evaluate), one process."""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time
from pathlib import Path


async def main(agent_dir: str, evalset: str, config: str) -> dict:
    from google.adk.evaluation.base_eval_service import (
        EvaluateConfig,
        EvaluateRequest,
        InferenceConfig,
        InferenceRequest,
    )
    from google.adk.evaluation.eval_config import EvalConfig, get_eval_metrics_from_config
    from google.adk.evaluation.eval_set import EvalSet
    from google.adk.evaluation.in_memory_eval_sets_manager import InMemoryEvalSetsManager
    from google.adk.evaluation.local_eval_service import LocalEvalService
    from google.adk.evaluation.metric_evaluator_registry import (
        DEFAULT_METRIC_EVALUATOR_REGISTRY,
        register_custom_metrics_from_config,
    )

    sys.path.insert(0, str(Path(agent_dir).resolve().parent))
    import importlib

    # Importing the agent imports its package's offline models (`<agent>.offline_models`),
    # which registers the agent and judge models with ADK's LLMRegistry; ADK itself ignores
    # the config's evalsnapPlugins.
    agent_mod = importlib.import_module(Path(agent_dir).name)
    root_agent = agent_mod.agent.root_agent
    raw = json.loads(Path(config).read_text())
    raw.pop("evalsnapPlugins", None)
    for entry in (raw.get("customMetrics") or {}).values():
        entry.pop("version", None)
    raw["criteria"] = {k: v for k, v in raw["criteria"].items() if k != "final_state_match"}
    cfg = EvalConfig.model_validate(raw)
    registry = register_custom_metrics_from_config(cfg, DEFAULT_METRIC_EVALUATOR_REGISTRY.fork())
    metrics = [m for m in get_eval_metrics_from_config(cfg) if m.metric_name in cfg.criteria]
    eval_set = EvalSet.model_validate_json(Path(evalset).read_text())
    manager = InMemoryEvalSetsManager()
    manager.create_eval_set(Path(agent_dir).name, eval_set.eval_set_id)
    for case in eval_set.eval_cases:
        manager.add_eval_case(Path(agent_dir).name, eval_set.eval_set_id, case)
    service = LocalEvalService(root_agent=root_agent, eval_sets_manager=manager,
                               metric_evaluator_registry=registry)
    results = [r async for r in service.perform_inference(InferenceRequest(
        app_name=Path(agent_dir).name, eval_set_id=eval_set.eval_set_id,
        inference_config=InferenceConfig()))]
    cases = [r async for r in service.evaluate(EvaluateRequest(
        inference_results=results, evaluate_config=EvaluateConfig(eval_metrics=metrics)))]
    return {"cases": len(cases)}


if __name__ == "__main__":
    started = time.monotonic()
    out = asyncio.run(main(*sys.argv[1:4]))
    import importlib

    # the demo's models, under the name the agent package gave them (one set of counters)
    c = importlib.import_module(f"{Path(sys.argv[1]).name}.offline_models").counters()
    out.update(wall=time.monotonic() - started,
               rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
               calls=dict(c))
    print(json.dumps(out))
