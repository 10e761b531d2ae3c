"""ADK's own ``LocalEvalService.evaluate`` on the inference evalsnap recorded: the parity
tests' one driver (each compares the results with what evalsnap published)."""

from __future__ import annotations

import asyncio
from typing import Any


def local_eval_service(app_name: str, eval_set: Any, shown_cases: list[dict[str, Any]],
                       metrics: list[Any], registry: Any = None) -> list[Any]:
    """ADK's ``EvalCaseResult`` for each successful case of ``evalsnap show --json``'s
    ``cases``, scored by ``LocalEvalService`` with ``metrics`` (and ``registry``, else ADK's
    default) on the invocations evalsnap recorded for it."""
    from google.adk.evaluation.base_eval_service import (
        EvaluateConfig,
        EvaluateRequest,
        InferenceResult,
        InferenceStatus,
    )
    from google.adk.evaluation.eval_case import Invocation
    from google.adk.evaluation.in_memory_eval_sets_manager import InMemoryEvalSetsManager
    from google.adk.evaluation.local_eval_service import LocalEvalService

    manager = InMemoryEvalSetsManager()
    manager.create_eval_set(app_name, eval_set.eval_set_id)
    for case in eval_set.eval_cases:
        manager.add_eval_case(app_name, eval_set.eval_set_id, case)
    results = [InferenceResult(
        app_name=app_name, eval_set_id=eval_set.eval_set_id, eval_case_id=c["eval_id"],
        inferences=[Invocation.model_validate(i) for i in c["inference"]["invocations"]],
        session_id="s", status=InferenceStatus.SUCCESS)
        for c in shown_cases if c["inference"]["status"] == "success"]
    extra = {"metric_evaluator_registry": registry} if registry is not None else {}
    service = LocalEvalService(root_agent=None, eval_sets_manager=manager,  # type: ignore[arg-type]
                               **extra)

    async def evaluate() -> list[Any]:
        request = EvaluateRequest(inference_results=results,
                                  evaluate_config=EvaluateConfig(eval_metrics=metrics))
        return [r async for r in service.evaluate(request)]

    return asyncio.run(evaluate())


def scores(case_results: list[Any]) -> dict[tuple[str, str], tuple[Any, str]]:
    """(eval_id, metric) → (score, status) of ADK's results."""
    return {(r.eval_id, m.metric_name): (m.score, m.eval_status.name)
            for r in case_results for m in r.overall_eval_metric_results}
