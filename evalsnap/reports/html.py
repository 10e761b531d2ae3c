"""``report RECORD --html OUT``: one self-contained HTML page of a record.

The page needs nothing but itself: inline CSS, inline SVG charts, no script, and a
Content-Security-Policy that forbids every fetch, so a page that tried to load anything
would say so in the browser's console. The markup is a jinja2 template
(``templates/report.html``) with autoescaping: every value is escaped by jinja2, none is
marked safe, so a crafted eval case cannot inject markup; this module only prepares the
values (plain data, no HTML). Content: the run's
header, pass rate and mean score per metric with their trend over the last runs of the
eval set (:mod:`evalsnap.reports.history`), then every case — regressed and failing ones
first — with its conversation, its units, their per-invocation rows and the judge ledger
entries, expandable (``<details>``) under their unit.

Every run publishes its page into the store beside its record (:func:`store_report`) at
``v1/refs/reports/<record hex>.html`` (:func:`report_name`). The store's site
(:mod:`evalsnap.reports.site`) makes its run pages from the same values
(:func:`page_context`), with each case's rows and ledger entries on a page of their own.
"""

from __future__ import annotations

import functools
import io
import json
import marshal
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import jinja2

from evalsnap import startup
from evalsnap.aggregates import record_gate
from evalsnap.errors import EvalsnapError
from evalsnap.records import EvaluationRecord, repo
from evalsnap.reports.history import (
    PASSING,
    REPORTS,
    _saved_point,
    duration,
    history,
    metric_names,
    run_point,
    save_point,
)
from evalsnap.reports.show import full_record
from evalsnap.rows import Spool

if TYPE_CHECKING:
    from evalsnap.reports.summary_model import RecordResult

#: Runs of the eval set the trend shows, this one included.
TREND_RUNS = 10


def num(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


#: What a ``dict`` has as attributes (its methods): a template's ``x.name`` of a dict looks
#: these up as attributes first, as jinja does, and any other name as the key.
_DICT_ATTRIBUTES = frozenset(dir(dict))


class _Environment(jinja2.Environment):
    """jinja's environment, whose ``x.name`` of a plain ``dict`` (the values this module
    gives every template) reads the key at once: jinja asks ``getattr`` first, which fails
    with an ``AttributeError`` for every key (~40 % of a case-history page's rendering).
    The value is the one jinja finds, a method of ``dict`` included."""

    def getattr(self, obj: Any, attribute: str) -> Any:
        if type(obj) is dict and attribute not in _DICT_ATTRIBUTES:
            try:
                return obj[attribute]
            except KeyError:
                pass
        return super().getattr(obj, attribute)


@functools.cache
def _environment() -> jinja2.Environment:
    env = _Environment(
        loader=jinja2.PackageLoader("evalsnap.reports", "templates"),
        autoescape=jinja2.select_autoescape(["html"], default=True),
        finalize=lambda value: "" if value is None else value,  # as str(None) never shows
        keep_trailing_newline=True)
    env.filters.update(num=num, pct=pct, text=lambda v: "" if v is None else str(v))
    env.globals.update(once=_once, memo=_memo)
    return env


def _memo(made: dict[Any, Any], key: Any, part: Callable[..., Any], *args: Any) -> Any:
    """``part(*args)`` (a macro's markup) once per ``key`` in ``made``, a dict the page's
    values hold while it is rendered (the case history's lines of alike statuses)."""
    if key not in made:
        made[key] = part(*args)
    return made[key]


def _once(case: dict[str, Any], key: str, part: Callable[..., Any], *args: Any) -> Any:
    """``part(*args)`` (a macro's markup) for a case the page details, made once per case
    and ``key``: its conversation and judge ledger are on the stored page, the site's run
    page and its case page, and are rendered once for the three (~60 KB a case, at most
    ``EVALSNAP_REPORT_DETAIL_CASES`` of them, held while the run's pages are made)."""
    if not case.get("details"):
        return part(*args)
    return _memo(case.setdefault("_html", {}), key, part, *args)


def template(name: str = "report.html") -> jinja2.Template:
    """A page template of ``templates/`` (the site's pages share its macros and style)."""
    return _environment().get_template(name)


def compile_templates() -> None:
    """Compiles every page template now: jinja compiles one on its first use (~0.15 s of a
    run's publish), which the CLI does instead while it waits for Prefect's temporary API."""
    env = _environment()
    for name in env.list_templates(extensions=["html"]):
        env.get_template(name)


def render_parts(page: jinja2.Template, **values: Any) -> Iterator[bytes]:
    """``page.render(**values)`` as UTF-8, a MB at a time as it is rendered (``generate``):
    jinja's ``render`` holds each of the page's pieces as a string of its own until it joins
    them (a page of 2,000 cases: 83 MB for its 17 MB), and a page of 30,000 cases is ~100
    MB: a local store writes the parts as they come (:meth:`storage.Store.put_ref`)."""
    pieces: list[str] = []
    held = 0
    for piece in page.generate(**values):
        pieces.append(piece)
        held += len(piece)
        if held >= 1 << 20:
            yield "".join(pieces).encode("utf-8")
            pieces.clear()
            held = 0
    yield "".join(pieces).encode("utf-8")


def render_bytes(page: jinja2.Template, **values: Any) -> bytes:
    """The page :func:`render_parts` renders, whole."""
    out = io.BytesIO()
    for part in render_parts(page, **values):
        out.write(part)
    return out.getvalue()


def report_name(record_oid: str) -> str:
    """The page's ref name in :data:`REPORTS`: ``<record hex>.html``."""
    return f"{repo.hexof(record_oid)}.html"


def report_link(store: Any, record_oid: str) -> tuple[str, int | None]:
    """A URL a browser opens for the stored page of a record, and for how many seconds
    (None: no expiry): ``EVALSNAP_PUBLIC_URL`` + its path, a local ``file://`` URL, a URL
    the backend signs (``EVALSNAP_LINK_EXPIRY``), else the store URL
    (:meth:`storage.Store.ref_link`)."""
    from evalsnap import settings

    s = settings.get()
    return store.ref_link(REPORTS, report_name(record_oid), public_url=s.public_url,  # type: ignore[no-any-return]
                          expires=s.link_expiry)


def report_url(store: Any, record_oid: str) -> str:
    """Where the stored page of a record is, as :func:`report_link` gives it."""
    return report_link(store, record_oid)[0]


def store_report(store: Any, record_oid: str, record: EvaluationRecord, *,
                 flow_run_url: str | None = None, again: bool = False,
                 earlier: list[dict[str, Any]] | None = None,
                 known: RecordResult | None = None) -> dict[str, Any]:
    """Writes the history point and the page of a record beside it (``v1/refs/reports/
    <record hex>.json`` and ``.html``, the page as ``text/html; charset=utf-8``); returns
    the page's :func:`page_context` (the site's run page is made from it). ``flow_run_url``:
    the Prefect UI's page of the flow run publishing it, kept in the point, so that the
    page made ``again`` later (``evalsnap report --store-page``) still links it.
    ``earlier``: the trend's points before this run, oldest first, if known (else read with
    ``history``). ``known``: the record's summary, if made (its regressions and fixes are
    the page's: :func:`changes`)."""
    point = run_point(store, record_oid, record)
    if again and flow_run_url is None:
        flow_run_url = (_saved_point(store, record_oid, record.run_id) or {}).get("flow_run_url")
    if flow_run_url and flow_run_url.startswith(("https://", "http://")):
        point["flow_run_url"] = flow_run_url
    save_point(store, point)
    context = page_context(store, record_oid, record, current=point, earlier=earlier,
                           known=known)
    store.put_ref(REPORTS, report_name(record_oid), render_parts(template(), **context),
                  content_type="text/html; charset=utf-8")
    return context


def duration_text(seconds: float | None) -> str:
    """A run's duration as a person reads it (``—``: not known)."""
    if seconds is None:
        return "—"
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def changes(store: Any, record_oid: str, record: EvaluationRecord,
            baseline_oid: str | None, known: RecordResult | None = None,
            ) -> tuple[dict[tuple, str], str | None]:
    """``regressed`` or ``fixed`` per (eval_id, repetition, metric) against the baseline
    record, as :func:`evalsnap.reports.regressions.compare` finds them (with the record's
    own tolerance and alpha when it was compared with that baseline); and the baseline's run
    id. ``known``: the record's summary (:func:`~evalsnap.reports.summary.summary`), made by
    publish: its regressions and fixes are taken as they are when it compared the record
    with ``baseline_oid``, else its cases and aggregates are compared (the record's summary
    is not made again)."""
    if baseline_oid is None:
        return {}, None
    own = record.baseline if record.baseline is not None \
        and record.baseline.record_oid == baseline_oid else None
    if own is not None and known is not None and known.baseline is not None \
            and known.baseline.record_oid == baseline_oid and known.baseline.note is None:
        found: dict[str, Any] = {"regressions": [c.model_dump() for c in known.regressions],
                                 "fixes": [c.model_dump() for c in known.fixes]}
        base_run = own.run_id
    else:
        from evalsnap.reports.regressions import compare
        from evalsnap.reports.summary import summary

        base = repo.get(store, EvaluationRecord, baseline_oid)
        if same_units(record, base):  # a rerun that reused everything: nothing can move
            return {}, base.run_id
        # the cases and aggregates of each side are what compare reads (not their own
        # baseline comparisons, which would run the bootstrap once more per side)
        found = compare(known if known is not None else summary(store, record_oid, record,
                                                                 compare=False),
                        summary(store, baseline_oid, base, compare=False),
                        own.tolerance if own is not None else 0.0,
                        own.alpha if own is not None else 0.05)
        base_run = base.run_id
    out = {(r["eval_id"], r["repetition"], r["metric"]): "regressed" for r in found["regressions"]}
    out.update({(r["eval_id"], r["repetition"], r["metric"]): "fixed" for r in found["fixes"]})
    return out, base_run


def same_units(record: EvaluationRecord, other: EvaluationRecord) -> bool:
    """Whether both records name the same unit object for each case × repetition × metric,
    in the same order: then no unit moved between them (a unit's verdict is its object's,
    and the aggregates are made of the units), and there is nothing to compare."""
    if len(record.units) != len(other.units):
        return False
    return all((a.eval_id, a.repetition, a.metric_name, a.unit_oid)
               == (b.eval_id, b.repetition, b.metric_name, b.unit_oid)
               for a, b in zip(record.units, other.units, strict=True))


def _dots(metric: str, points: list[dict[str, Any]], width: int = 170,
          height: int = 34) -> list[dict[str, Any]]:
    """The sparkline of a metric's pass rate over ``points`` (0-100 %, the last is this run)."""
    values = [(p, p["metrics"][metric]) for p in points if metric in p["metrics"]]
    pad, inner_w, inner_h = 4, width - 8, height - 8
    step = inner_w / max(len(values) - 1, 1)
    dots = []
    for i, (p, s) in enumerate(values):
        rate = s["pass_rate"] or 0.0
        x, y = pad + (i * step if len(values) > 1 else inner_w / 2), pad + (1 - rate) * inner_h
        dots.append({"x": f"{x:.1f}", "y": f"{y:.1f}", "run_id": p["run_id"],
                     "pass_rate": s["pass_rate"], "pass_rate_attr": str(s["pass_rate"]),
                     "created_at": p["created_at"],
                     "passed": s["passed"], "units": s["units"], "mean_score": s["mean_score"]})
    return dots


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


def _conversation(case: dict[str, Any]) -> dict[str, Any]:
    actual = case["inference"].get("invocations") or []
    reference = case.get("reference") or {}
    expected = reference.get("conversation") or []
    turns = []
    for i in range(max(len(actual), len(expected))):
        a = actual[i] if i < len(actual) else {}
        x = expected[i] if i < len(expected) else {}
        turns.append({"user": _text(a.get("user_content") or x.get("user_content")),
                      "agent_tools": _tools(a), "agent_answer": _text(a.get("final_response")),
                      "expected_tools": _tools(x), "expected_answer": _text(x.get("final_response"))})
    return {"failed": case["inference"].get("status") == "failure",
            "error": case["inference"].get("error"), "turns": turns,
            "initial": _pretty(case["initial_session_state"]),
            "final": _pretty(case["final_session_state"]),
            "expected_final": _pretty(reference.get("final_session_state"))}


def _ledger_entry(entry: dict[str, Any]) -> dict[str, Any]:
    if "error" in entry and "metric_name" not in entry:  # could not be read
        return {"unreadable": True, "oid": entry["oid"], "error": entry["error"]}
    parsed = entry.get("parsed") or {}
    return {
        "unreadable": False, "oid": entry.get("oid"), "role": entry.get("role"),
        "invocation_index": entry.get("invocation_index"), "sample_index": entry.get("sample_index"),
        "attempt": entry.get("attempt"), "judge_model": (entry.get("judge_model") or {}).get("model"),
        "verdict": parsed.get("label") or num(parsed.get("score")) if parsed else "unparsed",
        "from_ledger": entry.get("source") == "ledger",
        "failed": bool(entry.get("error") or not entry.get("parse_ok")),
        "rationale": parsed.get("rationale"), "error": entry.get("error"),
        "request": "\n\n".join(_text(c) for c in (entry.get("request") or {}).get("contents") or []),
        "raw_response": entry.get("raw_response"), "parsed_json": _pretty(parsed),
        "evaluator": entry.get("evaluator")}


def _unit(m: dict[str, Any]) -> dict[str, Any]:
    """A unit's values as the template reads them (every key present)."""
    keys = ("status", "metric_status", "score", "gate_score", "threshold", "reused",
            "reused_from_run", "why", "reason", "trace")
    return {**{k: m.get(k) for k in keys}, "rows": list(m.get("rows") or []),
            "ledger": [_ledger_entry(x) for x in m.get("ledger") or []]}


def _verdict(case: dict[str, Any]) -> str:
    """``incomplete`` (a failed inference or an incomplete unit), ``failed`` or ``passed``:
    as the run's summary counts cases."""
    ms = case["metrics"].values()
    if case["inference"].get("status") == "failure" or any(not m["complete"] for m in ms):
        return "incomplete"
    return "failed" if any(m["status"] == "FAILED" for m in ms) else "passed"


def _failing(case: dict[str, Any]) -> bool:
    return any(m["status"] == "FAILED" for m in case["metrics"].values())


def _case(case: dict[str, Any], verdict: str, case_changes: dict[str, str]) -> dict[str, Any]:
    regressed = [n for n, c in case_changes.items() if c == "regressed"]
    return {
        "case": {"eval_id": case["eval_id"], "repetition": case["repetition"],
                 "metrics": {n: _unit(m) for n, m in case["metrics"].items()}},
        "label": case["eval_id"] + (f" #{case['repetition']}" if case["repetition"] else ""),
        "verdict": verdict, "changes": case_changes, "regressed": regressed,
        "also_failed": verdict != "failed" and _failing(case),
        "not_passed": sum(m["status"] not in PASSING for m in case["metrics"].values()),
        "tokens": (case.get("tokens") or {}).get("total_tokens", "—"),
        "open": verdict != "passed" or bool(regressed),
        "details": case.get("details", True),
        "conversation": _conversation(case) if case.get("details", True) else None,
        # the site's run page links each case's details (a page of their own) instead
        "href": None, "ledger_entries": sum(len(m.get("ledger") or []) for m in case["metrics"].values())}


#: A unit's values in a case the page does not detail, in :func:`_unit`'s order (its
#: invocation rows and judge ledger are on no page then: empty).
_ROW_KEYS = ("status", "metric_status", "score", "gate_score", "threshold", "reused",
             "reused_from_run", "why", "reason", "trace")


def _row(case: dict[str, Any], verdict: str, case_changes: dict[str, str]) -> tuple:
    """A case the page does not detail as a compact row (what :func:`_row_case` makes its
    values from; :class:`CaseRows` keeps it as bytes): a page of 10,000 cases holds these,
    not 10,000 nested dicts, while it and the site's run page are rendered."""
    metrics = tuple((name, *(m.get(k) for k in _ROW_KEYS)) for name, m in case["metrics"].items())
    return (case["eval_id"], case["repetition"], verdict, case_changes,
            (case.get("tokens") or {}).get("total_tokens", "—"), metrics)


def _row_case(row: tuple) -> dict[str, Any]:
    """:func:`_case`'s values of a case it does not detail, from its :func:`_row`."""
    eval_id, repetition, verdict, case_changes, tokens, metrics = row
    regressed = [n for n, c in case_changes.items() if c == "regressed"]
    return {
        "case": {"eval_id": eval_id, "repetition": repetition,
                 "metrics": {name: {**dict(zip(_ROW_KEYS, values, strict=True)),
                                    "rows": [], "ledger": []} for name, *values in metrics}},
        "label": eval_id + (f" #{repetition}" if repetition else ""),
        "verdict": verdict, "changes": case_changes, "regressed": regressed,
        "also_failed": verdict != "failed" and any(m[1] == "FAILED" for m in metrics),
        "not_passed": sum(m[1] not in PASSING for m in metrics),
        "tokens": tokens, "open": verdict != "passed" or bool(regressed),
        "details": False, "conversation": None, "href": None, "ledger_entries": 0}


class CaseRows:
    """A page's cases in its order, as the templates loop over them (``len`` and a loop,
    as often as needed): the detailed cases' values held (the site's run page links each
    to its case page), the others' compact :func:`_row` kept as bytes (``marshal``, this
    process's own values: never read from a store), past a few MB in a temporary file
    (:class:`~evalsnap.rows.Spool`), each made into its values as the loop reaches it and
    let go once rendered (the rows of 30,000 cases as tuples were ~30 MB, held from the
    page until the site's pages were written). Made from (rank, values) pairs in the
    record's order: the page's order is by rank, then the record's."""

    def __init__(self, ranked: Iterable[tuple[int, dict[str, Any] | tuple]]) -> None:
        self._rows: dict[int, Spool] = {}  # by rank: each case as its row or its number
        self._detailed: dict[int, list[dict[str, Any]]] = {}  # by rank
        self._n = 0
        for rank, item in ranked:
            if isinstance(item, dict):
                held = self._detailed.setdefault(rank, [])
                held.append(item)
                data = marshal.dumps(len(held) - 1)  # a detailed case: its number in held
            else:
                data = marshal.dumps(item)
            self._rows.setdefault(rank, Spool()).extend((data,))
            self._n += 1

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for rank in sorted(self._rows):
            held = self._detailed.get(rank, [])
            for data in self._rows[rank]:
                item = marshal.loads(data)
                yield held[item] if isinstance(item, int) else _row_case(item)

    def detailed(self) -> list[dict[str, Any]]:
        """The values of the cases the page details, in its order (held: not made again)."""
        return [c for rank in sorted(self._detailed) for c in self._detailed[rank]]


def _tokens(counts: dict[str, Any] | None) -> str:
    if not counts or counts.get("total_tokens") is None:
        return "— (not reported)"
    return (f"{counts['total_tokens']:,} (in {counts.get('input_tokens') or 0:,} · "
            f"out {counts.get('output_tokens') or 0:,})")


def _repetitions(record: EvaluationRecord, aggregates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per case × metric over its repetitions, when any case has more than one:
    k/n, the Wilson interval, mean ± sd, the verdict (a ``flaky`` badge) and the gate's
    status; with ``--until-stable``, how many repetitions the case got and why it stopped."""
    if not any(a["n"] > 1 for a in aggregates):
        return []
    stability = (record.coverage.stability if record.coverage is not None else None) or {}
    rows = []
    for a in aggregates:
        ci = a["pass_rate_ci95"]
        case = stability.get(a["eval_id"])
        rows.append({**a, "ci_low": f"{ci[0]:.2f}" if ci else "—",
                     "ci_high": f"{ci[1]:.2f}" if ci else "—",
                     "stopped": f"{case.repetitions} ({case.stopped})" if case else ""})
    return rows


def _stability_note(record: EvaluationRecord) -> str:
    c = record.coverage
    if c is None or not c.until_stable:
        return ""
    return (f"--until-stable {c.until_stable}: after {c.repetitions} repetition(s), more only "
            "for the cases whose pass rate was still in doubt (its 95% interval held the "
            "gate's line, or the baseline's rate), up to "
            f"{c.until_stable} per case.")


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
    return template().render(**page_context(store, record_oid, record, trend_runs=trend_runs,
                                            baseline_oid=baseline_oid, current=current))


def _detailed(store: Any, record: EvaluationRecord, moved: dict[tuple, str],
              limit: int | None) -> set[tuple[str, int]] | None:
    """The (eval id, repetition) pairs a page details: all of them up to ``limit`` cases,
    else the first ``limit`` in the page's order (regressed, failed, incomplete, passed)."""
    if limit is None:
        from evalsnap import settings

        limit = settings.get().report_detail_cases
    keys = [(i.eval_id, i.repetition) for i in record.inference]
    if len(keys) <= limit:
        return None
    from evalsnap.reports.summary import load_units

    units = load_units(store, record)
    rank = dict.fromkeys(keys, 3)  # passed
    for inf in record.inference:
        if inf.status != "success":
            rank[(inf.eval_id, inf.repetition)] = 2
    for ref in record.units:
        startup.give_back_now_and_then()  # the references parsed before
        key, unit = (ref.eval_id, ref.repetition), units[ref.unit_oid]
        if not unit.complete:
            rank[key] = min(rank.get(key, 3), 2)
        if unit.status == "FAILED":
            rank[key] = min(rank.get(key, 3), 1)
    for (eval_id, rep, _), change in moved.items():
        if change == "regressed":
            rank[(eval_id, rep)] = 0
    detailed = set(sorted(keys, key=rank.__getitem__)[:limit])
    del keys, rank
    startup.give_back_freed()  # every case's key and rank, and the references parsed
    return detailed


#: Units of a record at most for :func:`read_ahead` (~3,000 cases × 7 metrics): which cases a
#: page details is ranked from every unit's verdict, which for a larger record costs more
#: than the ~0.3 s of page work the read-ahead saves (it does not look at ``go_on`` while
#: it ranks).
READ_AHEAD_UNITS = 20_000


def read_ahead(store: Any, record: EvaluationRecord,
               go_on: Callable[[], bool] = lambda: True) -> int:
    """Reads and parses now what a page of a run like ``record`` details: a rerun of its
    eval set details the same cases, with the same objects. Their inference records, units
    and judge ledger entries go to the run's memos (:func:`repo.get_inference`,
    :func:`repo.get_unit_shared`, :func:`repo.get_ledger_shared`), a case at a time while
    ``go_on()`` says so: the CLI does it while Prefect's temporary API starts. Returns the
    number of cases read; an object that cannot be read is left to the page. A record of
    more than :data:`READ_AHEAD_UNITS` units is not read ahead."""
    if len(record.units) > READ_AHEAD_UNITS or not go_on():
        return 0
    detailed = _detailed(store, record, {}, None)
    refs_of = record.units_by_case()
    read = 0
    for inf in record.inference:
        key = (inf.eval_id, inf.repetition)
        if detailed is not None and key not in detailed:
            continue
        if not go_on():
            break
        try:
            repo.get_inference(store, inf.inference_oid)
            for ref in refs_of.get(key, ()):
                for oid in repo.get_unit_shared(store, ref.unit_oid).ledger:
                    repo.get_ledger_shared(store, oid)
        except EvalsnapError:
            continue
        read += 1
    return read


def _resolved(store: Any, record_oid: str, record: EvaluationRecord,
              detailed: set[tuple[str, int]] | None) -> tuple[dict[str, Any], Iterator[dict[str, Any]]]:
    """:func:`~.show.full_record` of the page (``for_page``) without its cases, and its
    cases in the record's order, each made as it is read and let go once read: the detailed
    ones resolved by ``full_record`` (of a copy of the record with only their inference and
    units), the others made one at a time from their units' verdicts (a page of 10,000 cases
    made every case's values first, ~60 MB, before it made its rows of them)."""
    if detailed is None:
        full = full_record(store, record_oid, record, for_page=True)
        return full, _let_go(full.pop("cases"))
    from evalsnap.reports.summary import gated, load_units

    part = record.model_copy(update={
        "inference": [i for i in record.inference if (i.eval_id, i.repetition) in detailed],
        "units": [r for r in record.units if (r.eval_id, r.repetition) in detailed]})
    full = full_record(store, record_oid, part, for_page=True)
    # the aggregates over repetitions of every case, when a case has several (as
    # full_record makes them of the whole record; a unit's verdict is all they read)
    full["aggregates"] = gated(record, load_units(store, record))[0] \
        if any(i.repetition for i in record.inference) or any(r.repetition for r in record.units) \
        else []
    return full, _every_case(store, record, detailed, _let_go(full.pop("cases")))


def _let_go(cases: list[Any]) -> Iterator[dict[str, Any]]:
    for i, c in enumerate(cases):
        cases[i] = None  # let go once read
        yield c


def _every_case(store: Any, record: EvaluationRecord, detailed: set[tuple[str, int]],
                resolved: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every case of ``record`` in its order: ``resolved``'s (the detailed ones, in the
    record's order) and the others' scores, made as :func:`~.show.full_record` makes them."""
    from evalsnap.reports.show import _page_case

    refs_of = record.units_by_case()  # each case's units read when its row is made
    for inf in record.inference:
        startup.give_back_now_and_then()  # the rows made before (their units read)
        key = (inf.eval_id, inf.repetition)
        yield next(resolved) if key in detailed else _page_case(store, inf, refs_of.get(key, ()), {})


def page_context(store: Any, record_oid: str, record: EvaluationRecord, *,
                 trend_runs: int = TREND_RUNS, baseline_oid: str | None = None,
                 current: dict[str, Any] | None = None,
                 earlier: list[dict[str, Any]] | None = None,
                 detail_cases: int | None = None,
                 known: RecordResult | None = None) -> dict[str, Any]:
    """What the page of ``record`` shows, as :func:`render` gives it to the template (the
    site's run and case pages are made from the same values). ``earlier``: the trend's
    points before this run, oldest first, when known (else read with ``history``).
    ``detail_cases``: how many cases show their conversation, invocation rows and judge
    ledger (default ``EVALSNAP_REPORT_DETAIL_CASES``), regressed, failed and incomplete
    cases first; the others show their scores. ``known``: the record's summary, if made
    (:func:`changes`)."""
    s = record.summary
    if baseline_oid is None:
        baseline_oid = (record.baseline.record_oid if record.baseline is not None
                        else record.parent_record)
    try:
        moved, base_run = changes(store, record_oid, record, baseline_oid, known)
        if base_run:
            baseline_oid = f"{baseline_oid} (run {base_run})"
    except EvalsnapError as exc:
        moved, baseline_oid = {}, f"{baseline_oid} (unreadable: {exc})"
    detailed = _detailed(store, record, moved, detail_cases)
    full, resolved = _resolved(store, record_oid, record, detailed)
    # the stored point when there is one (as the trend reads it; it also keeps the link to
    # the flow run that published the record), else computed from the units
    current = current or _saved_point(store, record_oid, record.run_id) \
        or run_point(store, record_oid, record)
    if earlier is None:
        earlier = history(store, record.eval_set_id, last=trend_runs - 1,
                          until=record.created_at, exclude_run=record.run_id)
    points = earlier[max(len(earlier) - trend_runs + 1, 0):] + [current]
    try:
        agent = repo.get_inference(store, record.inference[0].inference_oid).agent_name \
            if record.inference else "—"
    except EvalsnapError:
        agent = "—"
    facts = [("eval set", "eval_set_id", record.eval_set_id),
             ("agent", "agent", f"{record.app_name} (root agent {agent})"),
             ("store", "store", store.url), ("record", "record_id", record_oid),
             ("run", "run_id", f"{record.run_id} ({record.kind})"),
             ("when", "created_at", record.created_at),
             ("duration", "duration", duration_text(duration(record.run_id, record.created_at))),
             ("snapshot", "snapshot_id", record.snapshot_oid),
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
    by_case: dict[tuple, dict[str, str]] = {}
    for (eval_id, rep, metric), change in moved.items():
        by_case.setdefault((eval_id, rep), {})[metric] = change
    rank = {"failed": 1, "incomplete": 2, "passed": 3}
    thresholds: dict[str, Any] = {}
    count = dict.fromkeys(rank, 0)
    unchanged: dict[str, str] = {}  # one for every case without a change (read only)
    def ranked(resolved: Iterator[dict[str, Any]]) -> Iterator[tuple[int, dict[str, Any] | tuple]]:
        """Each case's rank and page values, made and its resolved values let go one case
        at a time (a page of 10,000 cases held both whole, ~250 MB); a case not detailed
        as a compact row."""
        for c in resolved:
            key = (c["eval_id"], c["repetition"])
            thresholds.update((n, m["threshold"]) for n, m in c["metrics"].items())
            verdict = _verdict(c)
            count[verdict] += 1
            changes_ = by_case.get(key, unchanged)
            yield (0 if "regressed" in changes_.values() else
                   1 if _failing(c) else rank[verdict],
                   _case(c, verdict, changes_) if c.get("details", True)
                   else _row(c, verdict, changes_))

    cases = CaseRows(ranked(resolved))
    del resolved
    metrics = [{"name": n, "threshold": thresholds.get(n), "stats": current["metrics"][n],
                "dots": _dots(n, points)} for n in metric_names([current])]
    return dict(
        record=record, record_oid=record_oid, store_url=store.url, facts=facts,
        gate=record_gate(record), repetitions=_repetitions(record, full["aggregates"]),
        stability_note=_stability_note(record),
        verdict=("PASSED" if s.passed else "NOT PASSED") + ("" if s.complete else " (INCOMPLETE)"),
        verdict_class="passed" if s.passed else "failed" if s.complete else "incomplete",
        count=count,
        n_regressed=sum(1 for c in moved.values() if c == "regressed"),
        n_fixed=sum(1 for c in moved.values() if c == "fixed"),
        metrics=metrics, points=points, cases=cases, nav=[], point=current,
        detailed=len(cases.detailed()),
        flow_run_url=current.get("flow_run_url"))
