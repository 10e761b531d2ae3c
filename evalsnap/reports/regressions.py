"""Regressions and fixes against a baseline, and the gate that fails a run (``--fail-on``).

Pure functions of ``--json`` summaries (:func:`evalsnap.reports.summary.summary`): a unit —
a case × repetition × metric present in both records — *regressed* when it went from
``PASSED`` to ``FAILED``, from complete to incomplete, or (with a tolerance above 0) its
score dropped by more than the tolerance; it is *fixed* when it went the other way
(``FAILED`` → ``PASSED``, incomplete → complete). Units in only one of the two records are
counted as ``not_compared``, never as a regression.
"""

from __future__ import annotations

from typing import Any

from evalsnap import exitcodes

__all__ = ["FAIL_ON", "FailOn", "compare", "gate", "gate_message", "verdict"]

FailOn = exitcodes.FailOn
FAIL_ON: tuple[str, ...] = ("quality", "incomplete", "regression", "never")
#: How many case ids a one-line message names before "…".
FIRST = 3


def _units(result: dict[str, Any]) -> dict[tuple[str, int, str], dict[str, Any]]:
    out = {}
    for case in result["cases"]:
        for name, m in case["metrics"].items():
            if m["status"] != "INFORMATIONAL":
                out[(case["eval_id"], case.get("repetition", 0), name)] = m
    return out


def _change(before: dict[str, Any], after: dict[str, Any], tolerance: float) -> tuple[str, str] | None:
    """``("regression" | "fix", what)`` for one unit, or None if it did not move."""
    if before["complete"] and not after["complete"]:
        return "regression", "complete → incomplete"
    if not before["complete"] and after["complete"]:
        return "fix", "incomplete → complete"
    if before["status"] == "PASSED" and after["status"] == "FAILED":
        return "regression", "PASSED → FAILED"
    if before["status"] == "FAILED" and after["status"] == "PASSED":
        return "fix", "FAILED → PASSED"
    a, b = before.get("score"), after.get("score")
    if tolerance > 0 and a is not None and b is not None and a - b > tolerance:
        return "regression", f"score {a:.3f} → {b:.3f} (drop > {tolerance:g})"
    return None


def compare(result: dict[str, Any], baseline: dict[str, Any], tolerance: float = 0.0) -> dict[str, Any]:
    """Regressions and fixes of ``result`` against ``baseline``, per case and metric."""
    now, before = _units(result), _units(baseline)
    regressions: list[dict[str, Any]] = []
    fixes: list[dict[str, Any]] = []
    for key, after in now.items():
        if key not in before:
            continue
        change = _change(before[key], after, tolerance)
        if change is None:
            continue
        entry = {"eval_id": key[0], "repetition": key[1], "metric": key[2], "change": change[1],
                 "status_before": before[key]["status"], "status_after": after["status"],
                 "score_before": before[key].get("score"), "score_after": after.get("score")}
        (regressions if change[0] == "regression" else fixes).append(entry)
    return {"regressions": regressions, "fixes": fixes,
            "not_compared": len(set(now) ^ set(before))}


def _ids(entries: list[str]) -> str:
    unique = list(dict.fromkeys(entries))
    return ", ".join(unique[:FIRST]) + (f", … (+{len(unique) - FIRST})" if len(unique) > FIRST else "")


def verdict(part: dict[str, Any]) -> dict[str, list[str]]:
    """Case ids (with ``#rep``) of one record that failed on quality, or are incomplete."""
    failed, incomplete = [], []
    for case in part["cases"]:
        label = case["eval_id"] + (f"#{case['repetition']}" if case.get("repetition") else "")
        metrics = list(case["metrics"].values())
        if case.get("inference") == "failure" or any(not m["complete"] for m in metrics):
            incomplete.append(label)
        elif any(m["status"] == "FAILED" for m in metrics):
            failed.append(label)
    return {"failed": failed, "incomplete": incomplete}


def _exit(part: dict[str, Any], fail_on: str) -> int:
    """The command's exit code for one record under ``fail_on`` (:mod:`evalsnap.exitcodes`)."""
    return exitcodes.exit_code(exitcodes.Verdict(
        complete=part["complete"], passed=part["passed"],
        regressed=bool(part.get("regressions")), fail_on=fail_on))  # type: ignore[arg-type]


def gate_message(part: dict[str, Any]) -> str:
    """One line: what failed in one record (counts and the first case ids)."""
    found = verdict(part)
    bits = []
    regressions = part.get("regressions") or []
    if regressions:
        base = (part.get("baseline") or {}).get("run_id")
        names = _ids([r["eval_id"] + " · " + r["metric"] for r in regressions])
        bits.append(f"{len(regressions)} regressed since {base} ({names})")
    if found["failed"]:
        bits.append(f"{len(found['failed'])} failed ({_ids(found['failed'])})")
    if found["incomplete"]:
        bits.append(f"{len(found['incomplete'])} incomplete ({_ids(found['incomplete'])})")
    counts = "; ".join(bits) or "all passed"
    return f"{part['eval_set_id']}: {counts} of {len(part['cases'])} case(s); record {part['record_id']}"


def gate(result: dict[str, Any], fail_on: str) -> tuple[dict[str, Any], str | None]:
    """``result`` with each record's and the run's ``exit_code`` under ``fail_on``, and the
    failure message (None when the run does not fail)."""
    if fail_on not in FAIL_ON:
        from evalsnap.errors import UsageError

        raise UsageError(f"--fail-on {fail_on!r} is unknown; choose one of {list(FAIL_ON)}.")
    parts = list(result["runs"]) if "runs" in result else [result]
    gated = [{**p, "fail_on": fail_on, "exit_code": _exit(p, fail_on)} for p in parts]
    failing = [p for p in gated if p["exit_code"] != exitcodes.ExitCode.OK]
    message = None
    if failing:
        what = {"quality": "NOT PASSED", "incomplete": "INCOMPLETE", "regression": "REGRESSED"}[fail_on]
        message = f"{what} (fail_on={fail_on}): " + " | ".join(gate_message(p) for p in failing)
    if "runs" not in result:
        return gated[0], message
    worst = exitcodes.worst(p["exit_code"] for p in gated)
    return {**result, "fail_on": fail_on, "exit_code": worst, "runs": gated}, message
