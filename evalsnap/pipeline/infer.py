"""Inference: run the agent on a batch of cases (or reuse earlier runs of them).

One request is a *batch* of consecutive cases × repetitions, run concurrently on one event
loop (``concurrency``), each case under one slot of the agent's model limit. Reuse is per
case, decided by :mod:`evalsnap.pipeline.reuse`. A failed inference is recorded as a
failure and never reused. Only a failure a retry can fix (:mod:`evalsnap.agents.failures`) is
worth a retry of its batch (:func:`worth_retrying`); a retry of the batch does not run
again a case that failed in a way no retry fixes.
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any

from google.adk.evaluation.eval_case import EvalCase
from google.adk.version import __version__ as ADK_VERSION
from pydantic import BaseModel, ConfigDict

from evalsnap.adk._user_code import contained_task_factory
from evalsnap.agents.base import LoadedAgent, now_iso
from evalsnap.agents.lanes import load_agent, run_inference
from evalsnap.pipeline import reuse, runners
from evalsnap.pipeline.outcomes import InferenceOutcome
from evalsnap.records import InferenceRecord, repo
from storage import Store

if TYPE_CHECKING:
    from evalsnap.pipeline.context import RunContext


class InferItem(BaseModel):
    """One case × repetition of a batch."""

    model_config = ConfigDict(frozen=True)

    eval_id: str
    repetition: int
    fingerprint: str
    case_json: str
    """The ``EvalCase`` as JSON text: Prefect walks structured task arguments value by value."""


class InferBatch(BaseModel):
    """What one inference task is asked to do."""

    model_config = ConfigDict(frozen=True)

    store_url: str
    agent_dir: str
    agent_name: str | None = None
    """The sub-agent evaluated instead of the root agent (``AgentEvaluator``'s ``agent_name``)."""
    framework: str | None = None
    """``adk`` or ``langgraph`` when forced (``--framework``); None: detected."""
    eval_set_id: str
    run_id: str
    reuse: bool
    concurrency: int = 8
    items: list[InferItem]

    @property
    def label(self) -> str:
        first, last = self.items[0].eval_id, self.items[-1].eval_id
        return first if len(self.items) == 1 else f"{first} … {last} ({len(self.items)})"


_lock = threading.Lock()
_agents: dict[tuple[str, str | None, str | None], LoadedAgent] = {}
_MAX_AGENTS = 8


def agent_at(agent_dir: str, agent_name: str | None = None,
             framework: str | None = None) -> LoadedAgent:
    """The agent package, imported once per process (trusted live code, as in ADK: every
    process that runs or scores for it imports it, so what it registers is there). In the
    process that planned the run it is the very agent the plan fingerprinted
    (:func:`use_agent`), never one loaded by an earlier run of a long-lived process."""
    key = (agent_dir, agent_name, framework)
    with _lock:
        known = _agents.get(key)
    if known is not None:
        return known
    return use_agent(load_agent(agent_dir, agent_name=agent_name, framework=framework),
                     agent_dir, agent_name, framework)


def use_agent(agent: LoadedAgent, agent_dir: str, agent_name: str | None = None,
              framework: str | None = None) -> LoadedAgent:
    """Makes ``agent`` the one :func:`agent_at` hands out for these arguments."""
    with _lock:
        _agents.pop((agent_dir, agent_name, framework), None)
        while len(_agents) >= _MAX_AGENTS:
            _agents.pop(next(iter(_agents)))
        _agents[(agent_dir, agent_name, framework)] = agent
    return agent


def worth_retrying(outcomes: list[InferenceOutcome], ctx: RunContext) -> list[InferenceOutcome]:
    """The failed outcomes of a batch that a retry could fix (not settled in ``ctx``'s run)."""
    return [o for o in outcomes if o.status != "success" and o.fingerprint not in ctx.settled]


async def _one(batch: InferBatch, item: InferItem, attempt: int,
               ctx: RunContext) -> InferenceOutcome:
    settled = ctx.settled.get(item.fingerprint)
    if settled is not None:  # failed before in this run, the same way a retry would
        return settled
    store = ctx.store
    found = reuse.inference_to_use(store, item.fingerprint, reuse=batch.reuse,
                                   run_id=batch.run_id, attempt=attempt)
    if found is not None:
        oid, record = found
        return InferenceOutcome(eval_id=item.eval_id, repetition=item.repetition, oid=oid,
                                fingerprint=item.fingerprint, status="success",
                                run_id=record.run_id,
                                model_calls=record.model_calls
                                if record.run_id == batch.run_id else 0)
    case = EvalCase.model_validate_json(item.case_json)
    async with ctx.limiter.slot("agent"):
        record = await run_inference(agent_at(batch.agent_dir, batch.agent_name, batch.framework), case,
                                     eval_set_id=batch.eval_set_id, repetition=item.repetition,
                                     run_id=batch.run_id, attempt=attempt,
                                     fingerprint=item.fingerprint)
    # written as soon as it is done (a killed run keeps it), off the loop: on a bucket the
    # write's round trips overlap the other cases' inference
    oid = await asyncio.to_thread(_write, store, record)
    outcome = InferenceOutcome(eval_id=item.eval_id, repetition=item.repetition, oid=oid,
                               fingerprint=item.fingerprint, status=record.status,
                               model_calls=record.model_calls, run_id=batch.run_id,
                               error=record.error)
    if not record.ok and record.retryable is False:
        ctx.settled[item.fingerprint] = outcome
    return outcome


def _write(store: Store, record: InferenceRecord) -> str:
    oid = repo.put(store, record)
    repo.index_inference(store, record, oid)
    return oid


def infer_batch(batch: InferBatch, ctx: RunContext, attempt: int = 1) -> list[InferenceOutcome]:
    """Runs (or reuses) every item of ``batch`` in the run of ``ctx``; returns their
    outcomes in order.

    Synchronous: it runs its own event loop, under one of the process's CPU slots, and
    makes what it wrote durable before it returns.
    """
    async def run_all() -> list[InferenceOutcome]:
        # the agent's code raising SystemExit & co. fails its case, not the loop
        asyncio.get_running_loop().set_task_factory(contained_task_factory)
        gate = asyncio.Semaphore(max(1, batch.concurrency))

        async def one(item: InferItem) -> InferenceOutcome:
            async with gate:
                outcome = await _one(batch, item, attempt, ctx)
            ctx.progress.advance("inference")
            return outcome

        return list(await asyncio.gather(*(one(item) for item in batch.items)))

    with runners.cpu_slot():
        outcomes = asyncio.run(run_all())
    ctx.store.flush()
    return outcomes


def record_failures(batch: InferBatch, error: str, attempts: int,
                    store: Store) -> list[InferenceOutcome]:
    """Failed inferences for every item of a batch whose task failed as a whole."""
    agent = agent_at(batch.agent_dir, batch.agent_name, batch.framework)
    out = []
    for item in batch.items:
        record = InferenceRecord(
            inference_fingerprint=item.fingerprint, eval_set_id=batch.eval_set_id,
            eval_id=item.eval_id, repetition=item.repetition, app_name=agent.name,
            agent_name=agent.root_agent.name, adk_version=ADK_VERSION, status="failure",
            error=error, attempts=attempts, run_id=batch.run_id, created_at=now_iso())
        out.append(InferenceOutcome(eval_id=item.eval_id, repetition=item.repetition,
                                    oid=repo.put(store, record), fingerprint=item.fingerprint,
                                    status="failure", run_id=batch.run_id, error=error))
    store.flush()
    return out


def with_identity(items: list[InferItem], outcomes: list[Any]) -> list[InferenceOutcome]:
    """Outcomes named after the items they answer: identical inputs share one inference
    (same fingerprint), so the case identity comes from the request, not the result."""
    return [InferenceOutcome.model_validate(o).model_copy(
        update={"eval_id": i.eval_id, "repetition": i.repetition})
        for i, o in zip(items, outcomes, strict=True)]


def batches(n_items: int, workers: int, size: int | None = None) -> list[range]:
    """Deterministic partition of ``n_items`` into consecutive batches.

    ``size`` (``EVALSNAP_INFER_BATCH``) fixes the batch size; by default there is about
    one batch per worker, at most 50 items each, so a retry, a cache entry or a progress
    step is never coarse (how many run at once is :func:`evalsnap.pipeline.runners.cpu_slot`'s
    business). The same eval set gives the same batches, which is what lets Prefect's
    cache answer a rerun.
    """
    if n_items <= 0:
        return []
    if not size:
        size = max(1, min(50, -(-n_items // max(1, workers))))
    return [range(start, min(start + size, n_items)) for start in range(0, n_items, size)]
