"""The pipeline as plain function calls (no Prefect, no subprocess) for fast reuse tests.

``infer_all`` runs the example agent in-process through ``evalsnap.pipeline.stages.infer_case``;
``evaluate`` does freeze → score (every metric) → publish exactly as ``flows._common``
wires it, and reports the judge model calls the offline judge counted meanwhile.
"""

from __future__ import annotations

import asyncio
import copy
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.adk.evaluation.eval_set import EvalSet

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
SHOP = EXAMPLES / "shop_agent"
for _p in (str(ROOT), str(EXAMPLES)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from evalsnap.adk.config import resolve_config  # noqa: E402
from evalsnap.pipeline import (
    publish,
    stages,  # noqa: E402
)
from evalsnap.pipeline.outcomes import InferenceOutcome, UnitOutcome  # noqa: E402
from evalsnap.records import EvaluationRecord, ScoreUnit, Snapshot, repo  # noqa: E402
from examples import offline_models  # noqa: E402


def example_eval_set() -> EvalSet:
    return EvalSet.model_validate_json((SHOP / "shop.evalset.json").read_text("utf-8"))


def example_config() -> dict[str, Any]:
    return json.loads((SHOP / "test_config.json").read_text("utf-8"))


def infer_all(store_url: str, eval_set: EvalSet,
              run_id: str = "infer-run") -> list[InferenceOutcome]:
    async def go() -> list[InferenceOutcome]:
        return list(await asyncio.gather(*(
            stages.infer_case(store_url, str(SHOP), c.model_dump(mode="json"),
                              eval_set.eval_set_id, 0, run_id, reuse=True)
            for c in eval_set.eval_cases)))
    return asyncio.run(go())


@dataclass
class Result:
    record_oid: str
    record: EvaluationRecord
    snapshot_oid: str
    judge_calls: int
    units: dict[tuple[str, str], UnitOutcome]

    def why(self) -> dict[tuple[str, str], str]:
        return {(u.eval_id, u.metric_name): u.why for u in self.record.units}

    def scored(self) -> set[tuple[str, str]]:
        return {(u.eval_id, u.metric_name) for u in self.record.units if not u.reused}

    def snapshot(self) -> Snapshot:
        return repo.get_snapshot(repo.open_store(self.record_url), self.snapshot_oid)

    record_url: str = ""


def evaluate(store_url: str, eval_set: EvalSet, config: dict[str, Any],
             outcomes: list[InferenceOutcome], *, reuse: bool, force: bool = False,
             kind: str = "rescore", run_id: str | None = None) -> Result:
    """freeze → score every metric → publish; returns the record and judge calls made."""
    loaded = resolve_config(copy.deepcopy(config), where="<test config>")
    config_json = json.dumps(config, sort_keys=True)
    run_id = run_id or stages.new_run_id()
    before = offline_models.counters()["judge_calls"]
    cases = {c.eval_id for c in eval_set.eval_cases}
    outcomes = [o for o in outcomes if o.eval_id in cases]
    snapshot_oid = stages.freeze(store_url, eval_set, loaded.rules, outcomes, "shop_agent")

    async def score() -> list[UnitOutcome]:
        out: list[UnitOutcome] = []
        for rule in loaded.rules:
            out += await stages.score_metric(store_url, snapshot_oid, rule.metric_name,
                                             config_json, "<test config>", [str(EXAMPLES)],
                                             run_id, reuse, force, concurrency=32)
        return out

    units = asyncio.run(score())
    judge_calls = offline_models.counters()["judge_calls"] - before
    oid, record = publish.publish(store_url, run_id=run_id, kind=kind, snapshot_oid=snapshot_oid,
                                  inference=outcomes, units=units, reuse=reuse, force=force)
    return Result(oid, record, snapshot_oid, judge_calls,
                  {(u.eval_id, u.metric_name): u for u in units}, record_url=store_url)


def unit_of(store_url: str, record: EvaluationRecord, eval_id: str, metric: str) -> ScoreUnit:
    ref = next(u for u in record.units if (u.eval_id, u.metric_name) == (eval_id, metric))
    return repo.get(repo.open_store(store_url), ScoreUnit, ref.unit_oid)


def with_reference_text(eval_set: EvalSet, eval_id: str, text: str) -> EvalSet:
    """A copy of ``eval_set`` whose case ``eval_id`` expects ``text`` as its final answer."""
    data = eval_set.model_dump(mode="json")
    for case in data["eval_cases"]:
        if case["eval_id"] == eval_id:
            case["conversation"][-1]["final_response"]["parts"] = [{"text": text}]
    return EvalSet.model_validate(data)
