"""Aggregates over repetitions: one entry per case × metric, read from its repetitions' units.

Every repetition is an ordinary unit; this module reads them together. The statistics are
scipy's (STYLE 22), each estimator named here and in ``docs/repetitions.md``:

* ``pass_rate`` = passed / scored, ``pass_rate_ci95`` its Wilson score interval
  (``scipy.stats.binomtest(passed, scored).proportion_ci(0.95, method="wilson")``, computed
  by scipy's own closed form without importing ``scipy.stats``: the same bits, tested);
* ``pass_at_k`` / ``pass_hat_k``, for k = 1…scored, the unbiased estimators
  pass@k = 1 − C(scored − passed, k) / C(scored, k) and pass^k = C(passed, k) / C(scored, k)
  (``math.comb``: exact integers, as ``scipy.special.comb(..., exact=True)`` gives them);
* ``mean_score`` / ``score_stdev``: mean and sample standard deviation of the repetitions'
  scores (None with fewer than 1 / 2 scores).

*Scored* repetitions are the complete ``PASSED`` / ``FAILED`` ones; a repetition whose unit
is not complete, or that has no unit (its inference failed), is ``incomplete``.

The **repetition gate** (``--repetition-gate``) gives each entry its ``status``:

* ``mean`` (default) — ADK ``AgentEvaluator``'s rule: the mean of the per-invocation scores
  of all repetitions against the threshold, higher-is-better unless every scored invocation
  whose score is not the threshold says otherwise by its own PASSED/FAILED;
* ``every`` — every repetition passed (pass^n);
* ``rate:P`` — the pass rate is at least P.

An entry with an incomplete repetition is ``NOT_EVALUATED`` whatever the gate: the run is
incomplete (exit 3), never passed on part of its repetitions.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterator, Mapping
from math import comb
from typing import Any

from evalsnap.gates import check_gate, rate_of
from evalsnap.rows import RowGroups

__all__ = ["aggregate", "aggregates", "check_gate", "gate_passed", "pass_at_k", "record_gate",
           "wilson"]


#: The two-sided 95 % normal quantile, as scipy computes it (``scipy.special.ndtri(0.975)``).
_Z95 = 1.959963984540054


def wilson(passed: int, n: int) -> list[float] | None:
    """The 95% Wilson score interval of ``passed`` of ``n`` (None for n = 0): scipy's
    ``binomtest(passed, n).proportion_ci(method="wilson")``, to the bit (tested), by its
    closed form (Newcombe 1998), as scipy computes it: importing ``scipy.stats`` for it cost
    every run ~0.8 s."""
    if n == 0:
        return None
    z = _Z95
    p = passed / n
    denom = 2 * (n + z**2)
    center = (2 * n * p + z**2) / denom
    delta = z / denom * math.sqrt(4 * n * p * (1 - p) + z**2)
    return [0.0 if passed == 0 else center - delta, 1.0 if passed == n else center + delta]


def pass_at_k(passed: int, n: int) -> tuple[dict[str, float], dict[str, float]]:
    """pass@k and pass^k for k = 1…n, keyed by ``str(k)``."""
    at, hat = {}, {}
    for k in range(1, n + 1):
        total = comb(n, k)
        at[str(k)] = 1.0 - comb(n - passed, k) / total
        hat[str(k)] = comb(passed, k) / total
    return at, hat


def _adk_mean_gate(units: list[Any]) -> tuple[float | None, bool, str]:
    """ADK ``AgentEvaluator``'s verdict on one metric over all repetitions: the pooled
    per-invocation mean, the inferred direction, and PASSED / FAILED / NOT_EVALUATED."""
    rows = [(r.score, r.status, u.threshold) for u in units for r in u.rows]
    if not rows:  # a metric that gave no rows: its own score stands for its invocations
        rows = [(u.gate_score, u.status, u.threshold) for u in units]
    scored = [(s, st, t) for s, st, t in rows if s is not None]
    threshold = units[0].threshold
    directions = {(s > threshold) == (st == "PASSED") for s, st, _ in scored
                  if s != threshold and st in ("PASSED", "FAILED")}
    higher = directions.pop() if len(directions) == 1 else True
    if not scored:
        return None, higher, "NOT_EVALUATED"
    mean = _mean([s for s, _, _ in scored])
    ok = mean >= threshold if higher else mean <= threshold
    return mean, higher, "PASSED" if ok else "FAILED"


def _mean(values: list[Any]) -> Any:
    """``statistics.mean(values)``; one float is its own mean (what ``statistics.mean``
    gives, exactly, without its exact sum of fractions: a run without repetitions has one
    score per case × metric)."""
    if len(values) == 1 and type(values[0]) is float:
        return values[0]
    return statistics.mean(values)


def aggregate(eval_id: str, metric: str, reps: dict[int, Any], repetitions: list[int],
              gate: str) -> dict[str, Any]:
    """The aggregate of one case × metric: ``reps`` maps a repetition to its unit (a
    repetition of ``repetitions`` without one is incomplete)."""
    units = [reps[r] for r in repetitions if r in reps]
    complete = [u for u in units if u.complete and u.status in ("PASSED", "FAILED")]
    passed = sum(u.status == "PASSED" for u in complete)
    failed = len(complete) - passed
    n = len(repetitions)
    incomplete = n - passed - failed
    scored = passed + failed
    scores = [u.score for u in complete if u.score is not None]
    at, hat = pass_at_k(passed, scored)
    gate_score, higher, mean_status = _adk_mean_gate(units) if units else (None, True, "NOT_EVALUATED")
    if incomplete:
        verdict, status = "incomplete", "NOT_EVALUATED"
    else:
        verdict = "passing" if passed == n else "failing" if passed == 0 else "flaky"
        if gate == "mean":
            status = mean_status
        elif gate == "every":
            status = "PASSED" if passed == n else "FAILED"
        else:
            status = "PASSED" if passed / n >= (rate_of(gate) or 0.0) else "FAILED"
    return {
        "eval_id": eval_id, "metric": metric, "n": n, "passed": passed, "failed": failed,
        "incomplete": incomplete, "scored": scored,
        "pass_rate": passed / scored if scored else None,
        "pass_rate_ci95": wilson(passed, scored),
        "mean_score": _mean(scores) if scores else None,
        "score_stdev": statistics.stdev(scores) if len(scores) > 1 else None,
        "pass_at_k": at, "pass_hat_k": hat, "verdict": verdict, "status": status,
        "gate": gate, "gate_score": gate_score, "higher_is_better": higher,
        "threshold": units[0].threshold if units else None,
        "repetitions": [{"repetition": r, "status": reps[r].status if r in reps else "NOT_EVALUATED",
                         "score": reps[r].score if r in reps else None,
                         "complete": bool(r in reps and reps[r].complete)} for r in repetitions],
    }


def aggregates(record: Any, units: Mapping[str, Any], gate: str | None = None) -> list[dict[str, Any]]:
    """Every case × metric of ``record`` (informational metrics left out), in the record's
    order; ``gate`` defaults to the one the record was run with."""
    return list(iter_aggregates(record, units, gate))


def iter_aggregates(record: Any, units: Mapping[str, Any],
                    gate: str | None = None) -> Iterator[dict[str, Any]]:
    """:func:`aggregates` one at a time (a run of 10,000 cases × 7 metrics: 70,000 of them,
    ~175 MB as one list)."""
    gate = gate or record_gate(record)
    reps_of: dict[str, list[int]] = {}

    def add(eval_id: str, repetition: int) -> None:
        reps = reps_of.setdefault(eval_id, [])
        if repetition not in reps:
            reps.append(repetition)

    for inf in record.inference:
        add(inf.eval_id, inf.repetition)
    metrics: dict[str, None] = {}

    def case_of(ref: Any) -> str:  # one pass over the units: their cases, repetitions, metrics
        add(ref.eval_id, ref.repetition)
        metrics[ref.metric_name] = None
        return str(ref.eval_id)

    # each case's units read (and their verdicts looked up) when its aggregates are made:
    # the units of every case × metric at once were a dict of 210,000 at 30,000 cases
    by_case = RowGroups(record.units, case_of)
    for eval_id, repetitions in reps_of.items():
        by_metric: dict[str, dict[int, Any]] = {}
        for ref in by_case.get(eval_id, ()):
            by_metric.setdefault(ref.metric_name, {})[ref.repetition] = units[ref.unit_oid]
        for metric in metrics:
            reps = by_metric.get(metric, {})
            if reps and all(u.status == "INFORMATIONAL" for u in reps.values()):
                continue
            yield aggregate(eval_id, metric, reps, sorted(repetitions), gate)


def record_gate(record: Any) -> str:
    """The repetition gate a record was run with (older records: ``mean``)."""
    c = record.coverage
    return (c.repetition_gate if c is not None else None) or "mean"


def gate_passed(entries: list[dict[str, Any]]) -> bool:
    """Whether every case × metric passed its repetition gate."""
    return all(e["status"] == "PASSED" for e in entries)
