"""Prefect artifacts of a run: a score table, a markdown summary, and live progress.

The renderers (:func:`score_rows`, :func:`summary_markdown`, :func:`artifact_key`) are
pure functions of the run summary (:class:`~evalsnap.reports.summary_model.RecordResult`,
or its ``--json`` object) and are tested
without Prefect. :func:`publish_artifacts` and :class:`RunProgress` call Prefect's
artifact API; they never fail a run: an artifact that cannot be written is a warning.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from typing import Any

from evalsnap.reports.summary_model import RecordResult, as_record

logger = logging.getLogger(__name__)


def artifact_key(eval_set_id: str, what: str) -> str:
    """``evalsnap-<eval set>-<what>``: Prefect keys allow lowercase, digits and dashes.

    One key per eval set makes the UI show each run's artifact as a new version.
    """
    slug = re.sub(r"[^a-z0-9]+", "-", eval_set_id.lower()).strip("-") or "eval"
    return f"evalsnap-{slug}-{what}"


#: Rows of the scores table artifact at most: a run of 10,000 cases × 7 metrics has 70,000,
#: more than the Prefect UI shows usefully (sending them took the temporary API's peak to
#: 385-417 MB, 234 MB without them); beyond it, the
#: rows that did not pass come first and the artifact's description says where every row is.
TABLE_ROWS = 5000


def score_rows(result: RecordResult | dict[str, Any]) -> list[dict[str, Any]]:
    """One row per case × repetition × metric (a failed inference is one row of its own)."""
    return list(_score_rows(as_record(result)))


def _score_rows(result: RecordResult) -> Iterator[dict[str, Any]]:
    for case in result.cases:
        base = {"case": case.eval_id, "repetition": case.repetition,
                "inference": case.inference or "success"}
        if not case.metrics:
            yield {**base, "metric": "", "status": "", "score": None, "threshold": None,
                   "reused": False, "why": ""}
        for name, m in case.metrics.items():
            yield {**base, "metric": name, "status": m.status, "score": m.score,
                   "threshold": m.threshold, "reused": m.reused, "why": m.reason or m.why or ""}


def table_rows(result: RecordResult, limit: int = TABLE_ROWS) -> tuple[list[dict[str, Any]], int]:
    """The scores table's rows (:func:`score_rows`, at most ``limit``: those that did not
    pass first, each in the record's order, when there are more) and how many rows there are."""
    total = sum(max(len(c.metrics), 1) for c in result.cases)
    if total <= limit:
        return list(_score_rows(result)), total
    rows = [r for r in _score_rows(result) if r["status"] not in _PASSING][:limit]
    if len(rows) < limit:
        rows += [r for r in _score_rows(result) if r["status"] in _PASSING][:limit - len(rows)]
    return rows, total


_PASSING = ("PASSED", "INFORMATIONAL")


def case_verdicts(result: RecordResult) -> dict[str, int]:
    """Cases (× repetition) that passed, failed on quality, or are incomplete."""
    counts = {"passed": 0, "failed": 0, "incomplete": 0}
    for case in result.cases:
        metrics = list(case.metrics.values())
        if case.inference == "failure" or any(not m.complete for m in metrics):
            counts["incomplete"] += 1
        elif all(m.status in ("PASSED", "INFORMATIONAL") for m in metrics):
            counts["passed"] += 1
        else:
            counts["failed"] += 1
    return counts


def efficiency_rows(result: RecordResult | dict[str, Any]) -> list[dict[str, Any]]:
    """Per ADK efficiency metric: mean, min and max over the cases that have a value."""
    values: dict[str, list[float]] = {}
    for case in as_record(result).cases:
        for name, metric in case.efficiency.items():
            found = values.setdefault(name, [])
            if metric.value is not None:
                found.append(metric.value)
    return [{"metric": name, "cases": len(vs),
             "mean": sum(vs) / len(vs) if vs else None,
             "min": min(vs) if vs else None, "max": max(vs) if vs else None}
            for name, vs in values.items()]


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:,.3f}".rstrip("0").rstrip(".")


def _tokens_lines(result: RecordResult) -> list[str]:
    """Rows of tokens and cost for the summary table, then ADK's efficiency metrics."""
    from evalsnap.reports.summary import cost_text, tokens_text

    lines = [f"| agent tokens spent now | {tokens_text(result.agent_tokens)} |",
             f"| judge tokens spent now | {tokens_text(result.judge_tokens)} |",
             "| agent tokens of the inference scored | "
             f"{tokens_text(result.inference_tokens)} |",
             f"| estimated cost | {cost_text(result)} |"]
    rows = efficiency_rows(result)
    if rows:
        lines += ["", "Efficiency (ADK's informational metrics; per case, the per-turn average):",
                  "", "| metric | mean | min | max | cases |", "| --- | ---: | ---: | ---: | ---: |"]
        lines += [f"| {r['metric']} | {_num(r['mean'])} | {_num(r['min'])} | {_num(r['max'])} "
                  f"| {r['cases']} |" for r in rows]
    return lines


def _store_lines(result: RecordResult) -> list[str]:
    """What the run cost the store (a bucket bills per request), by kind."""
    counts = result.store_requests
    if "store_requests" not in result.model_fields_set:
        return []
    kinds = ", ".join(f"{counts.get(k, 0)} {k}" for k in ("list", "head", "get", "put", "delete"))
    return [f"| store requests | {counts.get('total', 0)} ({kinds}) |"]


def summary_markdown(result: RecordResult | dict[str, Any], store_url: str | None = None) -> str:
    """The run at a glance: verdict, case counts, reuse, model calls, ids to look up."""
    result = as_record(result)
    verdict = ("PASSED" if result.passed else "NOT PASSED") + \
        ("" if result.complete else " (INCOMPLETE)")
    counts = case_verdicts(result)
    store = f" --store {store_url}" if store_url else ""
    lines = [
        f"# {result.eval_set_id} — {result.kind} `{result.run_id}`: **{verdict}**",
        "",
        "| cases passed | cases failed | cases incomplete |",
        "| ---: | ---: | ---: |",
        f"| {counts['passed']} | {counts['failed']} | {counts['incomplete']} |",
        "",
        "| | |",
        "| --- | ---: |",
        f"| units scored now | {result.scored_units} |",
        f"| units reused | {result.reused_units} |",
        f"| agent model calls | {result.agent_calls} |",
        f"| judge model calls | {result.judge_calls} |",
        f"| judge samples answered from the ledger | {result.reused_judge_samples} |",
        *_store_lines(result),
        *_tokens_lines(result),
        "",
        f"* record: `{result.record_id}`",
        f"* snapshot: `{result.snapshot_id}`",
    ]
    if result.parent_record:
        lines.append(f"* previous record: `{result.parent_record}`")
    if result.skipped_cases:
        lines.append(f"* cases no longer in the eval set: {', '.join(result.skipped_cases)}")
    if result.uninferred_cases:
        lines.append(f"* cases without inference: {', '.join(result.uninferred_cases)}")
    lines += ["", f"Look it up: `evalsnap show {result.run_id}{store} --json`"]
    failed = sorted({c.eval_id for c in result.cases if c.inference == "failure"})
    if failed:
        lines += ["", "Failed inference: " + ", ".join(failed)]
    lines += _named_lines(result)
    return "\n".join(lines) + "\n"


def _named_lines(result: RecordResult) -> list[str]:
    """What the record covers, the cases that failed or are incomplete, and the
    regressions and fixes against its baseline, by name."""
    from evalsnap.reports.regressions import verdict
    from evalsnap.reports.summary import comparison_lines, subset_text

    lines = ["", f"Covers: {subset_text(result).strip(' ()') or 'the whole eval set and config'}"]
    found = verdict(result)
    for what in ("failed", "incomplete"):
        if found[what]:
            lines.append(f"* cases {what}: {', '.join(found[what])}")
    comparison = comparison_lines(result)
    if comparison:
        lines += ["", comparison[0], ""] + [f"* {line.strip()}" for line in comparison[1:]]
    return lines


def publish_artifacts(result: RecordResult, store_url: str | None = None) -> dict[str, Any]:
    """Creates the table and markdown artifacts; returns their ids (empty on failure)."""
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    ids: dict[str, Any] = {}
    report = result.report_url  # publish wrote the page and made its link
    try:
        rows, total = table_rows(result)
        shown = "" if len(rows) == total else (
            f" ({len(rows)} of {total} rows, those not passed first; every row: `evalsnap show "
            f"{result.run_id} --json`)")
        ids["table"] = create_table_artifact(
            rows, key=artifact_key(result.eval_set_id, "scores"),
            description=f"Scores per case and metric, {result.kind} {result.run_id}{shown}")
        del rows
        ids["summary"] = create_markdown_artifact(
            summary_markdown(result, store_url)
            + (f"\nHTML report: [{report}]({report})" + (
                f" (a signed link, valid until {result.report_url_expires})"
                if result.report_url_expires else "") + "\n" if report else ""),
            key=artifact_key(result.eval_set_id, "summary"),
            description=f"Summary of {result.kind} {result.run_id}")
    except Exception as exc:  # noqa: BLE001 - the record is published; artifacts are a view
        logger.warning("could not create Prefect artifacts: %s", exc)
    if report:
        try:
            from prefect.artifacts import create_link_artifact

            ids["report"] = create_link_artifact(
                report, link_text=f"HTML report of {result.eval_set_id} {result.run_id}",
                key=artifact_key(result.eval_set_id, "report"),
                description=f"Report of {result.kind} {result.run_id}: trend, failing "
                            "cases, judge ledger")
        except Exception as exc:  # noqa: BLE001
            logger.warning("could not create the report link artifact: %s", exc)
    return ids


class RunProgress:
    """A progress artifact of a flow run: created once, updated as futures complete.

    The API calls are made by a thread of its own (with the flow's context), the newest
    percentage only: a run waits for none of them (each is one to a few tenths of a second
    on a temporary API, and a no-op rerun is over in seconds). :meth:`close` (or leaving
    its ``with``) sends what is left: the finished run's 100 %."""

    #: One API call per completed task would cost more than the task at scale.
    MIN_INTERVAL_S = 1.0
    #: How long :meth:`close` waits for the last update (an API that stopped answering).
    CLOSE_TIMEOUT_S = 10.0

    def __init__(self, total: int, description: str) -> None:
        import contextvars
        import threading

        self.total = max(total, 1)
        self.done = 0
        self.artifact_id: Any = None
        self._description = description
        self._last_push = 0.0
        self._wanted: float | None = None  # the newest percentage not sent yet
        self._closing = False
        self._cond = threading.Condition()
        context = contextvars.copy_context()  # the flow run's (its client, its settings)
        self._thread = threading.Thread(target=context.run, args=(self._send_all,),
                                        name="evalsnap-progress", daemon=True)
        self._thread.start()

    def __enter__(self) -> RunProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def percent(self) -> float:
        return round(100.0 * min(self.done, self.total) / self.total, 1)

    def grow(self, extra: int) -> None:
        """More work became known (e.g. metrics after freeze)."""
        self.total += extra
        self._push()

    def advance(self, n: int = 1) -> None:
        self.done += n
        self._push()

    def _push(self) -> None:
        import time

        now = time.monotonic()
        final = self.done >= self.total
        if not final and now - self._last_push < self.MIN_INTERVAL_S:
            return
        self._last_push = now
        with self._cond:
            self._wanted = self.percent
            self._cond.notify()

    def close(self) -> None:
        """Sends the last percentage, if not sent yet (waits at most
        :data:`CLOSE_TIMEOUT_S`), and stops the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(self.CLOSE_TIMEOUT_S)

    def _send_all(self) -> None:
        try:
            from prefect.artifacts import create_progress_artifact

            self.artifact_id = create_progress_artifact(0.0, description=self._description)
        except Exception as exc:  # noqa: BLE001 - progress is cosmetic
            logger.warning("could not create the progress artifact: %s", exc)
            return
        while True:
            with self._cond:
                while self._wanted is None and not self._closing:
                    self._cond.wait()
                wanted, self._wanted = self._wanted, None
                if wanted is None:  # closing, nothing left to send
                    return
            try:
                from prefect.artifacts import update_progress_artifact

                update_progress_artifact(self.artifact_id, wanted)
            except Exception as exc:  # noqa: BLE001
                logger.warning("could not update the progress artifact: %s", exc)
