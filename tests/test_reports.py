"""``report`` (HTML page, JUnit XML), ``history``, and the page every run publishes.

One store, made by the real CLI (in the test process, :mod:`tests._cli`): record A (``run`` of the shop agent,
whose eval set carries markup in one reference answer), then record B (``rescore A
--reuse`` with stricter thresholds: units that passed in A fail in B, 0 agent calls).
Every number the tests expect is computed from ``show --json`` of the same record.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from evalsnap.records import repo
from tests._cli import run_inproc
from tests.conftest import copy_shop

PAYLOAD = "Expect rain <script>alert(1)</script><img src=x onerror=alert(2)> \"q\" & 'a' </td></table>"
CRAFTED_CASE = "weather_paris_stale_reference"
PASSING = ("PASSED", "INFORMATIONAL")


def _ok(r: Any, what: str) -> dict[str, Any]:
    assert r.code in (0, 1, 3), f"expected {what} to finish, got exit {r.code}: {r.stderr[-3000:]}"
    return r.json


def crafted_shop(root: Path) -> tuple[Path, Path]:
    """A copy of the demo agent whose eval set holds markup in one expected answer."""
    agent = copy_shop(root / "agents" / "shop_agent")
    evalset = agent / "shop.evalset.json"
    data = json.loads(evalset.read_text("utf-8"))
    case = next(c for c in data["eval_cases"] if c["eval_id"] == CRAFTED_CASE)
    case["conversation"][-1]["final_response"]["parts"] = [{"text": PAYLOAD}]
    evalset.write_text(json.dumps(data), "utf-8")
    return agent, evalset


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("reports")
    agent, evalset = crafted_shop(root)
    config = json.loads((agent / "test_config.json").read_text("utf-8"))
    config["criteria"]["response_match_score"] = 0.8
    config["criteria"]["rubric_based_final_response_quality_v1"]["threshold"] = 0.75
    strict = agent / "strict_config.json"  # beside the agent: its plugins resolve from there
    strict.write_text(json.dumps(config), "utf-8")
    store = str(root / "store")
    a = _ok(run_inproc("run", str(agent), str(evalset), "--store", store, "--json"), "run A")
    b = _ok(run_inproc("rescore", a["run_id"], "--config", str(strict), "--store", store, "--reuse",
                    "--json"), "rescore B")
    shows = {}
    for name, r in (("a", a), ("b", b)):
        shown = run_inproc("show", r["run_id"], "--store", store, "--json")
        assert shown.code == 0, shown.stderr[-2000:]
        shows[name] = shown.json
    return {"root": root, "store": store, "a": a, "b": b, "show": shows}


def _units(shown: dict[str, Any]) -> dict[tuple[str, int, str], dict[str, Any]]:
    return {(c["eval_id"], c["repetition"], n): m for c in shown["cases"]
            for n, m in c["metrics"].items()}


def _stats(shown: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for (_, _, name), m in _units(shown).items():
        s = out.setdefault(name, {"units": 0, "passed": 0, "scores": []})
        s["units"] += 1
        s["passed"] += m["status"] in PASSING
        if m["score"] is not None:
            s["scores"].append(m["score"])
    return out


class Page(HTMLParser):
    """The texts of the elements a test reads, by their data-* attributes, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[dict[str, str]] = []
        self.fields: dict[str, str] = {}
        self.stats: dict[tuple[str, str], str] = {}
        self.units: dict[tuple[str, str, str], str] = {}
        self.counts: dict[str, str] = {}
        self.cases: list[tuple[str, str]] = []
        self.text: dict[int, list[str]] = {}
        self.tags: list[str] = []
        self.trend_points: dict[str, list[str]] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.tags.append(tag)
        if tag == "details" and "data-verdict" in a:
            self.cases.append((a["data-case"], a["data-verdict"]))
        if tag == "circle" and "data-pass-rate" in a:
            metric = next(s["data-trend"] for s in reversed(self.stack) if "data-trend" in s)
            self.trend_points.setdefault(metric, []).append(a["data-run"])
        if tag in ("br", "img", "meta", "circle", "rect", "polyline"):
            return
        self.stack.append(a)
        self.text[len(self.stack)] = []

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or tag in ("br", "img", "meta", "circle", "rect", "polyline"):
            return
        a = self.stack.pop()
        text = "".join(self.text.pop(len(self.stack) + 1, [])).strip()
        if len(self.stack) in self.text:
            self.text[len(self.stack)].append(text)
        inner = {k: v for s in self.stack for k, v in s.items()}
        if "data-field" in a:
            self.fields[a["data-field"]] = text
        if "data-count" in a:
            self.counts[a["data-count"]] = text
        if "data-stat" in a and "data-case" in inner:
            self.units[(inner["data-case"], inner["data-metric"], a["data-stat"])] = text
        elif "data-stat" in a and "data-metric" in inner:
            self.stats[(inner["data-metric"], a["data-stat"])] = text

    def handle_data(self, data: str) -> None:
        if self.stack:
            self.text[len(self.stack)].append(data)


def parse_page(text: str) -> Page:
    page = Page()
    page.feed(text)
    return page


def check_numbers(page: Page, shown: dict[str, Any], summary: dict[str, Any]) -> None:
    """The page's header, metric table and unit rows equal the record's (show --json)."""
    record = shown["record"]
    assert page.fields["record_id"] == shown["record_id"]
    assert page.fields["eval_set_id"] == record["eval_set_id"]
    assert page.fields["agent_calls"] == str(record["summary"]["agent_calls"])
    assert page.fields["judge_calls"] == str(record["summary"]["judge_calls"])
    assert page.fields["created_at"] == record["created_at"]
    total = (shown["agent_tokens"] or {}).get("total_tokens")
    if total is not None:
        assert page.fields["agent_tokens"].startswith(f"{total:,}")
    for name, s in _stats(shown).items():
        assert page.stats[(name, "passed")] == str(s["passed"]), name
        assert page.stats[(name, "units")] == str(s["units"]), name
        assert page.stats[(name, "pass_rate")] == f"{100 * s['passed'] / s['units']:.1f}%", name
        mean = sum(s["scores"]) / len(s["scores"]) if s["scores"] else None
        assert page.stats[(name, "mean_score")] == ("—" if mean is None else f"{mean:.3f}"), name
    for (eval_id, _, name), m in _units(shown).items():
        assert page.units[(eval_id, name, "status")].startswith(m["status"]), (eval_id, name)
        assert page.units[(eval_id, name, "score")] == (
            "—" if m["score"] is None else f"{m['score']:.3f}"), (eval_id, name)
        assert page.units[(eval_id, name, "threshold")] == f"{m['threshold']:.3f}", (eval_id, name)
    verdicts = [v for _, v in page.cases]
    counts = {k: verdicts.count(k) for k in ("passed", "failed", "incomplete")}
    assert {k: int(page.counts[k]) for k in counts} == counts
    assert len(page.cases) == len(summary["cases"])


def test_report_html_numbers_equal_the_record(made: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "b.html"
    r = run_inproc("report", made["b"]["run_id"], "--store", made["store"], "--html", str(out))
    assert r.code == 0, r.stderr[-3000:]
    assert str(out) in r.stdout
    text = out.read_text("utf-8")
    check_numbers(parse_page(text), made["show"]["b"], made["b"])
    # self-contained: nothing to fetch, nothing to run; the one URL out is the link (an
    # anchor, followed only when clicked) to the flow run that published it
    links_out = re.findall(r'<a href="(https?://[^"]*)" data-link="flow-run">', text)
    assert len(links_out) == 1, links_out
    rest = text.replace(f'<a href="{links_out[0]}"', "")
    assert "<script" not in text.lower() and "http://" not in rest and "https://" not in rest
    assert "default-src 'none'" in text


def test_store_strings_are_escaped(made: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "a.html"
    r = run_inproc("report", made["a"]["run_id"], "--store", made["store"], "--html", str(out))
    assert r.code == 0, r.stderr[-3000:]
    text = out.read_text("utf-8")
    page = parse_page(text)
    assert "<script>alert" not in text and "<img src=x" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=alert(2)&gt;" in text
    assert "img" not in page.tags and "script" not in page.tags, "stored text became markup"


def test_regressed_and_failing_cases_first(made: dict[str, Any], tmp_path: Path) -> None:
    a, b = _units(made["show"]["a"]), _units(made["show"]["b"])
    regressed = {k for k, m in b.items() if k in a and (
        (a[k]["status"] in PASSING and m["status"] == "FAILED")
        or (a[k]["complete"] and not m["complete"]))}
    assert regressed, "expected the stricter thresholds to make passing units fail"
    out = tmp_path / "b.html"
    r = run_inproc("report", made["b"]["run_id"], "--store", made["store"], "--html", str(out),
                "--baseline", made["a"]["run_id"])
    assert r.code == 0, r.stderr[-3000:]
    page = parse_page(out.read_text("utf-8"))
    assert page.counts["regressed"] == str(len(regressed))
    regressed_cases = {k[0] for k in regressed}
    order = [case for case, _ in page.cases]
    assert set(order[:len(regressed_cases)]) == regressed_cases, order
    failing = {k[0] for k, m in b.items() if m["status"] == "FAILED"}
    rest = order[len(regressed_cases):]
    assert set(rest[:len(failing - regressed_cases)]) == failing - regressed_cases, order


def test_a_large_run_details_its_worst_cases_only(made: dict[str, Any], tmp_path: Path) -> None:
    """Past ``EVALSNAP_REPORT_DETAIL_CASES`` cases, the page shows the conversation and judge
    ledger of the first ones in its order (regressed, failed, incomplete) and the scores of
    every case: its size stays bounded whatever the run's size."""
    full_page = tmp_path / "full.html"
    small_page = tmp_path / "small.html"
    args = ("report", made["b"]["run_id"], "--store", made["store"], "--baseline",
            made["a"]["run_id"])
    assert run_inproc(*args, "--html", str(full_page)).code == 0
    r = run_inproc(*args, "--html", str(small_page), env={"EVALSNAP_REPORT_DETAIL_CASES": "2"})
    assert r.code == 0, r.stderr[-3000:]
    full, small = full_page.read_text("utf-8"), small_page.read_text("utf-8")
    cases = len(made["b"]["cases"])
    assert full.count('<table class="conversation">') == cases > 2
    assert small.count('<table class="conversation">') == 2
    assert 'data-field="details_shown"' in small and 'data-field="details_shown"' not in full
    assert len(small) < len(full)
    page = parse_page(small)
    check_numbers(page, made["show"]["b"], made["b"])  # every case's scores still shown
    detailed = re.findall(r'<details class="case"[^>]*data-case="([^"]+)"[^>]*><summary>.*?'
                          r'</summary>(<table class="conversation">)?', small, re.S)
    assert [bool(conv) for _, conv in detailed] == [True, True] + [False] * (cases - 2)
    assert [c for c, _ in detailed] == [c for c, _ in parse_page(full).cases]  # same order


def test_junit_one_testcase_per_case_and_metric(made: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "b.xml"
    r = run_inproc("report", made["b"]["run_id"], "--store", made["store"], "--junit", str(out))
    assert r.code == 0, r.stderr[-3000:]
    root = ET.parse(out).getroot()
    suite = root.find("testsuite")
    assert suite is not None and suite.get("name") == "shop"
    units = _units(made["show"]["b"])
    cases = {(tc.get("classname"), tc.get("name")): tc for tc in suite.iter("testcase")}
    assert set(cases) == {(f"shop.{e}", n) for e, _, n in units}
    for (eval_id, _, name), m in units.items():
        tc = cases[(f"shop.{eval_id}", name)]
        kinds = [child.tag for child in tc]
        if not m["complete"]:
            assert kinds == ["error"], (eval_id, name)
        elif m["status"] == "FAILED":
            assert kinds == ["failure"], (eval_id, name)
            assert f"{m['threshold']:.3f}" in tc.find("failure").get("message")
        else:
            assert kinds == [], (eval_id, name)
    failures = sum(m["complete"] and m["status"] == "FAILED" for m in units.values())
    errors = sum(not m["complete"] for m in units.values())
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == (
        str(len(units)), str(failures), str(errors))
    assert failures > 0 and errors > 0, "the demo has failing and unevaluated units"
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["record_id"] == made["b"]["record_id"]


def test_history_json_and_table(made: dict[str, Any]) -> None:
    r = run_inproc("history", "shop", "--store", made["store"], "--json")
    assert r.code == 0, r.stderr[-3000:]
    runs = r.json["runs"]
    assert [p["run_id"] for p in runs] == [made["a"]["run_id"], made["b"]["run_id"]]  # newest last
    for point, name in zip(runs, ("a", "b"), strict=True):
        for metric, s in _stats(made["show"][name]).items():
            got = point["metrics"][metric]
            assert (got["units"], got["passed"]) == (s["units"], s["passed"]), metric
            assert got["pass_rate"] == pytest.approx(s["passed"] / s["units"])
            assert got["mean_score"] == pytest.approx(sum(s["scores"]) / len(s["scores"]))
    last = run_inproc("history", "shop", "--store", made["store"], "--json", "--last", "1")
    assert [p["run_id"] for p in last.json["runs"]] == [made["b"]["run_id"]]
    table = run_inproc("history", "shop", "--store", made["store"], env={"COLUMNS": "200"})
    assert table.code == 0 and made["b"]["run_id"] in table.stdout
    assert "response_match_score" in table.stdout
    missing = run_inproc("history", "no-such-set", "--store", made["store"])
    assert missing.code == 2 and "evalsnap ls" in missing.stderr


def test_every_run_publishes_its_report_after_its_commit(made: dict[str, Any]) -> None:
    """Commit, then present (issue 26 item 6): the page is written after the manifest, so a
    signal waits only for the commit; `evalsnap report` renders a missing page again."""
    store = Path(made["store"])
    for name in ("a", "b"):
        hexid = made[name]["record_id"].removeprefix("sha256:")
        page_file = store / "v1" / "refs" / "reports" / f"{hexid}.html"
        manifest = store / "v1" / "refs" / "runs" / made[name]["run_id"]
        assert page_file.is_file(), f"expected the run to publish {page_file}"
        assert page_file.with_suffix(".json").is_file(), "expected its history point beside it"
        assert page_file.stat().st_mtime_ns >= manifest.stat().st_mtime_ns
        page = parse_page(page_file.read_text("utf-8"))
        check_numbers(page, made["show"][name], made[name])
    # B's trend shows A then B
    assert page.trend_points["response_match_score"] == [made["a"]["run_id"], made["b"]["run_id"]]


def test_the_page_has_the_duration_and_links_its_flow_run(made: dict[str, Any]) -> None:
    """The page says how long the run took and links the Prefect flow run that published
    it (the server's UI page of a flow run that exists); made again by `report
    --store-page`, it still does (the link is kept in the history point)."""
    import asyncio
    import uuid

    from prefect.client.orchestration import get_client

    from evalsnap.reports.history import duration

    store = Path(made["store"])
    hexid = made["b"]["record_id"].removeprefix("sha256:")
    page_file = store / "v1" / "refs" / "reports" / f"{hexid}.html"
    shown = made["show"]["b"]
    seconds = duration(made["b"]["run_id"], shown["record"]["created_at"])
    assert seconds is not None and seconds < 600, made["b"]["run_id"]
    page = parse_page(page_file.read_text("utf-8"))
    assert page.fields["duration"] == (f"{seconds:.0f} s" if seconds < 120
                                       else f"{seconds / 60:.1f} min")
    found = re.search(r'<a href="([^"]+)" data-link="flow-run">', page_file.read_text("utf-8"))
    assert found, "expected a link to the flow run"
    ui = os.environ["PREFECT_API_URL"].removesuffix("/api")
    assert found[1].startswith(f"{ui}/"), found[1]
    run_id = found[1].rsplit("/", 1)[-1]

    async def read() -> Any:
        async with get_client() as client:
            return await client.read_flow_run(uuid.UUID(run_id))

    assert asyncio.run(read()).state.is_final()
    page_file.unlink()
    again = run_inproc("report", made["b"]["run_id"], "--store", made["store"], "--store-page")
    assert again.code == 0, again.stderr[-2000:]
    assert f'<a href="{found[1]}" data-link="flow-run">' in page_file.read_text("utf-8")
    # a crafted point cannot make the page link anything but a web page
    point_file = page_file.with_suffix(".json")
    point = json.loads(point_file.read_text("utf-8"))
    point_file.write_text(json.dumps({**point, "flow_run_url": "javascript:alert(1)"}), "utf-8")
    html_out = Path(made["root"]) / "crafted.html"
    crafted = run_inproc("report", made["b"]["run_id"], "--store", made["store"], "--html",
                         str(html_out))
    assert crafted.code == 0, crafted.stderr[-2000:]
    assert "javascript:" not in html_out.read_text("utf-8")
    point_file.write_text(json.dumps(point), "utf-8")


def test_summary_artifact_links_the_report(made: dict[str, Any]) -> None:
    """Each run's link artifact (Prefect stores a link as markdown ``[text](url)``) and its
    summary name the stored page, read back from the test's prefect server."""
    import asyncio

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    async def read() -> list[Any]:
        async with get_client() as client:
            return await client.read_artifacts(artifact_filter=ArtifactFilter(
                key=ArtifactFilterKey(any_=["evalsnap-shop-report", "evalsnap-shop-summary"])))

    artifacts = asyncio.run(read())
    s = repo.open_store(made["store"])
    for name in ("a", "b"):
        hexid = made[name]["record_id"].removeprefix("sha256:")
        url = (Path(s.url) / "v1" / "refs" / "reports" / f"{hexid}.html").as_uri()
        links = [x for x in artifacts if x.key == "evalsnap-shop-report"
                 and str(x.data).endswith(f"]({url})")]
        assert links, f"expected a link artifact to {url}"
        assert any(x.key == "evalsnap-shop-summary" and url in str(x.data) for x in artifacts)


def test_report_usage_errors(made: dict[str, Any], tmp_path: Path) -> None:
    nothing = run_inproc("report", "latest", "--store", made["store"])
    assert nothing.code == 2 and "--html" in nothing.stderr
    unknown = run_inproc("report", "no-such-run", "--store", made["store"], "--html",
                      str(tmp_path / "x.html"))
    assert unknown.code == 2 and "evalsnap ls" in unknown.stderr
    folder = run_inproc("report", "latest", "--store", made["store"], "--html", str(tmp_path))
    assert folder.code == 2 and "directory" in folder.stderr


def test_history_does_not_trust_a_damaged_point(made: dict[str, Any], tmp_path: Path) -> None:
    """A history point that is not one, or names another record, is ignored: the run is
    measured from its units (a copy of the store, so the other tests keep theirs)."""
    store = tmp_path / "store"
    shutil.copytree(made["store"], store)
    points = store / "v1" / "refs" / "reports"
    a_hex = made["a"]["record_id"].removeprefix("sha256:")
    b_hex = made["b"]["record_id"].removeprefix("sha256:")
    (points / f"{a_hex}.json").write_text('{"run_id": "x", "metrics": 7}', "utf-8")
    lie = json.loads((points / f"{b_hex}.json").read_text("utf-8"))
    lie["record_id"] = made["a"]["record_id"]  # a valid point, of another record
    (points / f"{b_hex}.json").write_text(json.dumps(lie), "utf-8")
    r = run_inproc("history", "shop", "--store", str(store), "--json")
    assert r.code == 0, r.stderr[-3000:]
    assert "unusable" in r.stderr
    for point, name in zip(r.json["runs"], ("a", "b"), strict=True):
        assert point["record_id"] == made[name]["record_id"]
        for metric, s in _stats(made["show"][name]).items():
            assert point["metrics"][metric]["passed"] == s["passed"], (name, metric)


def test_s3_store_publishes_and_reports(tmp_path: Path) -> None:
    """On S3 (moto): the run publishes its page into the bucket, and ``report`` with
    ``--storage-option`` renders the same page from there."""
    import fsspec

    from tests.servers import s3_create_bucket, start_moto
    from tests.test_remote_stores import _env

    agent = copy_shop(tmp_path / "shop_agent")
    server = start_moto()
    try:
        s3_create_bucket(server, "reports")
        url, option = "s3://reports/nightly", f"endpoint_url={server.url}"
        env = _env()
        # two metrics, no judge: what is published and reported does not depend on which
        # metrics there are (final_state_match fails on cart_state_mismatch)
        metrics = ("--metric", "response_match_score", "--metric", "final_state_match")
        r = run_inproc("run", str(agent), str(agent / "shop.evalset.json"), "--store", url,
                    "--storage-option", option, "--case", "weather_paris", "--case",
                    "cart_state_mismatch", *metrics, "--json", env=env)
        assert r.code == 1, r.stderr[-3000:]
        fs = fsspec.filesystem("s3", endpoint_url=server.url, key="testing", secret="testing",
                               use_listings_cache=False)
        key = f"reports/nightly/v1/refs/reports/{r.json['record_id'].removeprefix('sha256:')}.html"
        stored = fs.cat_file(key)
        out, junit = tmp_path / "page.html", tmp_path / "junit.xml"
        rep = run_inproc("report", r.json["run_id"], "--store", url, "--storage-option", option,
                      "--html", str(out), "--junit", str(junit), env=env)
        assert rep.code == 0, rep.stderr[-3000:]
        assert out.read_bytes() == stored, "expected the stored page and the command's to agree"
        suite = ET.parse(junit).getroot().find("testsuite")
        assert suite is not None and suite.get("failures") == "1"  # cart_state_mismatch
        assert suite.get("tests") == "4"  # two cases × two metrics

        # One click away: stored as an HTML page, and --json's link (signed: no public URL
        # is set) opens it over plain HTTP, without credentials, until it expires
        import httpx

        assert fs.info(key)["ContentType"] == "text/html; charset=utf-8"
        link = r.json["report_url"]
        assert link.startswith(server.url) and "Signature" in link, link
        import datetime as dt

        expires = dt.datetime.fromisoformat(r.json["report_url_expires"])
        assert dt.timedelta(days=6) < expires - dt.datetime.now(dt.UTC) <= dt.timedelta(days=7)
        got = httpx.get(link, timeout=30)
        assert got.status_code == 200 and got.content == stored
        assert got.headers["content-type"].startswith("text/html")
        # with a public base URL the link is that base + the page's path, with no expiry
        public = run_inproc("run", str(agent), str(agent / "shop.evalset.json"), "--store", url,
                            "--storage-option", option, "--case", "weather_paris", *metrics,
                            "--json", env={**env, "EVALSNAP_PUBLIC_URL": "https://evals.example.com/n/"})
        assert public.code == 0, public.stderr[-3000:]
        assert public.json["report_url"] == (
            "https://evals.example.com/n/v1/refs/reports/"
            f"{public.json['record_id'].removeprefix('sha256:')}.html")
        assert public.json["report_url_expires"] is None
    finally:
        server.stop()


def test_a_page_is_rendered_to_the_same_bytes_a_piece_at_a_time() -> None:
    """Issue 31 (memory): pages are written as they render (a run of 10,000 cases has a
    43 MB page, which jinja's ``render`` held as ~5× that in pieces), to the same bytes."""
    import jinja2

    from evalsnap.reports.html import render_bytes

    page = jinja2.Environment(autoescape=True).from_string(
        "<p>{{ title }}</p>{% for i in items %}<li>{{ i }} → {{ '<x>' }}</li>{% endfor %}")
    values = {"title": "Δ über", "items": [f"case-{n}" * 20 for n in range(20_000)]}
    found = render_bytes(page, **values)
    assert len(found) > 2 << 20 and found == page.render(**values).encode("utf-8")
    assert render_bytes(page, title="", items=[]) == b"<p></p>"


def test_the_scores_table_artifact_is_bounded_and_shows_what_did_not_pass_first() -> None:
    """Issue 31 (memory): a run of 10,000 cases × 7 metrics has 70,000 score rows; the table
    artifact keeps at most ``limit`` of them, those not passed first, each in case order."""
    from evalsnap.reports.artifacts import score_rows, table_rows
    from evalsnap.reports.summary_model import CaseResult, MetricResult, RecordResult, Rows

    def case(n: int) -> CaseResult:
        status = "FAILED" if n % 4 == 1 else "PASSED"
        return CaseResult(eval_id=f"c{n}", inference="success", metrics={
            "a": MetricResult(status=status, score=0.1), "b": MetricResult(status="PASSED")})

    result = RecordResult(run_id="r", kind="run", record_id="x", eval_set_id="s",
                          complete=True, passed=False, exit_code=1,
                          cases=Rows(CaseResult, (case(n) for n in range(40))))
    every = score_rows(result)
    assert len(every) == 80 and table_rows(result, limit=80) == (every, 80)
    rows, total = table_rows(result, limit=15)
    failed = [r for r in every if r["status"] == "FAILED"]
    assert total == 80 and len(rows) == 15 and len(failed) == 10
    assert rows[:10] == failed and rows[10:] == [r for r in every if r["status"] == "PASSED"][:5]
    assert table_rows(result, limit=5)[0] == failed[:5]


def test_a_dicts_keys_read_as_jinja_reads_them() -> None:
    """The page environment reads ``x.name`` of a dict as its key at once (not after a
    failed ``getattr``): what a template gets is what plain jinja gives, methods included."""
    import jinja2

    from evalsnap.reports.html import _environment

    source = ("{{ d.status }}|{{ d.missing }}|{{ d.items is callable }}|{{ d['items'] }}|"
              "{{ d.get('status') }}|{{ o.real }}|{{ d.x.y }}")
    values = {"d": {"status": "<b>PASSED</b>", "items": "a key", "x": {"y": 2}}, "o": 3}
    ours = _environment().from_string(source).render(**values)
    plain = jinja2.Environment(autoescape=True, finalize=lambda v: "" if v is None else v
                               ).from_string(source).render(**values)
    assert ours == plain == "&lt;b&gt;PASSED&lt;/b&gt;||True|a key|&lt;b&gt;PASSED&lt;/b&gt;|3|2"
