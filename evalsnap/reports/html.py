"""``report RECORD --html OUT``: one self-contained HTML page of a record.

The page needs nothing but itself: inline CSS, inline SVG charts, no script, and a
Content-Security-Policy that forbids every fetch, so a page that tried to load anything
would say so in the browser's console. Every string read from the store is escaped
(:func:`html.escape`), so a crafted eval case cannot inject markup. Content: the run's
header, pass rate and mean score per metric with their trend over the last runs of the
eval set (:mod:`evalsnap.reports.history`), then every case — regressed and failing ones
first — with its conversation, its units, their per-invocation rows and the judge ledger
entries, expandable (``<details>``) under their unit.

Every run publishes its page into the store beside its record (:func:`store_report`) at
``v1/refs/reports/<record hex>.html`` (:func:`report_name`).
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from evalsnap.errors import EvalsnapError
from evalsnap.records import EvaluationRecord, repo
from evalsnap.reports.history import PASSING, REPORTS, history, metric_names, run_point, save_point
from evalsnap.reports.show import full_record

#: Runs of the eval set the trend shows, this one included.
TREND_RUNS = 10

_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;max-width:1200px;
padding:16px 24px;color:#1f2328;background:#fff}
h1{font-size:22px;margin:4px 0 12px}h2{font-size:17px;margin:22px 0 8px;border-bottom:1px solid #d0d7de}
code,pre{font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,monospace}
pre{white-space:pre-wrap;word-break:break-word;background:#f6f8fa;padding:8px;margin:4px 0;
max-height:420px;overflow:auto}
dl.facts{display:grid;grid-template-columns:max-content 1fr max-content 1fr;gap:2px 14px;margin:0}
dl.facts dt{color:#59636e}dl.facts dd{margin:0;word-break:break-all}
table{border-collapse:collapse;width:100%;margin:4px 0}
th,td{border-bottom:1px solid #e5e7eb;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f6f8fa;font-weight:600}td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
.badge{display:inline-block;border-radius:10px;padding:0 8px;font-size:12px;font-weight:600;
color:#fff;background:#6e7781}
.PASSED,.passed{background:#1a7f37}.FAILED,.failed{background:#cf222e}
.NOT_EVALUATED,.incomplete{background:#9a6700}.INFORMATIONAL{background:#0969da}
.regressed{background:#8250df}.fixed{background:#0969da}
details.case{border:1px solid #d0d7de;border-radius:6px;margin:6px 0;padding:4px 10px}
details.case>summary{cursor:pointer;font-weight:600}
details details{margin:2px 0 2px 14px}summary{cursor:pointer}
.muted{color:#59636e}.counts span{margin-right:14px}
svg.trend{vertical-align:middle}svg.trend .band{fill:#f6f8fa}svg.trend polyline{fill:none;
stroke:#0969da;stroke-width:1.5}svg.trend circle{fill:#0969da}svg.trend circle.now{fill:#cf222e}
"""


def e(value: Any) -> str:
    """Text for the page: every value from the store goes through here."""
    return html.escape("" if value is None else str(value), quote=True)


def num(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


def report_name(record_oid: str) -> str:
    """The page's ref name in :data:`REPORTS`: ``<record hex>.html``."""
    return f"{repo.hexof(record_oid)}.html"


def report_url(store: Any, record_oid: str) -> str:
    """Where the stored page of a record is: a ``file://`` URL for a local store."""
    rel = f"v1/refs/{REPORTS}/{report_name(record_oid)}"
    if "://" not in store.url:
        return (Path(store.url) / rel).as_uri()
    return f"{store.url.rstrip('/')}/{rel}"


def store_report(store: Any, record_oid: str, record: EvaluationRecord) -> str:
    """Writes the history point and the page of a record beside it (``v1/refs/reports/
    <record hex>.json`` and ``.html``); returns the page's URL."""
    point = run_point(store, record_oid, record)
    save_point(store, point)
    page = render(store, record_oid, record, current=point)
    store.put_ref(REPORTS, report_name(record_oid), page.encode())
    return report_url(store, record_oid)


def changes(store: Any, record_oid: str, record: EvaluationRecord,
            baseline_oid: str | None) -> tuple[dict[tuple, str], str | None]:
    """``regressed`` or ``fixed`` per (eval_id, repetition, metric) against the baseline
    record, as :func:`evalsnap.reports.regressions.compare` finds them (with the record's
    own tolerance when it was compared with that baseline); and the baseline's run id."""
    if baseline_oid is None:
        return {}, None
    from evalsnap.reports.regressions import compare
    from evalsnap.reports.summary import summary

    base = repo.get(store, EvaluationRecord, baseline_oid)
    own = record.baseline
    tolerance = own.tolerance if own is not None and own.record_oid == baseline_oid else 0.0
    found = compare(summary(store, record_oid, record), summary(store, baseline_oid, base),
                    tolerance)
    out = {(r["eval_id"], r["repetition"], r["metric"]): "regressed" for r in found["regressions"]}
    out.update({(r["eval_id"], r["repetition"], r["metric"]): "fixed" for r in found["fixes"]})
    return out, base.run_id


def sparkline(metric: str, points: list[dict[str, Any]], width: int = 170, height: int = 34) -> str:
    """An inline SVG of a metric's pass rate over ``points`` (0-100 %, this run in red)."""
    values = [(p, p["metrics"][metric]) for p in points if metric in p["metrics"]]
    pad, inner_w, inner_h = 4, width - 8, height - 8
    step = inner_w / max(len(values) - 1, 1)
    coords, dots = [], []
    for i, (p, s) in enumerate(values):
        rate = s["pass_rate"] or 0.0
        x, y = pad + (i * step if len(values) > 1 else inner_w / 2), pad + (1 - rate) * inner_h
        coords.append(f"{x:.1f},{y:.1f}")
        now = ' class="now"' if i == len(values) - 1 else ""
        dots.append(f'<circle{now} cx="{x:.1f}" cy="{y:.1f}" r="2.5" data-run="{e(p["run_id"])}" '
                    f'data-pass-rate="{s["pass_rate"]}"><title>{e(p["created_at"][:16])} '
                    f'{e(p["run_id"])}: {pct(s["pass_rate"])} ({s["passed"]}/{s["units"]}), '
                    f'mean {num(s["mean_score"])}</title></circle>')
    line = f'<polyline points="{" ".join(coords)}"/>' if len(coords) > 1 else ""
    return (f'<svg class="trend" data-trend="{e(metric)}" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="pass rate of {e(metric)} '
            f'over {len(values)} run(s)"><rect class="band" x="0" y="0" width="{width}" '
            f'height="{height}"/>{line}{"".join(dots)}</svg>')


def _text(content: Any) -> str:
    parts = (content or {}).get("parts") or [] if isinstance(content, dict) else []
    return "\n".join(p["text"] for p in parts if isinstance(p, dict) and p.get("text"))


def _tools(invocation: dict[str, Any] | None) -> str:
    """The tool calls of an ADK invocation (either intermediate data format)."""
    data = (invocation or {}).get("intermediate_data") or {}
    calls = list(data.get("tool_uses") or [])
    for event in data.get("invocation_events") or []:
        for part in ((event or {}).get("content") or {}).get("parts") or []:
            if isinstance(part, dict) and part.get("function_call"):
                calls.append(part["function_call"])
    return "\n".join(f"{c.get('name')}({json.dumps(c.get('args') or {}, ensure_ascii=False)})"
                     for c in calls if isinstance(c, dict))


def _conversation(case: dict[str, Any]) -> str:
    actual = case["inference"].get("invocations") or []
    expected = ((case.get("reference") or {}).get("conversation")) or []
    rows = []
    for i in range(max(len(actual), len(expected))):
        a = actual[i] if i < len(actual) else {}
        x = expected[i] if i < len(expected) else {}
        rows.append(f"<tr><td class=n>{i}</td><td>{e(_text(a.get('user_content') or x.get('user_content')))}"
                    f"</td><td><code>{e(_tools(a))}</code></td><td>{e(_text(a.get('final_response')))}</td>"
                    f"<td><code>{e(_tools(x))}</code></td><td>{e(_text(x.get('final_response')))}</td></tr>")
    state = (f"<details><summary>session state</summary><p>initial</p><pre>{_json(case['initial_session_state'])}"
             f"</pre><p>final</p><pre>{_json(case['final_session_state'])}</pre><p>expected final</p>"
             f"<pre>{_json((case.get('reference') or {}).get('final_session_state'))}</pre></details>")
    error = (f"<p><span class='badge FAILED'>inference failed</span> {e(case['inference'].get('error'))}</p>"
             if case["inference"].get("status") == "failure" else "")
    return (f"{error}<table class=conversation><tr><th class=n>#</th><th>user</th><th>agent tools</th>"
            f"<th>agent answer</th><th>expected tools</th><th>expected answer</th></tr>{''.join(rows)}"
            f"</table>{state}")


def _json(value: Any) -> str:
    return e(json.dumps(value, indent=2, ensure_ascii=False, default=str))


def _ledger_entry(entry: dict[str, Any]) -> str:
    if "error" in entry and "metric_name" not in entry:  # could not be read
        return f"<p class=muted>ledger entry {e(entry['oid'])} unreadable: {e(entry['error'])}</p>"
    parsed = entry.get("parsed") or {}
    verdict = parsed.get("label") or num(parsed.get("score")) if parsed else "unparsed"
    request = "\n\n".join(_text(c) for c in (entry.get("request") or {}).get("contents") or [])
    head = (f"{e(entry.get('role'))} · invocation {e(entry.get('invocation_index'))} · sample "
            f"{e(entry.get('sample_index'))} · attempt {e(entry.get('attempt'))} · "
            f"{e((entry.get('judge_model') or {}).get('model'))} · {e(verdict)}"
            f"{' · from ledger' if entry.get('source') == 'ledger' else ''}"
            f"{' · <b>failed</b>' if entry.get('error') or not entry.get('parse_ok') else ''}")
    body = ""
    if parsed.get("rationale"):
        body += f"<p>{e(parsed['rationale'])}</p>"
    if entry.get("error"):
        body += f"<p><b>error:</b> {e(entry['error'])}</p>"
    body += (f"<details><summary>rendered request</summary><pre>{e(request)}</pre></details>"
             f"<details><summary>raw response</summary><pre>{e(entry.get('raw_response'))}</pre></details>"
             f"<details><summary>parsed</summary><pre>{_json(parsed)}</pre></details>"
             f"<p class=muted>entry <code>{e(entry.get('oid'))}</code> · {e(entry.get('evaluator'))}</p>")
    return f"<details class=ledger data-ledger='{e(entry.get('oid'))}'><summary>{head}</summary>{body}</details>"


def _unit(case: dict[str, Any], name: str, m: dict[str, Any], change: str | None) -> str:
    badge = f" <span class='badge {change}'>{change}</span>" if change else ""
    reuse = f"reused from {e(m.get('reused_from_run'))}" if m["reused"] else e(m["why"])
    disagree = (f" <span class=muted>(metric: {e(m['metric_status'])})</span>"
                if m["metric_status"] != m["status"] and m["status"] != "NOT_EVALUATED" else "")
    row = (f"<tr class=unit data-case='{e(case['eval_id'])}' data-repetition='{case['repetition']}' "
           f"data-metric='{e(name)}'><td>{e(name)}{badge}</td><td data-stat=status><span class='badge "
           f"{e(m['status'])}'>{e(m['status'])}</span>{disagree}</td><td class=n data-stat=score>"
           f"{num(m['score'])}</td><td class=n data-stat=gate_score>{num(m['gate_score'])}</td>"
           f"<td class=n data-stat=threshold>{num(m['threshold'])}</td><td>{reuse}</td>"
           f"<td>{e(m['reason'])}</td></tr>")
    rows = "".join(f"<tr><td class=n>{r['invocation_index']}</td><td class=n>{num(r['score'])}</td>"
                   f"<td><span class='badge {e(r['status'])}'>{e(r['status'])}</span></td><td>"
                   + "<br>".join(f"{e(s.get('rubric_id'))}: {num(s.get('score'))} {e(s.get('rationale'))}"
                                 for s in r.get("rubric_scores") or []) + "</td></tr>"
                   for r in m.get("rows") or [])
    ledger = "".join(_ledger_entry(x) for x in m.get("ledger") or [])
    trace = f" · judge trace {e(m['trace'])}" if m.get("trace") != "not_needed" else ""
    detail = (f"<tr class=detail><td colspan=7><details><summary class=muted>{len(m.get('rows') or [])} "
              f"invocation row(s) · {len(m.get('ledger') or [])} judge ledger entr"
              f"{'y' if len(m.get('ledger') or []) == 1 else 'ies'}{trace}</summary>"
              f"<table><tr><th class=n>invocation</th><th class=n>score</th><th>status</th>"
              f"<th>rubric scores</th></tr>{rows}</table>{ledger}</details></td></tr>")
    return row + detail


def _verdict(case: dict[str, Any]) -> str:
    """``incomplete`` (a failed inference or an incomplete unit), ``failed`` or ``passed``:
    as the run's summary counts cases."""
    ms = case["metrics"].values()
    if case["inference"].get("status") == "failure" or any(not m["complete"] for m in ms):
        return "incomplete"
    return "failed" if any(m["status"] == "FAILED" for m in ms) else "passed"


def _failing(case: dict[str, Any]) -> bool:
    return any(m["status"] == "FAILED" for m in case["metrics"].values())


def _case(case: dict[str, Any], verdict: str, case_changes: dict[str, str]) -> str:
    regressed = [n for n, c in case_changes.items() if c == "regressed"]
    label = e(case["eval_id"]) + (f" #{case['repetition']}" if case["repetition"] else "")
    bad = sum(m["status"] not in PASSING for m in case["metrics"].values())
    extra = (" <span class='badge failed'>failed</span>" if verdict != "failed" and _failing(case)
             else "")
    if regressed:
        extra += f" <span class='badge regressed'>regressed: {e(', '.join(regressed))}</span>"
    units = "".join(_unit(case, n, m, case_changes.get(n)) for n, m in case["metrics"].items())
    opened = " open" if verdict != "passed" or regressed else ""
    return (f"<details class=case{opened} data-case='{e(case['eval_id'])}' data-verdict='{verdict}'>"
            f"<summary><span class='badge {verdict}'>{verdict}</span> <code>{label}</code>{extra} "
            f"<span class=muted>· {bad} of {len(case['metrics'])} metric(s) not passed · agent tokens "
            f"{e((case.get('tokens') or {}).get('total_tokens', '—'))}</span></summary>"
            f"{_conversation(case)}<table class=units><tr><th>metric</th><th>status</th>"
            f"<th class=n>score</th><th class=n>gate score</th><th class=n>threshold</th><th>reuse</th>"
            f"<th>reason</th></tr>{units}</table></details>")


def _tokens(counts: dict[str, Any] | None) -> str:
    if not counts or counts.get("total_tokens") is None:
        return "— (not reported)"
    return (f"{counts['total_tokens']:,} (in {counts.get('input_tokens') or 0:,} · "
            f"out {counts.get('output_tokens') or 0:,})")


def _coverage(record: EvaluationRecord) -> str:
    c = record.coverage
    if c is None or c.full:
        return "the whole eval set and config"
    missing = [f"missing cases: {', '.join(c.missing_cases)}" if c.missing_cases else "",
               f"missing metrics: {', '.join(c.missing_metrics)}" if c.missing_metrics else "",
               c.note or ""]
    return "a subset (" + "; ".join(m for m in missing if m) + ")"


def render(store: Any, record_oid: str, record: EvaluationRecord, *, trend_runs: int = TREND_RUNS,
           baseline_oid: str | None = None, current: dict[str, Any] | None = None) -> str:
    """The page of ``record``; regressions are against ``baseline_oid``, else the baseline
    the run was compared with, else its previous record. ``current``: its history point."""
    full = full_record(store, record_oid, record)
    s = record.summary
    if baseline_oid is None:
        baseline_oid = (record.baseline.record_oid if record.baseline is not None
                        else record.parent_record)
    try:
        moved, base_run = changes(store, record_oid, record, baseline_oid)
        if base_run:
            baseline_oid = f"{baseline_oid} (run {base_run})"
    except EvalsnapError as exc:
        moved, baseline_oid = {}, f"{baseline_oid} (unreadable: {exc})"
    current = current or run_point(store, record_oid, record)
    points = history(store, record.eval_set_id, last=trend_runs - 1, until=record.created_at,
                     exclude_run=record.run_id) + [current]
    try:
        agent = repo.get_inference(store, record.inference[0].inference_oid).agent_name \
            if record.inference else "—"
    except EvalsnapError:
        agent = "—"
    verdict = ("PASSED" if s.passed else "NOT PASSED") + ("" if s.complete else " (INCOMPLETE)")
    facts = [("eval set", "eval_set_id", record.eval_set_id),
             ("agent", "agent", f"{record.app_name} (root agent {agent})"),
             ("store", "store", store.url), ("record", "record_id", record_oid),
             ("run", "run_id", f"{record.run_id} ({record.kind})"),
             ("when", "created_at", record.created_at), ("snapshot", "snapshot_id", record.snapshot_oid),
             ("compared with", "baseline", baseline_oid or "— (no earlier record)"),
             ("covers", "coverage", _coverage(record)),
             ("agent model calls", "agent_calls", s.agent_calls),
             ("judge model calls", "judge_calls", s.judge_calls),
             ("judge samples from the ledger", "reused_judge_samples", s.reused_judge_samples),
             ("units scored / reused", "units", f"{s.scored_units} / {s.reused_units}"),
             ("agent tokens spent", "agent_tokens", _tokens(full["agent_tokens"])),
             ("judge tokens spent", "judge_tokens", _tokens(full["judge_tokens"])),
             ("tokens of the inference scored", "inference_tokens", _tokens(full["inference_tokens"])),
             ("estimated cost", "estimated_cost",
              num(s.estimated_cost, 6) if s.estimated_cost is not None else f"— ({s.cost_note or 'none'})")]
    dl = "".join(f"<dt>{e(k)}</dt><dd data-field='{f}'>{e(v)}</dd>" for k, f, v in facts)
    names = metric_names([current])
    thresholds = {n: m["threshold"] for c in full["cases"] for n, m in c["metrics"].items()}
    mrows = "".join(
        f"<tr data-metric='{e(n)}'><td>{e(n)}</td><td class=n>{num(thresholds.get(n))}</td>"
        f"<td class=n><span data-stat=passed>{st['passed']}</span> / <span data-stat=units>{st['units']}"
        f"</span></td><td class=n data-stat=pass_rate>{pct(st['pass_rate'])}</td><td class=n "
        f"data-stat=mean_score>{num(st['mean_score'])}</td><td class=n>{st['failed']}</td><td class=n>"
        f"{st['not_evaluated']}</td><td>{sparkline(n, points)}</td></tr>"
        for n in names for st in [current["metrics"][n]])
    verdicts = {(c["eval_id"], c["repetition"]): _verdict(c) for c in full["cases"]}
    by_case: dict[tuple, dict[str, str]] = {}
    for (eval_id, rep, metric), change in moved.items():
        by_case.setdefault((eval_id, rep), {})[metric] = change
    rank = {"failed": 1, "incomplete": 2, "passed": 3}

    def order(case: dict[str, Any]) -> int:
        key = (case["eval_id"], case["repetition"])
        if "regressed" in by_case.get(key, {}).values():
            return 0
        return 1 if _failing(case) else rank[verdicts[key]]

    cases = sorted(full["cases"], key=order)
    count = {v: sum(1 for x in verdicts.values() if x == v) for v in rank}
    n_regressed = sum(1 for c in moved.values() if c == "regressed")
    n_fixed = sum(1 for c in moved.values() if c == "fixed")
    body = "".join(_case(c, verdicts[(c["eval_id"], c["repetition"])],
                         by_case.get((c["eval_id"], c["repetition"]), {})) for c in cases)
    span = f"{len(points)} run(s) of {e(record.eval_set_id)}, oldest to this one (red)"
    return (
        f"<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<meta http-equiv='Content-Security-Policy' content=\"{_CSP}\">"
        f"<meta name=viewport content='width=device-width,initial-scale=1'>"
        f"<title>evalsnap · {e(record.eval_set_id)} · {e(record.run_id)}</title><style>{_CSS}</style>"
        f"</head><body><header><h1>{e(record.eval_set_id)} <span class='badge "
        f"{'passed' if s.passed else 'failed' if s.complete else 'incomplete'}' data-field=verdict>"
        f"{verdict}</span></h1><dl class=facts>{dl}</dl></header>"
        f"<h2>Cases</h2><p class=counts><span>passed <b data-count=passed>{count['passed']}</b></span>"
        f"<span>failed <b data-count=failed>{count['failed']}</b></span><span>incomplete "
        f"<b data-count=incomplete>{count['incomplete']}</b></span><span>units regressed "
        f"<b data-count=regressed>{n_regressed}</b></span><span>units fixed <b data-count=fixed>"
        f"{n_fixed}</b></span></p>"
        f"<h2>Pass rate per metric</h2><table class=metrics><tr><th>metric</th><th class=n>threshold"
        f"</th><th class=n>passed / units</th><th class=n>pass rate</th><th class=n>mean score</th>"
        f"<th class=n>failed</th><th class=n>not evaluated</th><th>trend: {span}</th></tr>{mrows}"
        f"</table><h2>Cases, regressed and failing first</h2>{body}"
        f"<p class=muted>evalsnap report of record <code>{e(record_oid)}</code>. Look it up: "
        f"<code>evalsnap show {e(record.run_id)} --store {e(store.url)} --json</code></p>"
        f"</body></html>\n")
