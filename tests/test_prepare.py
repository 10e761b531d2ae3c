"""A run's first steps done before its flow starts (:func:`evalsnap.api.prepare`): the CLI
plans and proves the previous record while Prefect's temporary API starts. The flow takes
what was prepared for exactly its spec, raises what planning raised, and plans itself
otherwise."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest

from evalsnap import api, errors
from evalsnap.pipeline import context, plan
from evalsnap.spec import RunSpec


def _spec(shop: Path, store: Path, **extra: Any) -> RunSpec:
    return RunSpec(agent_dir=str(shop), evalsets=[str(shop / "shop.evalset.json")],
                   store=str(store), cases=["weather_paris", "cart_add_two_items"], **extra)


def _count_plans(monkeypatch: pytest.MonkeyPatch) -> list[RunSpec]:
    planned: list[RunSpec] = []
    real = plan.plan_runs

    def counted(spec: RunSpec, ctx: Any, **kwargs: Any) -> Any:
        planned.append(spec)
        return real(spec, ctx, **kwargs)

    monkeypatch.setattr(plan, "plan_runs", counted)  # prepare's
    # the flow's (the package `flows` names its flow `evaluate`, hiding the module)
    monkeypatch.setattr(importlib.import_module("flows.evaluate"), "plan_runs", counted)
    return planned


def test_the_flow_takes_the_plan_and_proofs_prepared_for_it(
        shop_copy: Path, store_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = api.run_spec(_spec(shop_copy, store_dir))
    planned = _count_plans(monkeypatch)
    spec = _spec(shop_copy, store_dir, reuse=True)
    ctx = context.RunContext(str(store_dir))
    api.prepare(spec, ctx)
    assert len(planned) == 1, "expected prepare to plan the run"
    early = ctx.store.requests.snapshot()["get"]
    assert early > 0, "expected prepare to read the previous record and its packs"
    again = api.run_spec(spec, run_context=ctx)
    assert len(planned) == 1, "expected the flow to take the prepared plan, not plan again"
    assert again.store_requests["get"] >= early, \
        "expected what prepare read to count as the run's requests"
    assert again.reused_units == first.scored_units > 0 and again.scored_units == 0, \
        "expected every unit reused, as without prepare"
    assert again.agent_calls == 0 and again.judge_calls == 0


def test_a_prepared_plan_for_another_spec_is_not_taken(
        shop_copy: Path, store_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    planned = _count_plans(monkeypatch)
    ctx = context.RunContext(str(store_dir))
    api.prepare(_spec(shop_copy, store_dir), ctx)
    other = _spec(shop_copy, store_dir, metrics=["final_state_match"])
    result = api.run_spec(other, run_context=ctx)
    assert len(planned) == 2 and planned[1].metrics == ["final_state_match"], \
        "expected the flow to plan its own spec"
    assert {a.metric for a in result.aggregates} == {"final_state_match"}


def test_an_error_planning_raised_is_the_flows(
        shop_copy: Path, store_dir: Path) -> None:
    (shop_copy / "shop.evalset.json").write_text('{"eval_set_id": "shop", "eval_cases": [')
    spec = _spec(shop_copy, store_dir)
    with pytest.raises(errors.EvalsnapError) as unprepared:
        api.run_spec(spec)
    ctx = context.RunContext(str(store_dir))
    api.prepare(spec, ctx)
    with pytest.raises(errors.EvalsnapError) as prepared:
        api.run_spec(spec, run_context=ctx)
    assert type(prepared.value) is type(unprepared.value)
    assert str(prepared.value) == str(unprepared.value)


def test_read_ahead_reads_what_the_page_details_and_changes_no_page(
        shop_copy: Path, store_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """For a ``--reuse`` run, :func:`api.read_ahead` parses the previous record's detailed
    cases (inference, units, judge entries) into the run's memos while the temporary API
    starts; the run's page reads them from there and is the page a fresh process makes."""
    from evalsnap.records import EvaluationRecord, ScoreUnit, repo
    from evalsnap.reports import html

    first = api.run_spec(_spec(shop_copy, store_dir))
    store = context.RunContext.open(str(store_dir)).store
    previous = repo.get(store, EvaluationRecord, first.record_id)
    entries = {e for ref in previous.units for e in repo.get(store, ScoreUnit, ref.unit_oid).ledger}
    assert entries, "expected the shop's judge metric to leave ledger entries"

    ctx = context.RunContext(str(store_dir))
    spec = _spec(shop_copy, store_dir, reuse=True)
    api.prepare(spec, ctx)
    assert html.read_ahead(ctx.store, previous, lambda: False) == 0  # told to stop at once
    with monkeypatch.context() as patched:  # a record too large to rank ahead
        patched.setattr(html, "READ_AHEAD_UNITS", len(previous.units) - 1)
        assert html.read_ahead(ctx.store, previous) == 0
    api.read_ahead(ctx, lambda: False)  # told to stop at once: nothing read
    assert repo._parsed(ctx.store, "judge entries", 2048).peek(next(iter(entries))) is None
    api.read_ahead(ctx, lambda: True)
    memo = repo._parsed(ctx.store, "judge entries", 2048)
    assert all(memo.peek(e) is not None for e in entries)
    assert all(repo._parsed(ctx.store, "units", 4096).peek(r.unit_oid) is not None
               for r in previous.units)

    again = api.run_spec(spec, run_context=ctx)
    assert again.reused_units == first.scored_units and again.judge_calls == 0
    record = repo.get(ctx.store, EvaluationRecord, again.record_id)
    warm = html.render_bytes(html.template(), **html.page_context(
        ctx.store, again.record_id, record))
    fresh_store = context.RunContext.open(str(store_dir)).store
    fresh = html.render_bytes(html.template(), **html.page_context(
        fresh_store, again.record_id, repo.get(fresh_store, EvaluationRecord, again.record_id)))
    assert warm == fresh
    assert all(e.encode() in warm for e in entries), "expected every entry on the page"
