"""Whether a run is *good* — it passed its own gate — for ``--baseline last-good`` and gc.

A run is good when its gate (the ``fail_on`` its record holds; ``quality`` for records
written before it was recorded, and for imported ones), re-evaluated from what is stored,
does not fail it: :func:`evalsnap.reports.regressions.gate` of the record's
:func:`~evalsnap.reports.summary.summary`, with its regressions against its own baseline as
``summary`` computes them. A run that regressed against its baseline (under ``fail_on:
regression``) is not good; under ``never`` every run is. A run whose baseline cannot be read
any more cannot be re-evaluated under ``regression``: it is not good (the walk of
:func:`evalsnap.records.marks.last_good` goes on to earlier runs).

The walk itself, and accepted runs, are :mod:`evalsnap.records.marks`'s; this module is the
``good`` it is given (the records package cannot import the reports, which read it).
"""

from __future__ import annotations

from evalsnap.errors import NotFoundError
from evalsnap.exitcodes import ExitCode
from evalsnap.records import EvaluationRecord, RunManifest, ScoreUnit, repo
from evalsnap.records import marks as _marks
from evalsnap.reports.regressions import gate
from evalsnap.reports.summary import summary
from storage import Store

__all__ = ["is_good", "last_good", "passed_own_gate"]


def _units(store: Store, record: EvaluationRecord) -> dict[str, ScoreUnit]:
    """The record's units, read in one concurrent batch (a missing or damaged one: the
    typed error of a single read)."""
    repo.locate_units(store, record)
    found = store.get_objects("unit", [u.unit_oid for u in record.units])
    units = {}
    for oid, data in found.items():
        if isinstance(data, Exception):
            repo.get(store, ScoreUnit, oid)  # raises the typed error for it
        else:
            units[oid] = ScoreUnit.from_bytes(data, where=oid)
    return units


def passed_own_gate(store: Store, record_oid: str, record: EvaluationRecord) -> bool:
    """Whether ``record``'s gate, re-evaluated from the store, lets it through."""
    fail_on = record.fail_on or "quality"
    base = record.baseline
    if fail_on == "regression" and base is not None and base.record_oid is not None:
        try:
            before = repo.get(store, EvaluationRecord, base.record_oid)
        except NotFoundError as exc:
            raise NotFoundError(f"the baseline of run {record.run_id} is gone, so its gate "
                                f"(fail_on=regression) cannot be re-evaluated: {exc}") from exc
        # within a run, what this batch reads the summary of the baseline reads from memory
        store.get_objects("unit", [u.unit_oid for u in before.units])
    gated, _ = gate(summary(store, record_oid, record, _units(store, record)), fail_on)
    return gated.exit_code == ExitCode.OK


def is_good(store: Store, manifest: RunManifest) -> bool:
    """Whether the run of ``manifest`` passed its own gate (:func:`passed_own_gate`)."""
    return passed_own_gate(store, manifest.record_oid,
                           repo.get(store, EvaluationRecord, manifest.record_oid))


def last_good(store: Store, eval_set_id: str, *,
              exclude_run: str | None = None) -> _marks.LastGood | None:
    """:func:`evalsnap.records.marks.last_good` with this module's ``good``."""
    return _marks.last_good(store, eval_set_id, is_good, exclude_run=exclude_run)
