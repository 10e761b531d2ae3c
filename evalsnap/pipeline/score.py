"""Score: one metric over every frozen case of a snapshot (one request per metric).

Each case × metric is a *score unit*, reused when :mod:`evalsnap.pipeline.reuse` allows and
otherwise scored on copies of the frozen inputs (:mod:`evalsnap.pipeline.unit`), with
every judge call recorded in the ledger. Evaluators come only from the live config.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from evalsnap import startup
from evalsnap.adk.config import LoadedConfig, resolve_config
from evalsnap.deadlines import metric_timeout
from evalsnap.errors import ConfigError
from evalsnap.pipeline import efficiency, ledger, reuse
from evalsnap.pipeline.outcomes import UnitOutcome
from evalsnap.pipeline.unit import not_evaluated, score_unit
from evalsnap.records import (
    FrozenCase,
    LedgerEntry,
    MetricRule,
    ScoreUnit,
    Snapshot,
    pack,
    repo,
    segments,
)
from evalsnap.rows import Rows
from storage import Store

if TYPE_CHECKING:
    from evalsnap.pipeline.context import RunContext
    from evalsnap.settings import Settings

logger = logging.getLogger(__name__)


class ScoreRequest(BaseModel):
    """What one metric's scoring task is asked to do."""

    model_config = ConfigDict(frozen=True)

    store_url: str
    snapshot_oid: str
    metric_name: str
    units_digest: str
    """Digest of the unit keys in order (:func:`evalsnap.pipeline.reuse.units_digest`)."""
    trusted: bool
    """Whether the metric's evaluator is trusted for reuse (from the snapshot's rule)."""
    judge: bool = False
    """Whether the metric asks a judge model (it then waits on the model more than it
    computes)."""
    config_json: str
    config_where: str
    sys_paths: list[str]
    agent_dir: str | None = None
    """The agent package, imported before the config is resolved (what it registers —
    models, evaluators — is there for the metrics, in whatever process scores)."""
    agent_name: str | None = None
    run_id: str
    reuse: bool
    force: bool
    case_ids: list[str] | None = None
    concurrency: int = 8


_config_lock = threading.Lock()


def live_config(config_json: str, where: str) -> LoadedConfig:
    """The resolved config, once per process (a run's metric tasks start together)."""
    with _config_lock:
        return _resolved_config(config_json, where)


@functools.lru_cache(maxsize=8)
def _resolved_config(config_json: str, where: str) -> LoadedConfig:
    return resolve_config(json.loads(config_json), where=where)


def ensure_paths(paths: list[str]) -> None:
    """Makes custom metric modules importable in this (possibly remote) process."""
    for p in paths:
        if p not in sys.path:
            sys.path.insert(0, p)


def units_in_flight(rule: MetricRule, concurrency: int, s: Settings) -> int:
    """Units a metric task scores at once: ``concurrency``, or, for a judge metric, as many
    as the process's judge limit has slots. A judge unit asks its samples one after the
    other, so at ``concurrency`` units the last judge metric still running would use only
    ``concurrency`` of the limit's slots; the limit, not the unit count, bounds the calls."""
    if rule.judge:
        return max(concurrency, s.judge_concurrency)
    return concurrency


def _outcome(unit: ScoreUnit, oid: str, why: str, reused_judge_samples: int = 0,
             entries: list[LedgerEntry] | None = None) -> UnitOutcome:
    judge_tokens, unreported = efficiency.judge_tokens_by_model(entries or [])
    return UnitOutcome(
        eval_id=unit.eval_id, repetition=unit.repetition, metric_name=unit.metric_name,
        unit_oid=oid, unit_fingerprint=unit.unit_fingerprint,
        case_fingerprint=unit.case_fingerprint, rule_fingerprint=unit.rule_fingerprint,
        complete=unit.complete, status=unit.status, score=unit.score,
        judge_calls=unit.judge_calls, reused_judge_samples=reused_judge_samples,
        judge_tokens=judge_tokens, judge_unreported=unreported, run_id=unit.run_id, why=why)


def import_agent(agent_dir: str | None, agent_name: str | None = None) -> None:
    """Imports the agent package in this process, once (see :func:`pipeline.infer.agent_at`)."""
    if agent_dir is not None:
        from evalsnap.pipeline.infer import agent_at

        agent_at(agent_dir, agent_name)


async def score_metric_async(req: ScoreRequest, ctx: RunContext,
                             on_unit: Callable[[], None] | None = None) -> Rows[UnitOutcome]:
    ensure_paths(req.sys_paths)
    import_agent(req.agent_dir, req.agent_name)
    store = ctx.store
    snapshot = repo.get_snapshot(store, req.snapshot_oid)
    frozen_inferences(store, req.snapshot_oid, snapshot, req.case_ids)
    rule = snapshot.rule(req.metric_name)
    live = live_config(req.config_json, req.config_where)
    live_rule = next((r for r in live.rules if r.metric_name == req.metric_name), None)
    if live_rule is None or live_rule.rule_fingerprint != rule.rule_fingerprint:
        raise ConfigError(
            f"metric {req.metric_name!r} in snapshot {req.snapshot_oid} differs from the live "
            f"config {req.config_where}; evaluators come only from the live config, so freeze "
            "again.")
    eval_metric = live.eval_metric(rule)
    gate = asyncio.Semaphore(units_in_flight(rule, req.concurrency, ctx.settings))
    judge_source = reuse.judge_answers(store, reuse=req.reuse, force=req.force)
    # what other tasks indexed since this process first looked (one listing, if it did)
    segments.refresh(store, only_if_listed=True)

    async def one(frozen: FrozenCase) -> UnitOutcome:
        outcome = await unit_of(frozen)
        if on_unit is not None:
            on_unit()
        return outcome

    async def unit_of(frozen: FrozenCase) -> UnitOutcome:
        reused, why = reuse.reusable_unit(store, rule, frozen, reuse=req.reuse, force=req.force)
        if reused is not None:
            return reused
        async with gate:
            # parsed for this unit alone: the evaluator may have it, no copy needed
            inference = repo.get_inference(store, frozen.inference_oid)
            unit, recorder = await score_unit(rule, eval_metric, frozen, inference,
                                              live.registry, run_id=req.run_id,
                                              judge_source=judge_source,
                                              limiter=ctx.limiter,
                                              inference_is_private=True,
                                              timeout=metric_timeout(live.timeouts,
                                                                     rule.metric_name,
                                                                     ctx.settings))
        reused_samples = 0
        entries: list[LedgerEntry] = []
        if recorder is not None:
            # every judge call, live or answered from the ledger, becomes a ledger entry
            entries = ledger.entries_for(recorder, rule, frozen, req.run_id)
            unit = unit.model_copy(update={"ledger": ledger.write_entries(writes, entries)})
            reused_samples = recorder.reused_samples
        return _outcome(unit, writes.put(unit), why, reused_samples, entries)

    wanted = set(req.case_ids) if req.case_ids is not None else None
    # the frozen cases read a chunk at a time from the snapshot's rows, and the outcomes kept
    # as their JSON (past a few MB in a temporary file): a metric's task holds a chunk of
    # each as models, not every case's
    outcomes = Rows(UnitOutcome)
    for cases in _chunks(c for c in snapshot.cases if wanted is None or c.eval_id in wanted):
        writes = repo.WriteBatch(store, req.run_id)  # scored and written as packs a chunk at a time
        chunk = list(await asyncio.gather(*(one(c) for c in cases)))
        holders = writes.flush()  # the chunk's new units and entries as packs, then the index
        startup.give_back_now_and_then()  # the chunks before, scored, written and let go
        outcomes.extend(o.model_copy(update={"packs": holders[o.unit_oid]})
                        if o.run_id == req.run_id and o.unit_oid in holders else o for o in chunk)
    pack.repair(store)  # a damaged pack whose members this task did again
    return outcomes


def _chunks(cases: Iterable[FrozenCase]) -> Iterator[list[FrozenCase]]:
    chunk: list[FrozenCase] = []
    for case in cases:
        chunk.append(case)
        if len(chunk) == CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


#: Units of one metric scored and written (as packs) at a time: what a metric task holds (its
#: units' and judge entries' bytes, as objects and as packs: ~50 MB a judge metric at 2,000,
#: several metric tasks at once in one process; measured with memray at 2,000 cases). A run
#: killed while scoring keeps the chunks written before.
CHUNK = 500
_PRIMED = "score.inference packs read"
_PRIMED_LOCK = threading.Lock()


def frozen_inferences(store: Store, snapshot_oid: str, snapshot: Snapshot,
                      case_ids: list[str] | None) -> None:
    """The inference records the snapshot's cases name, from its packs (a few reads) when
    this process does not hold them yet (a scoring process; the flow's own process read or
    wrote them): once per process and snapshot. The packs are this run's, written by freeze
    from records it had just read or written; each member is checked against its id."""
    wanted = set(case_ids) if case_ids is not None else None
    with _PRIMED_LOCK:
        done = store.run_memo.setdefault(_PRIMED, set())
        if not snapshot.packs or snapshot_oid in done or all(
                store.remembered("inference", c.inference_oid) is not None
                for c in snapshot.cases if wanted is None or c.eval_id in wanted):
            return
        done.add(snapshot_oid)
        # kept as far as the read cache has room: past that (a large run) the records only
        # pushed each other out, and a case's record is read again when it is scored
        for kind, oid, body in pack.members_of(store, snapshot.packs, spare=True):
            if kind == "inference":
                store.written_elsewhere(kind, oid, body, spare=True)


def units_lost(req: ScoreRequest, reason: str, ctx: RunContext) -> Rows[UnitOutcome]:
    """A metric whose scoring process died (a metric's ``os._exit``, the OOM killer): each of
    its units is reused where reuse allows and is otherwise NOT_EVALUATED with ``reason`` —
    incomplete, so never reused, and scored again by the next run."""
    store = ctx.store
    snapshot = repo.get_snapshot(store, req.snapshot_oid)
    rule = snapshot.rule(req.metric_name)
    outcomes = Rows(UnitOutcome)
    wanted = set(req.case_ids) if req.case_ids is not None else None
    for frozen in snapshot.cases:
        if wanted is not None and frozen.eval_id not in wanted:
            continue
        reused, why = reuse.reusable_unit(store, rule, frozen, reuse=req.reuse, force=req.force)
        if reused is None:
            unit = not_evaluated(rule, frozen, req.run_id, reason)
            reused = _outcome(unit, repo.put(store, unit), why)
        outcomes.extend((reused,))
        ctx.progress.advance("scoring")
    store.flush()
    return outcomes


def score_metric(req: ScoreRequest, ctx: RunContext) -> Rows[UnitOutcome]:
    """Scores (or reuses) every unit of one metric in the run of ``ctx``; synchronous, on
    its own event loop, durable before it returns."""
    outcomes = asyncio.run(score_metric_async(req, ctx, lambda: ctx.progress.advance("scoring")))
    ctx.store.flush()
    return outcomes
