"""ADK interop: each record also becomes an ``EvalSetResult`` file ``adk web`` can show."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from google.adk.evaluation._eval_set_results_manager_utils import create_eval_set_result
from google.adk.evaluation.eval_metrics import (
    EvalMetricResult,
    EvalMetricResultPerInvocation,
    EvalStatus,
)
from google.adk.evaluation.eval_result import EvalCaseResult, EvalSetResult
from google.adk.evaluation.eval_set import EvalCase

from evalsnap import repo
from evalsnap.records import EvaluationRecord, ScoreUnit

HISTORY_SUFFIX = ".evalset_result.json"


def to_eval_set_result(store: Any, record: EvaluationRecord) -> EvalSetResult:
    """Builds ADK's result model from a record (first repetition of each case)."""
    snapshot = repo.get_snapshot(store, record.snapshot_oid) if record.snapshot_oid else None
    cases: list[EvalCaseResult] = []
    frozen = {(c.eval_id, c.repetition): c for c in snapshot.cases} if snapshot else {}
    for inf in record.inference:
        if inf.repetition != 0:
            continue
        units = [u for u in record.units if u.eval_id == inf.eval_id and u.repetition == 0]
        inference = repo.get_inference(store, inf.inference_oid)
        fc = frozen.get((inf.eval_id, 0))
        reference = EvalCase.model_validate(fc.reference) if fc else None
        expected = reference.conversation if reference else None
        per_inv = [EvalMetricResultPerInvocation(
            actual_invocation=a, expected_invocation=expected[i] if expected and i < len(
                expected) else None, eval_metric_results=[])
            for i, a in enumerate(inference.invocations)]
        overall = []
        statuses = []
        for ref in units:
            unit = repo.get(store, ScoreUnit, ref.unit_oid)
            rule = snapshot.rule(ref.metric_name) if snapshot else None
            common = dict(metric_name=unit.metric_name, threshold=unit.threshold,
                          criterion=rule.criterion if rule else None)
            overall.append(EvalMetricResult(score=unit.score,
                                            eval_status=EvalStatus[unit.status], **common))
            statuses.append(unit.status)
            for row in unit.rows:
                if row.invocation_index < len(per_inv):
                    per_inv[row.invocation_index].eval_metric_results.append(EvalMetricResult(
                        score=row.score, eval_status=EvalStatus[row.status], **common))
        final = (EvalStatus.FAILED if "FAILED" in statuses or not inference.ok
                 else EvalStatus.PASSED if "PASSED" in statuses else EvalStatus.NOT_EVALUATED)
        cases.append(EvalCaseResult(
            eval_set_file=record.eval_set_id, eval_set_id=record.eval_set_id,
            eval_id=inf.eval_id, final_eval_status=final, overall_eval_metric_results=overall,
            eval_metric_result_per_invocation=per_inv, session_id="",
            user_id=reference.session_input.user_id if reference and reference.session_input
            else "test_user_id"))
    return create_eval_set_result(record.app_name, record.eval_set_id, cases)


def _write_local(directory: Path, name: str, data: bytes) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=HISTORY_SUFFIX)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    final = directory / (name + HISTORY_SUFFIX)
    os.replace(tmp, final)
    return str(final)


def history_writer(store_url: str, agent_dir: str | None) -> Callable[[EvaluationRecord], str]:
    """Writes under ``<agent>/.adk/eval_history/`` for a local store with a known agent dir,
    else under the store's ``adk_history/<app>/`` prefix."""

    def write(record: EvaluationRecord) -> str:
        store = repo.open_store(store_url)
        result = to_eval_set_result(store, record)
        data = result.model_dump_json(indent=2).encode()
        name = result.eval_set_result_name or result.eval_set_result_id
        if agent_dir and "://" not in store.url:
            return _write_local(Path(agent_dir) / ".adk" / "eval_history", name, data)
        ns = f"adk_history/{repo.ref_name(record.app_name)}"
        safe = repo.ref_name(name.replace(" ", "_"))
        store.put_ref(ns, safe + ".evalset_result.json" if len(safe) < 150 else safe, data)
        return f"{store.url}/v1/refs/{ns}/{safe}"

    return write
