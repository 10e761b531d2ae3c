"""A report page's cases it does not detail: made one at a time from their verdicts and held
as compact rows (:class:`evalsnap.reports.html.CaseRows`), with the values, the order and
the page the full per-case values gave.

One store, made by the real CLI (in the test process): record A (``run`` of the shop agent),
B (``rescore A --reuse`` with stricter thresholds: regressions against A), C (``run
--repetitions 2 --reuse``: aggregates over repetitions) and D (``run --reuse --baseline B``:
fixes against B).
"""

from __future__ import annotations

import json
import marshal
from pathlib import Path
from typing import Any

import pytest

from evalsnap.records import repo
from evalsnap.reports import html
from evalsnap.reports.show import full_record
from evalsnap.reports.site import run_pages
from tests._cli import run_inproc
from tests.conftest import copy_shop


def _ok(r: Any, what: str) -> dict[str, Any]:
    assert r.code in (0, 1, 3), f"expected {what} to finish, got exit {r.code}: {r.stderr[-3000:]}"
    return r.json  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("pages_stream")
    agent = copy_shop(root / "agents" / "shop_agent")
    evalset = agent / "shop.evalset.json"
    config = json.loads((agent / "test_config.json").read_text("utf-8"))
    config["criteria"]["response_match_score"] = 0.8
    config["criteria"]["rubric_based_final_response_quality_v1"]["threshold"] = 0.75
    strict = agent / "strict_config.json"
    strict.write_text(json.dumps(config), "utf-8")
    store = str(root / "store")
    a = _ok(run_inproc("run", str(agent), str(evalset), "--store", store, "--json"), "run A")
    b = _ok(run_inproc("rescore", a["run_id"], "--config", str(strict), "--store", store,
                       "--reuse", "--json"), "rescore B")
    c = _ok(run_inproc("run", str(agent), str(evalset), "--store", store, "--json",
                       "--repetitions", "2", "--reuse"), "run C")
    d = _ok(run_inproc("run", str(agent), str(evalset), "--store", store, "--json",
                       "--reuse", "--baseline", b["run_id"]), "run D")
    e = _ok(run_inproc("run", str(agent), str(evalset), "--store", store, "--json",
                       "--reuse"), "run E")  # D's units again: a no-op rerun
    return {"store": store, "runs": {"a": a["run_id"], "b": b["run_id"], "c": c["run_id"],
                                     "d": d["run_id"], "e": e["run_id"]}}


def _open(made: dict[str, Any], name: str) -> tuple[Any, str, Any]:
    store = repo.open_store(made["store"], {})
    oid, record = repo.resolve_record(store, made["runs"][name])
    return store, oid, record


@pytest.mark.parametrize("name", ["a", "b", "c"])
@pytest.mark.parametrize("detail", [0, 2])
def test_the_cases_made_one_at_a_time_are_full_records(made: dict[str, Any], name: str,
                                                       detail: int) -> None:
    """``_resolved`` gives what ``full_record(..., detailed=..., for_page=True)`` gave: the
    same cases in the same order (the detailed ones resolved), the same aggregates."""
    store, oid, record = _open(made, name)
    moved, _ = html.changes(store, oid, record, record.parent_record)
    detailed = html._detailed(store, record, moved, detail)
    assert detailed is not None and len(detailed) == detail
    expected = full_record(store, oid, record, detailed=detailed, for_page=True)
    full, cases = html._resolved(store, oid, record, detailed)
    assert list(cases) == expected.pop("cases")
    assert full == expected
    if name == "c":
        assert full["aggregates"] and any(a["n"] == 2 for a in full["aggregates"])
    if name == "b":
        assert "regressed" in moved.values()


@pytest.mark.parametrize("name", ["c", "d"])
def test_the_page_takes_the_records_summary_as_made(made: dict[str, Any], name: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Publish hands the page the record's summary (``known``): against the record's own
    baseline (D's) the page's changes are the summary's regressions and fixes, against
    another record (C's parent) the summary's cases are compared; either way the page finds
    what it finds by making the summaries itself, and the record's is not made again."""
    from evalsnap.reports import summary as summaries

    store, oid, record = _open(made, name)
    base = record.baseline.record_oid if name == "d" else record.parent_record
    assert base is not None and (name == "c") == (record.baseline is None)
    known = summaries.summary(store, oid, record)
    compared = html.changes(store, oid, record, base)
    assert "fixed" in compared[0].values()  # against B's stricter thresholds
    if name == "d":
        assert known.fixes
    made_for: list[str] = []
    real = summaries.summary

    def counted(store: Any, record_oid: str, *args: Any, **kwargs: Any) -> Any:
        made_for.append(record_oid)
        return real(store, record_oid, *args, **kwargs)

    monkeypatch.setattr(summaries, "summary", counted)
    assert html.changes(store, oid, record, base, known) == compared
    assert made_for == ([] if name == "d" else [base])
    # a summary's rows are compared as their JSON: as the `--json` objects compare
    from evalsnap.reports.regressions import compare

    before = real(store, base, repo.get(store, type(record), base), compare=False)
    assert compare(known, before) == compare(known.model_dump(mode="json"),
                                             before.model_dump(mode="json"))


def test_a_rerun_of_the_same_units_has_no_changes_and_makes_no_summary(
        made: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A no-op rerun (E: every unit D's) has nothing to compare with its parent: the page
    finds no change without making either record's summary, as comparing them finds."""
    from evalsnap.reports import summary as summaries
    from evalsnap.reports.regressions import compare

    store, oid, record = _open(made, "e")
    _, d_oid, d = _open(made, "d")
    assert record.parent_record == d_oid and record.baseline is None
    assert html.same_units(record, d) and not html.same_units(d, _open(made, "b")[2])
    found = compare(summaries.summary(store, oid, record, compare=False),
                    summaries.summary(store, d_oid, d, compare=False))
    assert not found["regressions"] and not found["fixes"]

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a summary was made")

    monkeypatch.setattr(summaries, "summary", refused)
    assert html.changes(store, oid, record, d_oid) == ({}, d.run_id)


@pytest.mark.parametrize("name", ["a", "b", "c"])
def test_a_compact_row_makes_the_values_of_its_case(made: dict[str, Any], name: str) -> None:
    """``_row_case(_row(case))`` is ``_case(case)`` for every case a page does not detail,
    whatever its verdict and changes, kept as the bytes CaseRows keeps (marshal)."""
    store, oid, record = _open(made, name)
    moved, _ = html.changes(store, oid, record, record.parent_record)
    resolved = full_record(store, oid, record, detailed=set(), for_page=True)["cases"]
    verdicts = set()
    for c in resolved:
        changes = {m: ch for (e, r, m), ch in moved.items() if (e, r) == (c["eval_id"], c["repetition"])}
        verdict = html._verdict(c)
        verdicts.add(verdict)
        row = marshal.loads(marshal.dumps(html._row(c, verdict, changes)))
        assert html._row_case(row) == html._case(c, verdict, changes)
    assert verdicts >= {"passed", "failed"}


def test_case_rows_loop_again_and_hold_the_detailed_values(made: dict[str, Any]) -> None:
    store, oid, record = _open(made, "b")
    ctx = html.page_context(store, oid, record, detail_cases=2)
    cases = ctx["cases"]
    assert isinstance(cases, html.CaseRows)
    first, again = list(cases), list(cases)
    assert first == again and len(cases) == len(first) == len(record.inference)
    assert ctx["detailed"] == 2 == sum(c["details"] for c in first)
    held = cases.detailed()
    assert [c for c in first if c["details"]] == held
    assert all(a is b for a, b in zip(held, cases.detailed(), strict=True))  # not made again
    # the site's run page links each detailed case through the held values
    pages = run_pages(store, oid, record, context=ctx)
    assert all(c["href"] for c in cases.detailed())
    [index] = [p for n, p in pages.items() if n.endswith("/index.html")]
    assert index.count(b"data-details=") == 2


def test_the_page_is_the_page_of_its_full_values(made: dict[str, Any], tmp_path: Path) -> None:
    """The page rendered from the compact rows is, byte for byte, the page rendered from a
    list of every case's values."""
    store, oid, record = _open(made, "b")
    ctx = html.page_context(store, oid, record, detail_cases=2)
    page = html.render_bytes(html.template(), **ctx)
    assert page == html.render_bytes(html.template(), **{**ctx, "cases": list(ctx["cases"])})
    assert page.count(b'<details class="case"') == len(record.inference)
