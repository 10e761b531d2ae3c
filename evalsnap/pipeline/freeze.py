"""Freeze: the inference records + the full reference cases + the resolved rules, written
once as a content-addressed snapshot. From then on scoring reads only the snapshot."""

from __future__ import annotations

import itertools
from collections.abc import Iterable

from google.adk.evaluation.eval_case import EvalCase
from google.adk.evaluation.eval_set import EvalSet
from google.adk.version import __version__ as ADK_VERSION
from pydantic import BaseModel, ConfigDict

from evalsnap.agents.base import now_iso
from evalsnap.fingerprint import case_fingerprint
from evalsnap.pipeline.outcomes import InferenceOutcome
from evalsnap.records import FrozenCase, MetricRule, Snapshot, pack, repo
from evalsnap.rows import RowGroups, RowList, Rows
from storage import Store


class FreezeRequest(BaseModel):
    """What the freeze task is asked to do."""

    model_config = ConfigDict(frozen=True)

    store_url: str
    eval_set_json: str
    """The eval set as JSON text: its id and name, and the cases that come before ``cases``
    (a plan gives none here: every selected case is in ``cases``)."""
    cases: RowList[EvalCase] = []
    """The selected cases (the *current* references), as rows."""
    rules: list[MetricRule]
    outcomes: RowList[InferenceOutcome]
    app_name: str


def _inference_packs(store: Store, cases: Iterable[FrozenCase]) -> list[str]:
    """The cases' inference records written as packs (their bytes are in memory: read or
    written by this run), one at a time, each let go once written: a scoring process reads
    these few packs instead of a record per case, and publish names them in the record."""
    return pack.write_packs(store, (("inference", store.get_object("inference", oid))
                                    for oid in dict.fromkeys(c.inference_oid for c in cases)))


def freeze(req: FreezeRequest, store: Store) -> str:
    """Writes the snapshot (write-once, content-addressed) to the run's ``store`` and
    returns its id."""
    # The cases are read one at a time from their rows, each let go once its reference is
    # made: as one EvalSet they were a second copy of the plan's (~12 KB a case, memray)
    eval_set = EvalSet.model_validate_json(req.eval_set_json)
    by_case = RowGroups(req.outcomes, lambda o: o.eval_id)  # row numbers, not the outcomes
    cases = Rows(FrozenCase)  # each case's JSON, past a few MB in a temporary file
    for case in itertools.chain(eval_set.eval_cases, req.cases):
        reference = case.model_dump(mode="json", by_alias=False)
        for outcome in sorted(by_case.get(case.eval_id, ()), key=lambda o: o.repetition):
            record = repo.get_inference(store, outcome.oid)
            cases.extend((FrozenCase(
                eval_id=case.eval_id, repetition=outcome.repetition, inference_oid=outcome.oid,
                inference_fingerprint=record.inference_fingerprint, inference_ok=record.ok,
                reference=reference, case_fingerprint=case_fingerprint(record, reference)),))
    snapshot = Snapshot(eval_set_id=eval_set.eval_set_id, eval_set_name=eval_set.name,
                        app_name=req.app_name, adk_version=ADK_VERSION,
                        cases=cases,  # type: ignore[arg-type]  # RowList: Rows or list
                        rules=req.rules, packs=_inference_packs(store, cases),
                        created_at=now_iso())
    oid = repo.put(store, snapshot)
    store.flush()
    repo.remember_snapshot(store, oid, snapshot)
    return oid
