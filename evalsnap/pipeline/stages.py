"""The pipeline stages as plain functions: infer, freeze, score. No Prefect here."""

from __future__ import annotations

import asyncio
import functools
import logging
import secrets
import sys
import threading
from collections.abc import Callable
from typing import Any

from google.adk.evaluation.eval_case import EvalCase
from google.adk.evaluation.eval_set import EvalSet
from google.adk.version import __version__ as ADK_VERSION

from evalsnap.adk.agent import LoadedAgent, load_agent
from evalsnap.adk.config import LoadedConfig, resolve_config
from evalsnap.adk.inference import inference_fingerprint, now_iso, run_inference
from evalsnap.errors import ConfigError, EvalsnapError
from evalsnap.fingerprint import fingerprint
from evalsnap.pipeline import ledger as _ledger
from evalsnap.pipeline.judge import judge_limiter
from evalsnap.pipeline.outcomes import InferenceOutcome, UnitOutcome
from evalsnap.pipeline.unit import case_fingerprint, not_evaluated, score_unit, unit_fingerprint
from evalsnap.records import FrozenCase, InferenceRecord, MetricRule, ScoreUnit, Snapshot, repo

logger = logging.getLogger(__name__)


def new_run_id() -> str:
    stamp = now_iso().replace("-", "").replace(":", "").split(".")[0]
    return f"{stamp}Z-{secrets.token_hex(3)}"


@functools.lru_cache(maxsize=8)
def _agent(agent_dir: str) -> LoadedAgent:
    return load_agent(agent_dir)


_config_lock = threading.Lock()


def _config(config_json: str, where: str) -> LoadedConfig:
    # The metric tasks of a run start together: one resolution, which the others wait for.
    with _config_lock:
        return _resolved_config(config_json, where)


@functools.lru_cache(maxsize=8)
def _resolved_config(config_json: str, where: str) -> LoadedConfig:
    import json

    return resolve_config(json.loads(config_json), where=where)


def ensure_paths(paths: list[str]) -> None:
    """Makes custom metric modules importable in this (possibly remote) process."""
    for p in paths:
        if p not in sys.path:
            sys.path.insert(0, p)


# ---- inference -------------------------------------------------------------------------------

async def infer_case(store_url: str, agent_dir: str, case_data: dict[str, Any], eval_set_id: str,
                     repetition: int, run_id: str, reuse: bool, attempt: int = 1,
                     user_simulator_config: Any = None) -> InferenceOutcome:
    """Runs (or, with reuse, finds) one inference and stores it; returns its ids."""
    store = repo.open_store(store_url)
    agent = _agent(agent_dir)
    case = EvalCase.model_validate(case_data)
    fp = inference_fingerprint(agent.identity, case, repetition)
    if reuse:
        found = repo.find_inference(store, fp)
        if found is not None:
            oid, record = found
            return InferenceOutcome(eval_id=case.eval_id, repetition=repetition, oid=oid,
                                    fingerprint=fp, status="success", run_id=record.run_id)
    record = await run_inference(agent, case, eval_set_id=eval_set_id, repetition=repetition,
                                 run_id=run_id, attempt=attempt,
                                 user_simulator_config=user_simulator_config)
    oid = repo.put(store, record)
    repo.index_inference(store, record, oid)
    return InferenceOutcome(eval_id=case.eval_id, repetition=repetition, oid=oid, fingerprint=fp,
                            status=record.status, model_calls=record.model_calls, run_id=run_id,
                            error=record.error)


def inference_usable(store_url: str, oid: str) -> bool:
    """Whether a stored inference record exists and verifies (its hash and its schema)."""
    from storage import StorageError

    try:
        repo.get_inference(repo.open_store(store_url), oid)
    except (StorageError, EvalsnapError) as exc:
        logger.warning("inference %s unusable: %s", oid, exc)
        return False
    return True


def failed_inference(store_url: str, agent_dir: str, case_data: dict[str, Any], eval_set_id: str,
                     repetition: int, run_id: str, error: str, attempts: int) -> InferenceOutcome:
    """Records an inference whose task failed for good (e.g. retries exhausted)."""
    store = repo.open_store(store_url)
    agent = _agent(agent_dir)
    case = EvalCase.model_validate(case_data)
    fp = inference_fingerprint(agent.identity, case, repetition)
    record = InferenceRecord(
        inference_fingerprint=fp, eval_set_id=eval_set_id, eval_id=case.eval_id,
        repetition=repetition, app_name=agent.name, agent_name=agent.root_agent.name,
        adk_version=ADK_VERSION, status="failure", error=error, attempts=attempts,
        run_id=run_id, created_at=now_iso())
    oid = repo.put(store, record)
    return InferenceOutcome(eval_id=case.eval_id, repetition=repetition, oid=oid, fingerprint=fp,
                            status="failure", run_id=run_id, error=error)


# ---- freeze ----------------------------------------------------------------------------------

def freeze(store_url: str, eval_set: EvalSet, rules: list[MetricRule],
           outcomes: list[InferenceOutcome], app_name: str) -> str:
    """Writes the snapshot (write-once, content-addressed) and returns its id."""
    store = repo.open_store(store_url)
    by_key = {(o.eval_id, o.repetition): o for o in outcomes}
    cases = []
    for case in eval_set.eval_cases:
        reference = case.model_dump(mode="json", by_alias=False)
        for (eval_id, rep), outcome in sorted(by_key.items(), key=lambda kv: kv[0][1]):
            if eval_id != case.eval_id:
                continue
            record = repo.get_inference(store, outcome.oid)
            cases.append(FrozenCase(
                eval_id=eval_id, repetition=rep, inference_oid=outcome.oid,
                inference_fingerprint=record.inference_fingerprint, inference_ok=record.ok,
                reference=reference, case_fingerprint=case_fingerprint(record, reference)))
    snapshot = Snapshot(eval_set_id=eval_set.eval_set_id, eval_set_name=eval_set.name,
                        app_name=app_name, adk_version=ADK_VERSION, cases=cases, rules=rules,
                        created_at=now_iso())
    return repo.put(store, snapshot)


# ---- scoring ---------------------------------------------------------------------------------

def _reusable(store: Any, rule: MetricRule, frozen: FrozenCase, reuse: bool,
              force: bool) -> tuple[UnitOutcome | None, str]:
    """A prior complete unit to reuse, or why there is none."""
    if force:
        return None, "forced"
    if not reuse:
        return None, "reuse not requested"
    if not rule.evaluator.trusted:
        return None, "no trusted version"
    ufp = unit_fingerprint(frozen.case_fingerprint, rule.rule_fingerprint)
    entry = repo.unit_index_entry(store, ufp)
    if entry is None:
        return None, "new"
    if not entry.get("complete"):
        return None, "incomplete before"
    unit = repo.load_unit(store, entry["unit_oid"])
    if unit is None or not unit.complete or unit.unit_fingerprint != ufp:
        return None, "incomplete before" if unit is not None else "new"
    return UnitOutcome(
        eval_id=frozen.eval_id, repetition=frozen.repetition, metric_name=rule.metric_name,
        unit_oid=entry["unit_oid"], unit_fingerprint=ufp, case_fingerprint=frozen.case_fingerprint,
        rule_fingerprint=rule.rule_fingerprint, complete=True, status=unit.status,
        score=unit.score, run_id=unit.run_id, reused_from_record=entry.get("record_oid"),
        why="reused"), "reused"


def _outcome(unit: ScoreUnit, oid: str, why: str, reused_judge_samples: int = 0) -> UnitOutcome:
    return UnitOutcome(
        eval_id=unit.eval_id, repetition=unit.repetition, metric_name=unit.metric_name,
        unit_oid=oid, unit_fingerprint=unit.unit_fingerprint,
        case_fingerprint=unit.case_fingerprint, rule_fingerprint=unit.rule_fingerprint,
        complete=unit.complete, status=unit.status, score=unit.score,
        judge_calls=unit.judge_calls, reused_judge_samples=reused_judge_samples,
        run_id=unit.run_id, why=why)


def units_in_flight(rule: MetricRule, concurrency: int) -> int:
    """Units a metric task scores at once: ``concurrency``, or, for a judge metric, as many
    as the process's judge limit has slots. A judge unit asks its samples one after the
    other, so at ``concurrency`` units the last judge metric still running would use only
    ``concurrency`` of the limit's slots; the limit, not the unit count, bounds the calls."""
    if rule.judge:
        return max(concurrency, judge_limiter().slots)
    return concurrency


async def score_metric(store_url: str, snapshot_oid: str, metric_name: str,
                       config_json: str, config_where: str, sys_paths: list[str], run_id: str,
                       reuse: bool, force: bool, case_ids: list[str] | None = None,
                       concurrency: int = 8,
                       on_unit: Callable[[], None] | None = None) -> list[UnitOutcome]:
    """Scores one metric over every frozen case; reuses complete units when allowed."""
    ensure_paths(sys_paths)
    store = repo.open_store(store_url)
    snapshot = repo.get_snapshot(store, snapshot_oid)
    rule = snapshot.rule(metric_name)
    live = _config(config_json, config_where)
    live_rule = next((r for r in live.rules if r.metric_name == metric_name), None)
    if live_rule is None or live_rule.rule_fingerprint != rule.rule_fingerprint:
        raise ConfigError(
            f"metric {metric_name!r} in snapshot {snapshot_oid} differs from the live config "
            f"{config_where}; evaluators come only from the live config, so freeze again.")
    eval_metric = live.eval_metric(rule)
    limiter = asyncio.Semaphore(units_in_flight(rule, concurrency))

    async def one(frozen: FrozenCase) -> UnitOutcome:
        reused, why = _reusable(store, rule, frozen, reuse, force)
        if reused is not None:
            return reused
        async with limiter:
            # parsed for this unit alone: the evaluator may have it, no copy needed
            inference = repo.get_inference(store, frozen.inference_oid)
            unit, recorder = await score_unit(rule, eval_metric, frozen, inference,
                                              live.registry, run_id=run_id,
                                              judge_source=judge_source,
                                              inference_is_private=True)
        reused_samples = 0
        if recorder is not None:
            # every judge call, live or answered from the ledger, becomes a ledger entry
            ledger = _ledger.write_entries(store, _ledger.entries_for(recorder, rule, frozen,
                                                                      run_id))
            unit = unit.model_copy(update={"ledger": ledger})
            reused_samples = recorder.reused_samples
        oid = repo.put(store, unit)
        if on_unit is not None:
            on_unit()
        return _outcome(unit, oid, why, reused_samples)

    # --reuse also answers judge requests from the ledger (same request key and sample)
    judge_source = _ledger.reuse_source(store) if reuse and not force else None
    cases = [c for c in snapshot.cases if case_ids is None or c.eval_id in case_ids]
    return list(await asyncio.gather(*(one(c) for c in cases)))


def incomplete_unit_for_failed_task(rule: MetricRule, frozen: FrozenCase, run_id: str,
                                    error: str) -> ScoreUnit:
    return not_evaluated(rule, frozen, run_id, f"scoring task failed: {error}")


def config_fingerprint(config_json: str) -> str:
    return fingerprint("config", config_json)
