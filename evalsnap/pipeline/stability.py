"""``--until-stable MAX``: more repetitions only where the doubt is (issue 28 item 5).

After the first ``--repetitions N``, a case gets more repetitions while any of its case ×
metric pass rates is still in doubt, until none is or it has ``MAX`` repetitions. *In
doubt* means the 95% Wilson interval of the pass rate (:func:`evalsnap.aggregates.wilson`)
holds the *target* strictly inside it (``low < target < high``): the repetitions so far
cannot tell on which side of the target the case lies. The target of a case × metric is

* with a baseline that scored it: the baseline's pass rate of it (is tonight different?);
* else the repetition gate's own line: ``rate:P`` → P; ``every`` → 1.0; ``mean`` (ADK's
  rule) → the metric's threshold, which is exactly the line between passing and failing
  when each repetition scores 0 or 1 (the mean of the scores is then the pass rate) and an
  approximation otherwise.

An interval ending on the target (all passed, target 1.0) is not in doubt: more
repetitions could only show a failure the gate has not seen, never undo one. A case with an
incomplete repetition (a failed inference, a unit NOT_EVALUATED) stops there: more
repetitions cannot complete it. Each round adds ``N`` repetitions (fewer if ``MAX`` is
nearer); every added repetition is an ordinary unit, reusable and explained.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from evalsnap.aggregates import wilson
from evalsnap.gates import rate_of
from evalsnap.records.record import CaseStability

__all__ = ["CaseStability", "in_doubt", "next_round", "target_of"]

def target_of(gate: str, threshold: float | None, baseline_rate: float | None) -> float:
    """The pass rate a case × metric is compared with (see the module's docstring)."""
    if baseline_rate is not None:
        return baseline_rate
    if gate == "every":
        return 1.0
    rate = rate_of(gate)
    if rate is not None:
        return rate
    return min(1.0, max(0.0, threshold if threshold is not None else 0.5))


def in_doubt(passed: int, scored: int, target: float) -> bool:
    """Whether ``passed`` of ``scored`` leaves ``target`` strictly inside the 95% Wilson
    interval of the pass rate."""
    interval = wilson(passed, scored)
    return interval is not None and interval[0] < target < interval[1]


def next_round(units: Iterable[Any], failed_inference: set[tuple[str, int]],
               repetitions: dict[str, int], *, gate: str, thresholds: dict[str, float],
               baseline_rates: dict[tuple[str, str], float], step: int,
               maximum: int) -> tuple[dict[str, int], dict[str, CaseStability]]:
    """What the next round adds: ``{eval_id: more repetitions}`` for the cases in doubt, and
    the verdict of every case that stops now.

    ``units`` are this run's unit outcomes so far (``eval_id``, ``repetition``,
    ``metric_name``, ``status``, ``complete``); ``failed_inference`` the (case, repetition)
    pairs without a successful inference; ``repetitions`` each case's repetitions so far."""
    counts: dict[tuple[str, str], list[int]] = {}
    incomplete = {eval_id for eval_id, _ in failed_inference}
    for unit in units:
        if unit.status == "INFORMATIONAL":
            continue
        if not unit.complete or unit.status not in ("PASSED", "FAILED"):
            incomplete.add(unit.eval_id)
            continue
        tally = counts.setdefault((unit.eval_id, unit.metric_name), [0, 0])
        tally[0] += unit.status == "PASSED"
        tally[1] += 1
    more: dict[str, int] = {}
    stopped: dict[str, CaseStability] = {}
    for eval_id, n in repetitions.items():
        doubt = any(in_doubt(passed, scored, target_of(gate, thresholds.get(metric),
                                                         baseline_rates.get((eval_id, metric))))
                    for (case, metric), (passed, scored) in counts.items() if case == eval_id)
        if eval_id in incomplete:
            stopped[eval_id] = CaseStability(repetitions=n, stopped="incomplete")
        elif not doubt:
            stopped[eval_id] = CaseStability(repetitions=n, stopped="stable")
        elif n >= maximum:
            stopped[eval_id] = CaseStability(repetitions=n, stopped="max")
        else:
            more[eval_id] = min(step, maximum - n)
    return more, stopped


def baseline_rates(store: Any, record_oid: str | None) -> dict[tuple[str, str], float]:
    """The baseline record's pass rate per (eval_id, metric) (none without a baseline, or
    where the baseline scored nothing)."""
    if record_oid is None:
        return {}
    from evalsnap.aggregates import aggregates
    from evalsnap.records import EvaluationRecord, repo

    record = repo.get(store, EvaluationRecord, record_oid)
    units = repo.unit_verdicts(store, record)
    return {(a["eval_id"], a["metric"]): a["pass_rate"] for a in aggregates(record, units)
            if a["pass_rate"] is not None}
