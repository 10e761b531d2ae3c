"""ADK interop, both ways.

Export: each record also becomes an ``EvalSetResult`` file ``adk web`` can show.
Import: existing ADK ``*.evalset_result.json`` files become records of kind ``import``
(no snapshot; inference records whose session states are ``None``). Every file is read and
validated before any is imported: one bad file imports nothing.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Iterator
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
from pydantic import ValidationError

from evalsnap import startup
from evalsnap.errors import CorruptRecordError, InputFileError
from evalsnap.fingerprint import fingerprint, unit_fingerprint
from evalsnap.records import (
    EvaluationRecord,
    InferenceRecord,
    InferenceRef,
    ManifestEntry,
    RunManifest,
    RunSummary,
    ScoreUnit,
    UnitRef,
    UnitRow,
    repo,
)
from evalsnap.records._base import first_problem, parse_stored
from evalsnap.records.snapshot import cases_by_key

HISTORY_SUFFIX = ".evalset_result.json"


def eval_set_result_json(store: Any, record: EvaluationRecord) -> tuple[str, bytes]:
    """(result name, the JSON of ADK's ``EvalSetResult`` for a record: the first repetition
    of each case), built one case at a time (:func:`eval_set_result_parts`)."""
    name, parts = eval_set_result_parts(store, record)
    return name, b"".join(parts)


def eval_set_result_parts(store: Any, record: EvaluationRecord) -> tuple[str, Iterator[bytes]]:
    """(result name, the JSON of ADK's ``EvalSetResult`` for a record as consecutive parts).

    Only one case's ADK models and JSON exist at once (with its whole conversation, twice):
    the whole file of a 10,000-case run is 136 MB, and as one string, then bytes, it took
    three times that while the run published.
    """
    head = create_eval_set_result(record.app_name, record.eval_set_id, [])
    fields = head.model_dump(mode="json")
    fields.pop("eval_case_results")

    def parts() -> Iterator[bytes]:
        yield (json.dumps(fields, ensure_ascii=False)[:-1] + ', "eval_case_results": [').encode()
        for i, case in enumerate(iter_eval_case_results(store, record)):
            yield (b"," if i else b"") + case.model_dump_json().encode()
            startup.give_back_now_and_then()  # the cases made before (their models, JSON)
        yield b"]}"

    return head.eval_set_result_name or head.eval_set_result_id, parts()


def iter_eval_case_results(store: Any, record: EvaluationRecord) -> Iterator[EvalCaseResult]:
    """ADK's per-case results of a record, one case at a time."""
    snapshot = repo.get_snapshot(store, record.snapshot_oid) if record.snapshot_oid else None
    frozen = cases_by_key(snapshot)
    units_of = record.units_by_case()  # each case's units read when it is written
    for inf in record.inference:
        if inf.repetition != 0:
            continue
        units = units_of.get((inf.eval_id, 0), [])
        inference = repo.get_inference(store, inf.inference_oid)
        fc = frozen.first((inf.eval_id, 0))
        reference = EvalCase.model_validate(fc.reference) if fc else None
        expected = reference.conversation if reference else None
        per_inv = [EvalMetricResultPerInvocation(
            actual_invocation=a, expected_invocation=expected[i] if expected and i < len(
                expected) else None, eval_metric_results=[])
            for i, a in enumerate(inference.invocations)]
        overall = []
        statuses = []
        for ref in units:
            unit = repo.get_unit_shared(store, ref.unit_oid)
            rule = snapshot.rule(ref.metric_name) if snapshot else None
            common: dict[str, Any] = dict(metric_name=unit.metric_name,
                                          threshold=unit.threshold,
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
        yield EvalCaseResult(
            eval_set_file=record.eval_set_id, eval_set_id=record.eval_set_id,
            eval_id=inf.eval_id, final_eval_status=final, overall_eval_metric_results=overall,
            eval_metric_result_per_invocation=per_inv, session_id="",
            user_id=reference.session_input.user_id if reference and reference.session_input
            else "test_user_id")


def _write_local(directory: Path, name: str, parts: Iterable[bytes]) -> str:
    """One file, written whole (temporary file, then rename); a failure leaves nothing."""
    directory.mkdir(parents=True, exist_ok=True)
    # an eval set id may hold anything JSON allows; a file name may not (NUL, "/")
    final = directory / (_UNSAFE_IN_FILE_NAME.sub("_", name) + HISTORY_SUFFIX)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=HISTORY_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as fh:
            for part in parts:
                fh.write(part)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return str(final)


_UNSAFE_IN_FILE_NAME = re.compile(r"[\x00-\x1f/\\]")


def history_writer(store: Any, agent_dir: str | None) -> Callable[[EvaluationRecord], str]:
    """Writes under ``<agent>/.adk/eval_history/`` for a local store with a known agent dir,
    else under the store's ``adk_history/<app>/`` prefix."""

    def write(record: EvaluationRecord) -> str:
        name, parts = eval_set_result_parts(store, record)
        if agent_dir and "://" not in store.url:
            return _write_local(Path(agent_dir) / ".adk" / "eval_history", name, parts)
        data = b"".join(parts)
        ns = f"adk_history/{repo.ref_name(record.app_name)}"
        safe = repo.ref_name(name.replace(" ", "_"))
        ref = safe + ".evalset_result.json" if len(safe) < 150 else safe
        store.put_ref(ns, ref, data)
        return f"{store.url}/v1/refs/{ns}/{ref}"

    return write


# ---- import ----------------------------------------------------------------------------------

def history_files(directory: str | Path) -> list[Path]:
    """ADK result files under ``directory`` (an eval_history dir, or an agent dir holding
    ``.adk/eval_history``), sorted by name."""
    root = Path(directory)
    if not root.is_dir():
        raise InputFileError(f"{root} is not a directory; give an agent's .adk/eval_history "
                             "directory (or the agent directory itself).")
    nested = root / ".adk" / "eval_history"
    if nested.is_dir() and not any(root.glob("*" + HISTORY_SUFFIX)):
        root = nested
    return sorted(p for p in root.glob("*" + HISTORY_SUFFIX) if not p.name.startswith("."))


def _app_name_of(result: EvalSetResult, path: Path) -> str:
    """ADK names results ``<app>_<eval set>_<timestamp>``; else the agent dir's name."""
    marker = f"_{result.eval_set_id}_"
    if marker in result.eval_set_result_id:
        return result.eval_set_result_id.split(marker, 1)[0]
    parts = path.resolve().parts
    if len(parts) >= 4 and parts[-3:-1] == (".adk", "eval_history"):
        return parts[-4]
    return "imported"


def _status_name(value: Any) -> str:
    return value.name if isinstance(value, EvalStatus) else str(value or "NOT_EVALUATED")


def _import_case(store: Any, case: EvalCaseResult, repetition: int, result: EvalSetResult,
                 app_name: str, run_id: str, created: str, source: str,
                 ) -> tuple[InferenceRef, list[UnitRef]]:
    invocations = [p.actual_invocation for p in case.eval_metric_result_per_invocation]
    identity = {"source": "adk-eval-history", "eval_set_result_id": result.eval_set_result_id,
                "eval_id": case.eval_id, "repetition": repetition}
    inference = InferenceRecord(
        inference_fingerprint=fingerprint("imported-inference", identity),
        eval_set_id=case.eval_set_id or result.eval_set_id, eval_id=case.eval_id,
        repetition=repetition, app_name=app_name, agent_name=app_name, adk_version="unknown",
        status="success", invocations=invocations, initial_session_state=None,
        final_session_state=None, run_id=run_id, created_at=created)
    inf_oid = repo.put(store, inference)
    case_fp = fingerprint("imported-case", {**identity, "inference": inference.content()})
    unit_refs = []
    for overall in case.overall_eval_metric_results:
        name = overall.metric_name
        criterion = overall.criterion.model_dump(mode="json") if overall.criterion else None
        threshold = overall.threshold if overall.threshold is not None else (
            (criterion or {}).get("threshold") or 0.0)
        rule_fp = fingerprint("imported-rule", {"metric": name, "criterion": criterion,
                                                "threshold": threshold})
        rows = []
        for index, per in enumerate(case.eval_metric_result_per_invocation):
            for m in per.eval_metric_results:
                if m.metric_name == name:
                    rows.append(UnitRow(invocation_index=index, score=m.score,
                                        status=_status_name(m.eval_status)))  # type: ignore[arg-type]
        scored = [r.score for r in rows if r.score is not None]
        status = _status_name(overall.eval_status)
        unit = ScoreUnit(
            unit_fingerprint=unit_fingerprint(case_fp, rule_fp), case_fingerprint=case_fp,
            rule_fingerprint=rule_fp, eval_id=case.eval_id, repetition=repetition,
            metric_name=name, threshold=float(threshold), score=overall.score,
            metric_status=status, gate_score=sum(scored) / len(scored) if scored else None,  # type: ignore[arg-type]
            status=status, rows=rows, complete=status != "NOT_EVALUATED",  # type: ignore[arg-type]
            reason=f"imported from ADK eval history {source}", run_id=run_id,
            created_at=created)
        unit_refs.append(UnitRef(
            eval_id=case.eval_id, repetition=repetition, metric_name=name,
            unit_oid=repo.put(store, unit), unit_fingerprint=unit.unit_fingerprint,
            case_fingerprint=case_fp, rule_fingerprint=rule_fp, reused=False, why="imported"))
    ref = InferenceRef(eval_id=case.eval_id, repetition=repetition, inference_oid=inf_oid,
                       inference_fingerprint=inference.inference_fingerprint, status="success",
                       reused=False)
    return ref, unit_refs


def import_result(store: Any, result: EvalSetResult, path: Path,
                  app_name: str | None = None) -> tuple[str, EvaluationRecord]:
    """One ADK ``EvalSetResult`` → inference records, units, a record and a manifest (last).

    Deterministic: importing the same file again writes the same objects and manifest.
    Imported work is never indexed for reuse (no agent or evaluator identity is known).
    """
    app = app_name or _app_name_of(result, path)
    run_id = repo.ref_name("import-" + result.eval_set_result_id.replace(" ", "_"))
    created = (dt.datetime.fromtimestamp(result.creation_timestamp, dt.UTC)
               .isoformat(timespec="microseconds").replace("+00:00", "Z"))
    seen: dict[str, int] = {}
    inf_refs, unit_refs = [], []
    for case in result.eval_case_results:
        repetition = seen.get(case.eval_id, 0)  # ADK repeats a case once per num_runs
        seen[case.eval_id] = repetition + 1
        inf, units = _import_case(store, case, repetition, result, app, run_id, created,
                                  path.name)
        inf_refs.append(inf)
        unit_refs.extend(units)
    statuses = [repo.get(store, ScoreUnit, u.unit_oid).status for u in unit_refs]
    cases_ok = all(_status_name(c.final_eval_status) == "PASSED"
                   for c in result.eval_case_results)
    complete = "NOT_EVALUATED" not in statuses
    summary = RunSummary(
        complete=complete,
        passed=complete and cases_ok and all(s in ("PASSED", "INFORMATIONAL") for s in statuses),
        agent_calls=0, judge_calls=0, reused_units=0, scored_units=len(unit_refs))
    record = EvaluationRecord(
        run_id=run_id, kind="import", eval_set_id=result.eval_set_id, app_name=app,
        snapshot_oid=None, inference=inf_refs, units=unit_refs, summary=summary,
        adk_history_path=str(path), imported_from=result.eval_set_result_id,
        created_at=created)
    record_oid = repo.put(store, record)
    objects = [ManifestEntry(kind="record", oid=record_oid)]
    objects += [ManifestEntry(kind="inference", oid=i.inference_oid) for i in inf_refs]
    objects += [ManifestEntry(kind="unit", oid=u.unit_oid) for u in unit_refs]
    repo.write_manifest(store, RunManifest(
        run_id=run_id, eval_set_id=result.eval_set_id, app_name=app, kind="import",
        record_oid=record_oid, snapshot_oid=None, objects=objects, passed=summary.passed,
        complete=summary.complete, created_at=created))
    return record_oid, record


def read_history_file(path: Path) -> EvalSetResult:
    """One ADK result file, parsed and validated as ADK reads it (its old double-encoded
    files too: the JSON of a JSON string); ``CorruptRecordError`` naming the file if it is
    not one, ``InputFileError`` if it cannot be read."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputFileError(f"{path} cannot be read ({exc}); check that it exists and that "
                             "this user may read it.") from exc
    advice = "fix or remove the file, then import again (nothing was imported)"
    raw = parse_stored(data, what=str(path), advice=advice)
    if isinstance(raw, str):
        raw = parse_stored(raw.encode(), what=str(path), advice=advice)
    try:
        return EvalSetResult.model_validate(raw)
    except ValidationError as exc:
        raise CorruptRecordError(
            f"{path} is not an ADK EvalSetResult file ({first_problem(exc)}); {advice}.") from exc


def import_history(store: Any, directory: str | Path,
                   app_name: str | None = None) -> list[dict[str, Any]]:
    """Imports every ADK result file in ``directory``; returns one summary per file.

    Every file is validated first, so one bad file imports nothing. Each is read again to
    import it, rather than held: a year of nightly results does not fit in memory parsed.
    """
    files = history_files(directory)
    if not files:
        raise InputFileError(f"no *{HISTORY_SUFFIX} files in {directory}.")
    for path in files:
        read_history_file(path)
    return [_import_file(store, path, app_name) for path in files]


def _import_file(store: Any, path: Path, app_name: str | None) -> dict[str, Any]:
    oid, record = import_result(store, read_history_file(path), path, app_name)
    return {"file": str(path), "run_id": record.run_id, "record_id": oid,
            "eval_set_id": record.eval_set_id, "app_name": record.app_name,
            "cases": len(record.inference), "units": len(record.units),
            "passed": record.summary.passed}
