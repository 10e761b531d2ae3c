"""A run over several eval sets: one record per eval set, one verdict for the run.

Records stay per eval set (``latest``, ``diff`` and ``explain`` compare records of one eval
set, each with its own rules); the flow's result names every record and gives the worst
exit code of them (:func:`evalsnap.exitcodes.worst`): incomplete (3) over a quality failure
(1) over passed (0).
"""

from __future__ import annotations

from evalsnap.exitcodes import worst
from evalsnap.reports.summary_model import RecordResult, SuiteResult, Summary, parts

__all__ = ["combined", "parts"]

_TOTALS = ("agent_calls", "judge_calls", "reused_judge_samples", "reused_units", "scored_units")


def combined(results: list[RecordResult]) -> Summary:
    """The result of a run: the single eval set's own, or ``runs`` with the totals."""
    if len(results) == 1:
        return results[0]
    return SuiteResult(
        kind=results[0].kind, eval_set_ids=[r.eval_set_id for r in results],
        run_ids=[r.run_id for r in results], record_ids=[r.record_id for r in results],
        **{key: sum(getattr(r, key) for r in results) for key in _TOTALS},
        complete=all(r.complete for r in results), passed=all(r.passed for r in results),
        exit_code=worst(r.exit_code for r in results), runs=results)
