"""In-process helpers: infer shop cases and score one metric on one case, no Prefect."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from google.adk.evaluation.eval_case import EvalCase
from google.adk.evaluation.eval_set import EvalSet

from evalsnap.adk.config import LoadedConfig, resolve_config
from evalsnap.adk.inference import CapturingSessionService
from evalsnap.agents.base import LoadedAgent, ensure_importable
from evalsnap.agents.lanes import load_agent, run_inference
from evalsnap.fingerprint import case_fingerprint
from evalsnap.pipeline.unit import score_unit
from evalsnap.records import FrozenCase, InferenceRecord, ScoreUnit

ROOT = Path(__file__).resolve().parents[2]
SHOP = ROOT / "examples" / "shop_agent"
FAKE_OID = "sha256:" + "0" * 64


def shop_agent() -> LoadedAgent:
    ensure_importable(SHOP)
    return load_agent(str(SHOP))


def shop_cases() -> dict[str, EvalCase]:
    eval_set = EvalSet.model_validate_json((SHOP / "shop.evalset.json").read_text("utf-8"))
    return {c.eval_id: c for c in eval_set.eval_cases}


def infer(agent: LoadedAgent, case: EvalCase,
          sessions: CapturingSessionService | None = None) -> InferenceRecord:
    return asyncio.run(run_inference(agent, case, eval_set_id="shop", session_service=sessions))


def config(criteria: dict[str, Any], custom: dict[str, str] | None = None,
           **extra: Any) -> LoadedConfig:
    """A resolved config; ``custom`` maps metric names to function import paths."""
    raw: dict[str, Any] = {"criteria": criteria, **extra}
    if custom:
        raw["customMetrics"] = {n: {"codeConfig": {"name": p}} for n, p in custom.items()}
    return resolve_config(raw, where="<test config>")


def frozen(case: EvalCase, record: InferenceRecord) -> FrozenCase:
    reference = case.model_dump(mode="json", by_alias=False)  # as evalsnap.pipeline.stages.freeze does
    return FrozenCase(eval_id=case.eval_id, inference_oid=FAKE_OID,
                      inference_fingerprint=record.inference_fingerprint,
                      inference_ok=record.ok, reference=reference,
                      case_fingerprint=case_fingerprint(record, reference))


def score(loaded: LoadedConfig, name: str, case: EvalCase, record: InferenceRecord,
          registry: Any = None) -> ScoreUnit:
    rule = next(r for r in loaded.rules if r.metric_name == name)
    unit, _ = asyncio.run(score_unit(rule, loaded.eval_metric(rule), frozen(case, record),
                                     record, registry or loaded.registry))
    return unit
