"""The browsable site of a store (``v1/site/``; ``evalsnap site``), issue 30 item 3.

The session's golden demo run (a full run) is copied into a moto bucket; a subset rerun of
two cases publishes there, which refreshes the site: its pages are ``text/html`` objects
that Debian's ``chromium`` opens over plain HTTP from the bucket. From the index the test
follows the links a person would click — to the eval set, to the run's page, to a case's
ledger page — and finds there the numbers of ``show --json``; the subset run is listed
apart and not in the trend. On a local copy, a rescore with stricter thresholds makes
cases flip: the case history marks as flaky exactly what ``history --flaky`` counts, and
``evalsnap site --out DIR`` writes the very pages the runs refreshed. A crafted eval set
and case ids stay text and safe path segments.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import boto3
import httpx
import pytest

from evalsnap.reports._site_data import page_name
from tests._cli import run_inproc
from tests.servers import Server, moto_with_bucket
from tests.test_remote_stores import _env
from tests.test_report_browser import CHROMIUM, browse
from tests.test_reports import _stats, _units, check_numbers, parse_page

BUCKET = "evalsnap-site"
PREFIX = "nightly"
SUBSET = ("weather_paris", "cart_state_mismatch")
HREF = re.compile(r'<a href="([^"]+)"([^>]*)>')
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not "
                                    "installed (apt-get install chromium)")


def _client(server: Server) -> Any:
    return boto3.client("s3", endpoint_url=server.url, aws_access_key_id="testing",
                        aws_secret_access_key="testing", region_name="us-east-1")


def _hrefs(dom: str, marker: str = "") -> list[str]:
    """The hrefs of the page's links whose attributes hold ``marker``."""
    return [href.replace("&amp;", "&") for href, rest in HREF.findall(dom) if marker in rest]


def _show(run_id: str, store: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    shown = run_inproc("show", run_id, "--store", store, "--json", env=env)
    assert shown.code == 0, shown.stderr[-2000:]
    return shown.json


@pytest.fixture(scope="module")
def bucket(golden_demo: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The golden demo's store in a moto bucket, then a subset rerun published there."""
    root = tmp_path_factory.mktemp("site-s3")
    agent, store, cold = golden_demo.copy(root)
    with moto_with_bucket(BUCKET) as server:
        client = _client(server)
        # the site, and only the site, readable by anyone (docs/reports.md): a browser
        # opens it with no credentials; the records stay private
        client.put_bucket_policy(Bucket=BUCKET, Policy=json.dumps({
            "Version": "2012-10-17", "Statement": [{
                "Effect": "Allow", "Principal": "*", "Action": "s3:GetObject",
                "Resource": f"arn:aws:s3:::{BUCKET}/{PREFIX}/v1/site/*"}]}))
        for path in store.rglob("*"):
            if path.is_file():
                client.put_object(Bucket=BUCKET, Key=f"{PREFIX}/{path.relative_to(store)}",
                                  Body=path.read_bytes())
        env = _env(AWS_ENDPOINT_URL=server.url)
        url = f"s3://{BUCKET}/{PREFIX}"
        subset = run_inproc("run", str(agent), str(agent / "shop.evalset.json"), "--store", url,
                            *[a for c in SUBSET for a in ("--case", c)], "--reuse", "--json",
                            env=env)
        assert subset.code == 1, subset.stderr[-3000:]  # cart_state_mismatch fails
        assert subset.json["full"] is False
        yield {"server": server, "client": client, "env": env, "url": url, "root": root,
               "cold": cold.json, "subset": subset.json,
               "base": f"{server.url}/{BUCKET}/{PREFIX}/v1/site/",
               "shows": {r.json["run_id"]: _show(r.json["run_id"], url, env)
                         for r in (cold, subset)}}


def test_publish_writes_the_site_as_html_objects(bucket: dict[str, Any]) -> None:
    client, run_id = bucket["client"], bucket["subset"]["run_id"]
    keys = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=BUCKET, Prefix=f"{PREFIX}/v1/site/runs/{page_name(run_id)}/")
        for o in page.get("Contents", [])]
    written = [k for k in keys if k.endswith(".html")]
    assert len(written) == 2, keys  # its page and one page of its (two) cases' details
    for key in [f"{PREFIX}/v1/site/index.html", f"{PREFIX}/v1/site/sets/shop/index.html",
                f"{PREFIX}/v1/site/sets/shop/cases.html", *keys]:
        head = client.head_object(Bucket=BUCKET, Key=key)
        assert head["ContentType"] == "text/html; charset=utf-8", key
        # anonymous: a browser with no credentials reads what a public bucket serves
        got = httpx.get(f"{bucket['server'].url}/{BUCKET}/{key}", timeout=30)
        assert got.status_code == 200 and got.headers["content-type"].startswith("text/html")
    # a refresh writes what the run changes, never the whole site: the earlier run's page
    # is still the copy this test uploaded (untyped)
    cold_page = f"{PREFIX}/v1/site/runs/{page_name(bucket['cold']['run_id'])}/index.html"
    assert client.head_object(Bucket=BUCKET, Key=cold_page)["ContentType"] != \
        "text/html; charset=utf-8"
    record = f"{PREFIX}/v1/refs/runs/{run_id}"
    assert httpx.get(f"{bucket['server'].url}/{BUCKET}/{record}", timeout=30).status_code == 403


@needs_chromium
def test_browser_follows_the_links_to_the_numbers(bucket: dict[str, Any], tmp_path: Path) -> None:
    """index → eval set → the subset run's page → a case's ledger page, over HTTP."""
    base, shows, subset = bucket["base"], bucket["shows"], bucket["subset"]
    index, console = browse(base + "index.html", "--dump-dom", tmp=tmp_path)
    assert console == [], console
    set_url = urljoin(base + "index.html", _hrefs(index, 'data-link="set"')[0])
    set_dom, console = browse(set_url, "--dump-dom", tmp=tmp_path)
    assert console == [], console
    # the runs table: per run, per metric, the pass rate and counts of show --json
    rows = _run_rows(set_dom)
    assert set(rows) == set(shows)
    for run_id, shown in shows.items():
        for metric, s in _stats(shown).items():
            assert rows[run_id]["metrics"][metric] == (
                f"{100 * s['passed'] / s['units']:.1f}%", str(s["passed"]), str(s["units"]))
    assert rows[subset["run_id"]]["full"] == "false" and rows[bucket["cold"]["run_id"]]["full"] == "true"
    # the trend draws the full run only; the subset is listed apart
    trend_runs = set(re.findall(r'<circle[^>]*data-run="([^"]+)"', set_dom))
    assert trend_runs == {bucket["cold"]["run_id"]}, trend_runs
    assert set_dom.index("Subset runs") < set_dom.index(f'data-run="{subset["run_id"]}"')

    run_href = next(h for h in _hrefs(set_dom, 'data-link="run"') if h in _run_links(set_dom,
                                                                                 subset["run_id"]))
    run_url = urljoin(set_url, run_href)
    run_dom, console = browse(run_url, "--dump-dom", tmp=tmp_path)
    assert console == [], console
    check_numbers(parse_page(run_dom), shows[subset["run_id"]], subset)
    assert "data-ledger=" not in run_dom, "the run's page links its ledger; it does not hold it"

    case = "weather_paris"
    case_url = urljoin(run_url, next(h for h in _hrefs(run_dom, f'data-details="{case}"')))
    case_dom, console = browse(case_url, "--dump-dom", tmp=tmp_path)
    assert console == [], console
    shown_case = next(c for c in shows[subset["run_id"]]["cases"] if c["eval_id"] == case)
    ledger = {e["oid"] for m in shown_case["metrics"].values() for e in m["ledger"]}
    assert ledger, "expected the judge metrics of the case to have ledger entries"
    assert set(re.findall(r'data-ledger="([^"]+)"', _section(case_dom, case_url))) == ledger
    page = parse_page(case_dom)
    for name, m in shown_case["metrics"].items():
        assert page.units[(case, name, "status")].startswith(m["status"]), name
        assert page.units[(case, name, "score")] == (
            "—" if m["score"] is None else f"{m['score']:.3f}"), name


def _section(dom: str, url: str) -> str:
    """The case section a link's fragment (``#case-<case>``) names on a case page."""
    anchor = url.split("#", 1)[1]
    found = re.search(rf'<section id="{re.escape(anchor)}"[^>]*>.*?</section>', dom, re.S)
    assert found, f"expected a section #{anchor} on the case page"
    return found.group(0)


def _run_rows(dom: str) -> dict[str, dict[str, Any]]:
    """Per run row of an eval set's page: whether full, and per metric (rate, passed, units)."""
    rows = {}
    for run_id, full, body in re.findall(
            r'<tr data-run="([^"]+)" data-full="(true|false)"[^>]*>(.*?)</tr>', dom, re.S):
        metrics = {m: (rate, passed, units) for m, rate, passed, units in re.findall(
            r'<td class="n" data-metric="([^"]+)"><span data-stat="pass_rate">([^<]*)</span> '
            r'<span class="muted">\(<span data-stat="passed">(\d+)</span>/<span '
            r'data-stat="units">(\d+)</span>\)</span></td>', body)}
        rows[run_id] = {"full": full, "metrics": metrics}
    return rows


def _run_links(dom: str, run_id: str) -> str:
    return re.search(rf'<tr data-run="{re.escape(run_id)}".*?</tr>', dom, re.S).group(0)


def test_the_demo_run_page_is_small(golden_demo: Any, tmp_path: Path) -> None:
    """≤ 100 KB, the ledger one click away; every ledger entry on its case's page."""
    _, store, cold = golden_demo.copy(tmp_path)
    shown = _show(cold.json["run_id"], str(store))
    pages = _site_files(store)
    run_page = next(p for p in pages if p.endswith("/index.html") and p.startswith("runs/"))
    assert len(pages[run_page]) <= 100_000, len(pages[run_page])
    assert b"data-ledger=" not in pages[run_page]
    on_pages = {oid for p, b in pages.items() if "/cases/" in p
                for oid in re.findall(r'data-ledger="([^"]+)"', b.decode())}
    assert on_pages == {e["oid"] for c in shown["cases"] for m in c["metrics"].values()
                        for e in m["ledger"]}


def test_case_pages_hold_a_page_of_cases_each(golden_demo: Any, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A run writes one page per ``CASES_PER_PAGE`` detailed cases, not one per case (a
    bucket bills each PUT): every case link of the run's page names a section on one of
    them, and each section holds exactly its case's ledger entries."""
    from evalsnap.reports import site

    monkeypatch.setattr(site, "CASES_PER_PAGE", 4)
    _, store, cold = golden_demo.copy(tmp_path)
    shown = _show(cold.json["run_id"], str(store))
    out = tmp_path / "site"
    r = run_inproc("site", "--store", str(store), "--out", str(out))
    assert r.code == 0, r.stderr[-3000:]
    run_dir = out / "runs" / page_name(cold.json["run_id"])
    ids = {c["eval_id"] for c in shown["cases"]}
    assert len(ids) == 13, ids
    assert sorted(p.name for p in (run_dir / "cases").glob("*.html")) == \
        ["1.html", "2.html", "3.html", "4.html"]  # 13 cases, 4 a page
    run_page = (run_dir / "index.html").read_text("utf-8")
    seen = set()
    for case in ids:
        [href] = set(_hrefs(run_page, f'data-details="{case}"'))
        section = _section((run_dir / href.split("#")[0]).read_text("utf-8"), href)
        assert f'data-case="{case}"' in section
        shown_case = next(c for c in shown["cases"] if c["eval_id"] == case)
        assert set(re.findall(r'data-ledger="([^"]+)"', section)) == \
            {e["oid"] for m in shown_case["metrics"].values() for e in m["ledger"]}, case
        seen.add(href.split("#")[0])
    assert len(seen) == 4


def _site_files(store: Path) -> dict[str, bytes]:
    root = store / "v1" / "site"
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def flipped(golden_demo: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A local copy of the golden store and a rescore of its run with stricter thresholds."""
    root = tmp_path_factory.mktemp("site-local")
    agent, store, cold = golden_demo.copy(root)
    config = json.loads((agent / "test_config.json").read_text("utf-8"))
    config["criteria"]["response_match_score"] = 0.8
    strict = agent / "strict_config.json"
    strict.write_text(json.dumps(config), "utf-8")
    b = run_inproc("rescore", cold.json["run_id"], "--config", str(strict), "--store",
                   str(store), "--reuse", "--json")
    assert b.code in (1, 3), b.stderr[-3000:]
    return {"store": store, "root": root, "cold": cold.json, "strict": b.json,
            "golden_store": golden_demo.root / "store"}


def test_case_history_marks_what_history_flaky_counts(flipped: dict[str, Any]) -> None:
    flaky = run_inproc("history", "shop", "--flaky", "--json", "--last", "30", "--store",
                       str(flipped["store"]))
    assert flaky.code == 0, flaky.stderr[-2000:]
    expected = {(e["eval_id"], e["metric"]): e["flips"] for e in flaky.json["flaky"]}
    assert expected, "expected the stricter thresholds to flip some cases"
    dom = (flipped["store"] / "v1" / "site" / "sets" / "shop" / "cases.html").read_text("utf-8")
    lines = re.findall(r'<tr data-case="([^"]+)" data-metric="([^"]+)" data-flips="(\d+)" '
                       r'data-flaky="(true|false)">', dom)
    assert {(c, m): int(n) for c, m, n, _ in lines if int(n)} == expected
    assert {(c, m) for c, m, _, f in lines if f == "true"} >= set(expected)
    b, a = _units(_show(flipped["strict"]["run_id"], str(flipped["store"]))), \
        _units(_show(flipped["cold"]["run_id"], str(flipped["store"])))
    assert {(c, m) for c, m, n, _ in lines if int(n)} == {
        (k[0], k[2]) for k in b if b[k]["status"] != a[k]["status"]}


def test_a_large_set_keeps_its_pages_bounded(flipped: dict[str, Any], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``EVALSNAP_REPORT_DETAIL_CASES`` cases a run has case pages for its worst cases
    only, and past ``CASE_LINES`` case × metric lines the case history shows the flaky
    ones first and says how many it left out."""
    from evalsnap.reports import site

    monkeypatch.setattr(site, "CASE_LINES", 3)
    out = tmp_path / "site"
    r = run_inproc("site", "--store", str(flipped["store"]), "--out", str(out),
                   env={"EVALSNAP_REPORT_DETAIL_CASES": "1"})
    assert r.code == 0, r.stderr[-3000:]
    for run in (flipped["cold"], flipped["strict"]):
        run_dir = out / "runs" / site.page_name(run["run_id"])
        assert len(list((run_dir / "cases").glob("*.html"))) == 1, run_dir
        page = (run_dir / "index.html").read_text("utf-8")
        assert page.count('<table class="conversation">') == 1
        assert 'data-field="details_shown"' in page
    dom = (out / "sets" / "shop" / "cases.html").read_text("utf-8")
    lines = re.findall(r'<tr data-case="[^"]+" data-metric="[^"]+" data-flips="\d+" '
                       r'data-flaky="(true|false)">', dom)
    assert lines == ["true"] * 3, lines  # the stricter thresholds flipped more than 3
    assert "The first 3 of " in dom


@needs_chromium
def test_site_out_dir_is_the_published_site(flipped: dict[str, Any], tmp_path: Path) -> None:
    """``evalsnap site --out DIR`` writes, from the records, the pages the runs refreshed;
    the tree opens from ``file://``, links and all."""
    out = tmp_path / "site"
    r = run_inproc("site", "--store", str(flipped["store"]), "--out", str(out))
    assert r.code == 0, r.stderr[-3000:]
    assert str(out / "index.html") in r.stdout
    written = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    # the golden run's page was written in the golden store, and names it
    stored = {p: b.replace(str(flipped["golden_store"]).encode(), str(flipped["store"]).encode())
              for p, b in _site_files(flipped["store"]).items()}
    assert written == stored
    index, console = browse((out / "index.html").as_uri(), "--dump-dom", tmp=tmp_path)
    assert console == [], console
    for href in _hrefs(index):
        assert (out / href).is_file(), href
    set_dir = out / _hrefs(index, 'data-link="set"')[0]
    for href in _hrefs(set_dir.read_text("utf-8")):
        assert (set_dir.parent / href).resolve().is_file(), href
    nothing = run_inproc("site", "--store", str(flipped["store"]))
    assert nothing.code == 2 and "--out DIR" in nothing.stderr
    afile = tmp_path / "f"
    afile.write_text("x")
    bad = run_inproc("site", "--store", str(flipped["store"]), "--out", str(afile))
    assert bad.code == 2 and "is a file" in bad.stderr


CRAFTED_SET = 'Shop <b>"x"</b>/../../etc'
CRAFTED_CASES = {"cart_state_mismatch": "../../evil<script>alert(1)</script>",
                 "greeting_then_weather": "Weather_Paris",  # a case-insensitive disk's twin
                 "weather_paris": "weather_paris"}


def test_crafted_ids_are_text_and_safe_names(shop_copy: Path, tmp_path: Path) -> None:
    """An eval set and case ids full of markup and path parts: pages only under
    ``v1/site/``, named by safe segments, ids shown as text; a site that cannot be written
    warns and does not change the run's result."""
    evalset = shop_copy / "shop.evalset.json"
    data = json.loads(evalset.read_text("utf-8"))
    data["eval_set_id"] = CRAFTED_SET
    data["eval_cases"] = [c for c in data["eval_cases"] if c["eval_id"] in CRAFTED_CASES]
    for c in data["eval_cases"]:
        c["eval_id"] = CRAFTED_CASES[c["eval_id"]]
    crafted = shop_copy / "crafted.evalset.json"
    crafted.write_text(json.dumps(data), "utf-8")
    store = tmp_path / "store"
    r = run_inproc("run", str(shop_copy), str(crafted), "--store", str(store), "--json")
    assert r.code in (0, 1, 3), r.stderr[-3000:]
    pages = _site_files(store)
    assert len(pages) == 5, sorted(pages)  # index, the set's two, the run's and its cases'
    assert all(re.fullmatch(r"[a-z0-9_-]+(/[a-z0-9_-]+)*\.html", p) for p in pages), sorted(pages)
    site = store / "v1" / "site"
    assert not [p for p in tmp_path.rglob("*") if ("evil" in p.name or p.name == "etc")
                and not p.is_relative_to(site)], "a crafted id became a path outside the site"
    text = b"".join(pages.values()).decode()
    assert "<script>alert" not in text and "<b>" not in text
    assert "../../evil&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "Shop &lt;b&gt;&#34;x&#34;&lt;/b&gt;/../../etc" in text
    for path, content in pages.items():  # every link names a page of the tree (and a
        for href in _hrefs(content.decode()):  # section of it)
            target = (Path("/site") / path).parent / href.split("#")[0]
            name = target.resolve().relative_to("/site").as_posix()
            assert name in pages, (path, href)
            if "#" in href:
                _section(pages[name].decode(), href)

    # the site in the way (a file where v1/site/ goes): the run warns and keeps its verdict
    shutil.rmtree(store / "v1" / "site")
    (store / "v1" / "site").write_text("not a folder")
    again = run_inproc("run", str(shop_copy), str(crafted), "--store", str(store), "--json",
                       "--reuse")
    assert again.code == r.code, again.stderr[-3000:]
    assert "could not refresh the store's site" in again.stderr


def test_gc_takes_removed_runs_off_the_site(flipped: dict[str, Any], tmp_path: Path) -> None:
    """A run gc removed is neither listed nor linked any more, and its pages are gone; the
    kept run's page stays as it was."""
    store = tmp_path / "store"
    shutil.copytree(flipped["store"], store)
    cold, strict = flipped["cold"]["run_id"], flipped["strict"]["run_id"]
    before = _site_files(store)
    assert any(p.startswith(f"runs/{page_name(cold)}/") for p in before)
    r = run_inproc("gc", "--keep-last", "1", "--grace", "0", "--store", str(store), "--json")
    assert r.code == 0, r.stderr[-3000:]
    assert [x["run_id"] for x in r.json["runs_removed"]] == [cold], r.json
    after = _site_files(store)
    assert not any(p.startswith(f"runs/{page_name(cold)}/") for p in after)
    kept = f"runs/{page_name(strict)}/index.html"
    assert after[kept] == before[kept]
    for page in ("index.html", "sets/shop/index.html", "sets/shop/cases.html"):
        assert cold not in after[page].decode("utf-8"), page
    assert strict in after["sets/shop/index.html"].decode("utf-8")
    # the rows the next publish starts from have lost it too
    rows = json.loads((store / "v1" / "refs" / "site" / "shop.json").read_text("utf-8"))
    assert [x["run_id"] for x in rows["runs"]] == [strict]


def test_case_history_cells_letter_each_status() -> None:
    from evalsnap.reports._site_data import RunRow, SetData
    from evalsnap.reports.site import set_pages

    def run(n: int, statuses: dict[str, dict[str, str]], flaky: dict[str, list[str]]) -> RunRow:
        return RunRow(run_id=f"20261203T00000{n}Z-abcdef", record_id="sha256:" + "0" * 64,
                      kind="run", created_at=f"2026-12-03T00:00:0{n}Z", full=True, covers="full",
                      passed=False, complete=True, cases=2, metrics={}, regressions=None,
                      fixes=None, baseline_run=None, duration=None, cost=None, cost_note=None,
                      statuses=statuses, flaky=flaky)

    runs = [run(1, {"a": {"m": "PASSED"}, "b": {"m": "NOT_EVALUATED"}}, {}),
            run(2, {"a": {"m": "FAILED"}, "b": {"m": "INFORMATIONAL"}}, {"a": ["m"]})]
    page = next(v for k, v in set_pages(SetData(eval_set_id="s", runs=runs)).items()
                if k.endswith("cases.html")).decode()
    rows = {m.group(1): re.findall(r'<span class="badge (\w+)" title="\1">([^<]*)</span>',
                                   m.group(2))
            for m in re.finditer(r'<tr data-case="(\w+)"[^>]*>(.*?)</tr>', page, re.S)}
    assert rows == {"a": [("PASSED", "P"), ("FAILED", "F~")],
                    "b": [("NOT_EVALUATED", "?"), ("INFORMATIONAL", "I")]}


def test_a_rows_run_values_leave_out_its_case_statuses() -> None:
    """A row read as a run's values (tables, the trend) is without its one-value-per-case
    fields: 30 kept runs of 30,000 cases × 7 metrics were copied whole for every table."""
    from evalsnap.reports._site_data import PER_CASE, RunRow, run_values

    row = RunRow(run_id="20261203T000001Z-abcdef", record_id="sha256:" + "0" * 64, kind="run",
                 created_at="2026-12-03T00:00:01Z", full=True, covers="full", passed=True,
                 complete=True, cases=1, metrics={}, regressions=None, fixes=None,
                 baseline_run=None, duration=None, cost=None, cost_note=None,
                 statuses={"a": {"m": "PASSED"}}, flaky={"a": ["m"]})
    values = run_values(row)
    assert PER_CASE == {"statuses", "flaky"}
    assert set(values) == set(RunRow.model_fields) - PER_CASE
    assert values["run_id"] == row.run_id and values["passed"] is True


def _trend_view(points: list[dict[str, Any]]) -> list[tuple[str, dict[str, tuple]]]:
    return [(p["run_id"], {m: (s["units"], s["passed"], s["pass_rate"], s["mean_score"])
                           for m, s in p["metrics"].items()}) for p in points]


def test_the_trend_comes_from_the_site_rows_not_every_manifest(
        flipped: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 31: a publish's trend and site refresh cost two listings and one read per eval
    set, not a read of every run's manifest and point (the no-op's requests grew by about
    two per run kept). The rows are checked against the listed runs: a run no longer listed
    is left out, a listed run the rows do not name has its manifest read and its row made
    — and the trend is the one ``history`` reads from the manifests."""
    from evalsnap.records import repo
    from evalsnap.reports import _site_data as data
    from evalsnap.reports.history import history
    from evalsnap.reports.site import current
    from storage import Store

    store_dir = tmp_path / "store"
    shutil.copytree(flipped["store"], store_dir)
    store = repo.open_store(str(store_dir))
    cold, strict = flipped["cold"]["run_id"], flipped["strict"]["run_id"]
    read: list[str] = []
    get_ref = Store.get_ref

    def counted(self: Store, namespace: str, name: str, *args: Any, **kw: Any) -> Any:
        read.append(f"{namespace}/{name}")
        return get_ref(self, namespace, name, *args, **kw)

    monkeypatch.setattr(Store, "get_ref", counted)
    now = current(store, "shop", publishing="the-next-run")
    assert now is not None
    assert [r.run_id for r in now.rows.runs] == [cold, strict]
    assert not [r for r in read if not r.startswith("site/")], read  # no manifest, no point
    full = [r for r in now.rows.runs if r.full]
    assert _trend_view(now.trend("9999", 9)) == _trend_view(history(store, "shop", last=9))
    assert _trend_view(now.trend(full[0].created_at, 9))[-1][0] == full[0].run_id
    assert now.trend("9999", 1) == [now.rows.runs[-1].model_dump(exclude={"statuses", "flaky"})]

    # the rows forgot the strict run (its refresh failed): its manifest is read, its row made
    rows = data.load(store, "shop")
    assert rows is not None
    data.save(store, rows.model_copy(update={"runs": [r for r in rows.runs if r.run_id == cold]}))
    read.clear()
    again = current(store, "shop", publishing="the-next-run")
    assert again is not None and [r.run_id for r in again.rows.runs] == [cold, strict]
    assert f"runs/{strict}" in read and f"runs/{cold}" not in read
    assert _trend_view(again.trend("9999", 9)) == _trend_view(now.trend("9999", 9))

    # a run whose manifest is gone is not in the trend, whatever the rows say
    (store_dir / "v1" / "refs" / "runs" / strict).unlink()
    gone = current(store, "shop", publishing="the-next-run")
    assert gone is not None and [r.run_id for r in gone.rows.runs] == [cold]
    assert current(store, "no such set", publishing="x") is None  # the caller reads manifests


def test_case_history_lines_are_the_first_of_them_all_sorted(monkeypatch: pytest.MonkeyPatch) -> None:
    """The case history keeps only the lines it shows while it ranks every case × metric
    (flaky first, most flips first, then by case and metric): the lines, and the counts of
    lines and flaky ones, are those of a sort of every line, whatever the runs hold."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from evalsnap.reports import site
    from evalsnap.reports._site_data import RunRow, SetData
    from evalsnap.reports.history import flips

    status = st.sampled_from(["PASSED", "FAILED", "NOT_EVALUATED", "INFORMATIONAL"])
    cases = st.dictionaries(st.sampled_from("abcdefg"), st.dictionaries(
        st.sampled_from(["m1", "m2", "m3"]), status, min_size=1), min_size=1)
    run_data = st.lists(st.tuples(cases, st.sets(st.tuples(st.sampled_from("abcdefg"),
                                                          st.sampled_from(["m1", "m2"])))),
                        min_size=1, max_size=5)

    def row(n: int, statuses: dict[str, dict[str, str]], flaky: set[tuple[str, str]]) -> RunRow:
        flaky_by_case: dict[str, list[str]] = {}
        for case, metric in sorted(flaky):
            if metric in statuses.get(case, {}):
                flaky_by_case.setdefault(case, []).append(metric)
        return RunRow(run_id=f"20261203T00000{n}Z-abcdef", record_id="sha256:" + "0" * 64,
                      kind="run", created_at=f"2026-12-03T00:00:0{n}Z", full=True,
                      covers="full", passed=False, complete=True, cases=len(statuses),
                      metrics={}, regressions=None, fixes=None, baseline_run=None,
                      duration=None, cost=None, cost_note=None, statuses=statuses,
                      flaky=flaky_by_case)

    @settings(max_examples=60, deadline=None)
    @given(run_data, st.integers(min_value=1, max_value=12))
    def check(runs_data: list[Any], shown: int) -> None:
        monkeypatch.setattr(site, "CASE_LINES", shown)
        runs = [row(i, s, f) for i, (s, f) in enumerate(runs_data)]
        made = site._case_history(SetData(eval_set_id="s", runs=runs))
        every = []  # every line, sorted as the page orders them
        pairs = {(c, m) for r in runs for c, ms in r.statuses.items() for m in ms}
        for case, metric in pairs:
            statuses = [r.statuses.get(case, {}).get(metric) for r in runs]
            disagreed = [metric in r.flaky.get(case, []) for r in runs]
            n = flips([x for x in statuses if x is not None])
            every.append((not (n > 0 or any(disagreed)), -n, case, metric))
        every.sort()
        assert [(not line["flaky"], -line["flips"], line["eval_id"], line["metric"])
                for line in made["lines"]] == every[:shown]
        assert made["n_lines"] == len(every)
        assert made["n_flaky"] == sum(not stable for stable, *_ in every)

    check()
