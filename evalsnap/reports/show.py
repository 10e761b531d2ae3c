"""``show RECORD --json``: a record with every link resolved."""

from __future__ import annotations

from collections.abc import Container
from typing import Any

from evalsnap.errors import EvalsnapError
from evalsnap.records import EvaluationRecord, LedgerEntry, ScoreUnit, UnitVerdict, repo
from evalsnap.records.snapshot import cases_by_key
from evalsnap.reports.summary import baseline_comparison, case_efficiency, gated, run_tokens

_VERDICT_FIELDS = ("threshold", "score", "metric_status", "gate_score", "status", "complete",
                   "reason", "trace", "judge_calls")


def _ledger(store: Any, oids: list[str], shared: bool = False) -> list[dict[str, Any]]:
    """The unit's ledger entries; one that cannot be read is shown with the reason.
    ``shared``: parsed once per run (a page's, :func:`repo.get_ledger_shared`)."""
    out = []
    for oid in oids:
        try:
            entry = repo.get_ledger_shared(store, oid) if shared else \
                repo.get(store, LedgerEntry, oid)
            out.append({"oid": oid, **entry.model_dump(mode="json")})
        except EvalsnapError as exc:
            out.append({"oid": oid, "unreadable": str(exc)})
    return out


def _summary_case(store: Any, inf: Any, refs: Any,
                  units: dict[str, ScoreUnit | UnitVerdict]) -> dict[str, Any]:
    """A case of :func:`full_record` without its details: scores, statuses, the inference's
    status (the units' verdicts, as the run's summary read them: nothing else is read)."""
    metrics = {}
    for ref in refs:
        unit = units[ref.unit_oid] = repo.get_unit_verdict(store, ref.unit_oid)
        metrics[ref.metric_name] = {**ref.model_dump(mode="json"),
                                    **{f: getattr(unit, f) for f in _VERDICT_FIELDS},
                                    "rows": [], "ledger": []}
    return {"details": False, "eval_id": inf.eval_id, "repetition": inf.repetition,
            "inference": {**inf.model_dump(mode="json"), "invocations": []},
            "initial_session_state": None, "final_session_state": None, "reference": None,
            "case_fingerprint": None, **case_efficiency(inf), "metrics": metrics}


#: What a page reads of a unit's reference in a case it does not detail (with the verdict's
#: fields; :func:`evalsnap.reports.html._unit`).
_REF_PAGE_FIELDS = ("reused", "reused_from_run", "why")


def _page_case(store: Any, inf: Any, refs: Any,
               units: dict[str, ScoreUnit | UnitVerdict]) -> dict[str, Any]:
    """:func:`_summary_case` as a page reads it: a run of 10,000 cases keeps one of these per
    case while its page is made, so only the values the page shows (a case's status, its
    agent tokens, each unit's verdict and why it was reused), not every reference field."""
    metrics = {}
    for ref in refs:
        unit = units[ref.unit_oid] = repo.get_unit_verdict(store, ref.unit_oid)
        metrics[ref.metric_name] = {**{f: getattr(ref, f) for f in _REF_PAGE_FIELDS},
                                    **{f: getattr(unit, f) for f in _VERDICT_FIELDS}}
    return {"details": False, "eval_id": inf.eval_id, "repetition": inf.repetition,
            "inference": {"status": inf.status},
            "tokens": {"total_tokens": inf.tokens.total_tokens} if inf.tokens else None,
            "metrics": metrics}


def full_record(store: Any, record_oid: str, record: EvaluationRecord, *,
                detailed: Container[tuple[str, int]] | None = None,
                for_page: bool = False) -> dict[str, Any]:
    """The record with every link resolved. ``detailed``: the (eval id, repetition) pairs
    whose inference, reference and judge ledger are read and included (default: all); the
    other cases carry their scores and the inference's status only (``"details": False``),
    so that a page of a large run reads and holds only what it shows. ``for_page``: without
    the record itself (``"record"`` None) and the baseline comparison, which a page gets
    elsewhere (a copy of each as dicts, for every unit of the run)."""
    repo.locate_units(store, record)
    snapshot = repo.get_snapshot(store, record.snapshot_oid) if record.snapshot_oid else None
    frozen = cases_by_key(snapshot)
    cases: list[dict[str, Any]] = []
    units: dict[str, ScoreUnit | UnitVerdict] = {}
    refs_of = record.units_by_case()  # one pass over the units, not one per case
    for inf in record.inference:
        key = (inf.eval_id, inf.repetition)
        if detailed is not None and key not in detailed:
            cases.append((_page_case if for_page else _summary_case)(
                store, inf, refs_of.get(key, ()), units))
            continue
        inference = repo.get_inference(store, inf.inference_oid)
        fc = frozen.first(key)
        metrics = {}
        for ref in refs_of.get(key, ()):
            # a page's units and entries parsed once per run (read ahead by the CLI while
            # Prefect's temporary API starts: evalsnap.reports.html.read_ahead)
            unit = units[ref.unit_oid] = repo.get_unit_shared(store, ref.unit_oid) \
                if for_page else repo.get(store, ScoreUnit, ref.unit_oid)
            metrics[ref.metric_name] = {
                **ref.model_dump(mode="json"),
                **unit.model_dump(mode="json", exclude={"ledger"}),
                "ledger": _ledger(store, unit.ledger, shared=for_page),
            }
        cases.append({
            "eval_id": inf.eval_id, "repetition": inf.repetition,
            "inference": {**inf.model_dump(mode="json"),
                          "status": inference.status, "error": inference.error,
                          "attempts": inference.attempts,
                          "invocations": [i.model_dump(mode="json")
                                          for i in inference.invocations]},
            "initial_session_state": inference.initial_session_state,
            "final_session_state": inference.final_session_state,
            "reference": fc.reference if fc else None,
            "case_fingerprint": fc.case_fingerprint if fc else None,
            **case_efficiency(inf),
            "metrics": metrics,
        })
    if for_page and not any(i.repetition for i in record.inference) \
            and not any(r.repetition for r in record.units):
        # a page shows the aggregates over repetitions only when a case has several (a
        # list of 70,000 dicts at 10,000 cases × 7 metrics, ~175 MB, for nothing shown)
        entries: list[dict[str, Any]] = []
        passed = record.summary.passed
    else:
        entries, passed = gated(record, {**units, **{
            r.unit_oid: repo.get(store, ScoreUnit, r.unit_oid)
            for r in record.units if r.unit_oid not in units}})
    full = {
        "record_id": record_oid,
        "record": None if for_page else record.model_dump(mode="json"),
        "passed": passed,
        "aggregates": entries,
        **run_tokens(record),
        "snapshot": {"snapshot_id": record.snapshot_oid,
                     "rules": [r.model_dump(mode="json") for r in snapshot.rules]
                     if snapshot else []},
        "cases": cases,
    }
    return full if for_page else full | baseline_comparison(store, record, cases, entries)
