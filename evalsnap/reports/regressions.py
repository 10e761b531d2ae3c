"""Regressions and fixes against a baseline, and the gate that fails a run (``--fail-on``).

Pure functions of run summaries (:class:`~evalsnap.reports.summary_model.RecordResult`,
:func:`compare` also of their ``--json`` objects): a unit —
a case × repetition × metric present in both records — *regressed* when it went from
``PASSED`` to ``FAILED``, from complete to incomplete, or (with a tolerance above 0) its
score dropped by more than the tolerance; it is *fixed* when it went the other way
(``FAILED`` → ``PASSED``, incomplete → complete). Units in only one of the two records are
counted as ``not_compared``, never as a regression.

With at least 2 repetitions on both sides, a case × metric is compared as a whole
(:mod:`evalsnap.aggregates`): it regressed when its pass rate fell (or it went
from complete to incomplete), was fixed when its pass rate rose, and each such entry gets
the two-sided p-value of Fisher's exact test on the pass counts
(``scipy.stats.fisher_exact``) and ``significant`` (p below ``alpha``). Only significant
regressions fail a run under ``--fail-on regression``; the others are within noise. With one
repetition on either side the unit rules above stand (``p_value`` None, ``significant``
true). ``metric_deltas`` gives per metric the mean score difference over the shared cases
with a seeded paired bootstrap 95% interval (``scipy.stats.bootstrap``, percentile method).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

from evalsnap import exitcodes
from evalsnap.reports.summary_model import RecordResult, SuiteResult, Summary
from evalsnap.rows import Rows

__all__ = ["FAIL_ON", "FailOn", "compare", "gate", "gate_message", "metric_deltas", "verdict"]

FailOn = exitcodes.FailOn
FAIL_ON: tuple[str, ...] = ("quality", "incomplete", "regression", "never")
#: How many case ids a one-line message names before "…".
FIRST = 3
#: The bootstrap's seed: the same records give the same interval.
SEED = 20261201


def _data(result: RecordResult | dict[str, Any]) -> dict[str, Any]:
    """The data of a summary (the cases and aggregates :func:`compare` reads): rows (a
    summary's, :class:`~evalsnap.rows.Rows`) parsed from the JSON they hold, not serialized
    again model by model."""
    if not isinstance(result, BaseModel):
        return result
    out: dict[str, Any] = {}
    for name in ("cases", "aggregates"):
        value = getattr(result, name)
        out[name] = [json.loads(b) for b in value.json_items()] if isinstance(value, Rows) \
            else [v.model_dump() for v in value]
    return out


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


def _aggs(result: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(a["eval_id"], a["metric"]): a for a in result.get("aggregates") or []}


def _agg_change(b: dict[str, Any], a: dict[str, Any], alpha: float) -> dict[str, Any] | None:
    """One case × metric with repetitions on both sides: its regression or fix, or None."""
    counts = f"{b['passed']}/{b['n']} → {a['passed']}/{a['n']} passed"
    entry = {"eval_id": a["eval_id"], "repetition": None, "metric": a["metric"],
             "status_before": b["status"], "status_after": a["status"],
             "score_before": b["mean_score"], "score_after": a["mean_score"],
             "passed_before": b["passed"], "n_before": b["n"],
             "passed_after": a["passed"], "n_after": a["n"], "p_value": None, "significant": True}
    if bool(b["incomplete"]) != bool(a["incomplete"]):
        worse = bool(a["incomplete"])
        return entry | {"kind": "regression" if worse else "fix",
                        "change": ("complete → incomplete" if worse else "incomplete → complete")
                        + f" ({counts})"}
    if b["incomplete"] or b["pass_rate"] == a["pass_rate"]:
        return None
    from scipy.stats import fisher_exact

    p = float(fisher_exact([[b["passed"], b["failed"]], [a["passed"], a["failed"]]],
                           alternative="two-sided").pvalue)
    significant = p < alpha
    return entry | {"kind": "regression" if a["pass_rate"] < b["pass_rate"] else "fix",
                    "p_value": p, "significant": significant,
                    "change": f"{counts} (Fisher p = {p:.4f}"
                              + ("" if significant else ", within noise") + ")"}


def compare(result: RecordResult | dict[str, Any], baseline: RecordResult | dict[str, Any],
            tolerance: float = 0.0, alpha: float = 0.05) -> dict[str, Any]:
    """Regressions and fixes of ``result`` against ``baseline``, per case and metric (as a
    whole, with Fisher's exact test, where both sides have at least 2 repetitions): the
    fields ``regressions``, ``fixes``, ``not_compared`` and ``metric_deltas`` of a
    :class:`~evalsnap.reports.summary_model.RecordResult`, as data."""
    result, baseline = _data(result), _data(baseline)
    now, before = _units(result), _units(baseline)
    agg_now, agg_before = _aggs(result), _aggs(baseline)
    regressions: list[dict[str, Any]] = []
    fixes: list[dict[str, Any]] = []
    as_whole = {k for k in agg_now.keys() & agg_before.keys()
                if agg_now[k]["n"] >= 2 and agg_before[k]["n"] >= 2}
    for whole in as_whole:
        found = _agg_change(agg_before[whole], agg_now[whole], alpha)
        if found is not None:
            (regressions if found.pop("kind") == "regression" else fixes).append(found)
    for key, after in now.items():
        if key not in before or (key[0], key[2]) in as_whole:
            continue
        change = _change(before[key], after, tolerance)
        if change is None:
            continue
        entry = {"eval_id": key[0], "repetition": key[1], "metric": key[2], "change": change[1],
                 "status_before": before[key]["status"], "status_after": after["status"],
                 "score_before": before[key].get("score"), "score_after": after.get("score"),
                 "p_value": None, "significant": True}
        (regressions if change[0] == "regression" else fixes).append(entry)
    return {"regressions": regressions, "fixes": fixes,
            "not_compared": len(set(now) ^ set(before)),
            "metric_deltas": metric_deltas(list(agg_now.values()), list(agg_before.values()))}


def metric_deltas(now: list[dict[str, Any]], before: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per metric: the mean of the per-case mean-score differences (now − before) over the
    cases both sides scored, with a seeded paired bootstrap 95% interval (2 cases or more)."""
    import numpy as np

    old = {(a["eval_id"], a["metric"]): a["mean_score"] for a in before}
    pairs: dict[str, list[tuple[float, float]]] = {}
    for a in now:
        b = old.get((a["eval_id"], a["metric"]))
        if b is not None and a["mean_score"] is not None:
            pairs.setdefault(a["metric"], []).append((b, a["mean_score"]))
    out = []
    for metric, values in pairs.items():
        x, y = np.array([v[0] for v in values]), np.array([v[1] for v in values])
        ci = None
        d = y - x
        if len(values) >= 2 and bool(np.all(d == d[0])):
            # every resample of identical differences has the same mean: the interval is that
            # mean, as the bootstrap would find it (a rerun that changed nothing: no 9,999
            # resamples per metric)
            ci = [float(d.mean())] * 2
        elif len(values) >= 2:
            from scipy.stats import bootstrap

            res = bootstrap((x, y), lambda u, v, axis=-1: np.mean(v - u, axis=axis), paired=True,
                            vectorized=True, n_resamples=9999, confidence_level=0.95,
                            method="percentile", rng=np.random.default_rng(SEED))
            ci = [float(res.confidence_interval.low), float(res.confidence_interval.high)]
        out.append({"metric": metric, "cases": len(values),
                    "mean_before": float(x.mean()), "mean_after": float(y.mean()),
                    "mean_delta": float((y - x).mean()), "ci95": ci,
                    "excludes_zero": None if ci is None else bool(ci[0] > 0 or ci[1] < 0)})
    return out


def _ids(entries: list[str]) -> str:
    unique = list(dict.fromkeys(entries))
    return ", ".join(unique[:FIRST]) + (f", … (+{len(unique) - FIRST})" if len(unique) > FIRST else "")


def verdict(part: RecordResult) -> dict[str, list[str]]:
    """Case ids of one record that failed on quality (by the repetition gate), or are
    incomplete."""
    incomplete = dict.fromkeys(c.eval_id for c in part.cases if c.inference == "failure")
    incomplete.update(dict.fromkeys(a.eval_id for a in part.aggregates
                                    if a.status == "NOT_EVALUATED"))
    # a dict, not a list: a case's membership is looked up once per aggregate (210,000 at
    # 30,000 cases, against as many incomplete cases)
    failed = [a.eval_id for a in part.aggregates
              if a.status == "FAILED" and a.eval_id not in incomplete]
    return {"failed": list(dict.fromkeys(failed)), "incomplete": list(incomplete)}


def _exit(part: RecordResult, fail_on: str) -> int:
    """The command's exit code for one record under ``fail_on`` (:mod:`evalsnap.exitcodes`)."""
    return exitcodes.exit_code(exitcodes.Verdict(
        complete=part.complete, passed=part.passed,
        regressed=bool(_significant(part)), fail_on=fail_on))  # type: ignore[arg-type]


def _significant(part: RecordResult) -> list[Any]:
    """The regressions that count: every one but those within noise."""
    return [r for r in part.regressions if r.significant]


def gate_message(part: RecordResult) -> str:
    """One line: what failed in one record (counts and the first case ids)."""
    found = verdict(part)
    bits = []
    regressions = _significant(part)
    noise = len(part.regressions) - len(regressions)
    if regressions:
        base = part.baseline.run_id if part.baseline is not None else None
        names = _ids([r.eval_id + " · " + r.metric for r in regressions])
        bits.append(f"{len(regressions)} regressed since {base} ({names})")
    if noise:
        bits.append(f"{noise} change(s) within noise")
    if found["failed"]:
        bits.append(f"{len(found['failed'])} failed ({_ids(found['failed'])})")
    if found["incomplete"]:
        bits.append(f"{len(found['incomplete'])} incomplete ({_ids(found['incomplete'])})")
    counts = "; ".join(bits) or "all passed"
    total = len({c.eval_id for c in part.cases})
    return f"{part.eval_set_id}: {counts} of {total} case(s); record {part.record_id}"


def gate(result: Summary, fail_on: str) -> tuple[Summary, str | None]:
    """``result`` with each record's and the run's ``exit_code`` under ``fail_on``, and the
    failure message (None when the run does not fail)."""
    if fail_on not in FAIL_ON:
        from evalsnap.errors import UsageError

        raise UsageError(f"--fail-on {fail_on!r} is unknown; choose one of {list(FAIL_ON)}.")
    parts = list(result.runs) if isinstance(result, SuiteResult) else [result]
    gated = [p.model_copy(update={"fail_on": fail_on, "exit_code": int(_exit(p, fail_on))})
             for p in parts]
    failing = [p for p in gated if p.exit_code != exitcodes.ExitCode.OK]
    message = None
    if failing:
        what = {"quality": "NOT PASSED", "incomplete": "INCOMPLETE", "regression": "REGRESSED"}[fail_on]
        message = f"{what} (fail_on={fail_on}): " + " | ".join(gate_message(p) for p in failing)
    if not isinstance(result, SuiteResult):
        return gated[0], message
    worst = int(exitcodes.worst(p.exit_code for p in gated))
    return result.model_copy(update={"fail_on": fail_on, "exit_code": worst, "runs": gated}), message
