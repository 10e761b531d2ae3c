"""The HTML report in a real headless browser (Debian's ``chromium``).

A run of the shop agent (one reference answer carries markup) publishes its page into
the store; chromium loads that file, and the test reads what the browser made of it: the
DOM after parsing (``--dump-dom``) and every console message (``--enable-logging=stderr``,
where chromium writes each one as ``CONSOLE``). The page has no script and forbids every
fetch, so any console message — a blocked load, a CSP violation, an error — fails the
test; a control page proves that such a message is seen. The numbers in the rendered DOM
must equal those of ``show --json``, and the crafted text must be text, not elements.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests._cli import run_inproc
from tests.test_reports import PAYLOAD, check_numbers, crafted_shop, parse_page

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed "
                                "(apt-get install chromium)")
_CONSOLE = re.compile(r":CONSOLE[:(]\d*\)?\]\s*(.*)")


def browse(url: str, *extra: str, tmp: Path) -> tuple[str, list[str]]:
    """The DOM chromium builds from ``url`` and the console messages it logged."""
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run",
         f"--user-data-dir={tmp / 'profile'}", "--enable-logging=stderr", "--v=0",
         "--virtual-time-budget=2000", *extra, url],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, [m.group(1) for m in _CONSOLE.finditer(proc.stderr)]


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("browser")
    agent, evalset = crafted_shop(root)
    store = root / "store"
    r = run_inproc("run", str(agent), str(evalset), "--store", str(store), "--json")
    assert r.code in (1, 3), r.stderr[-3000:]
    shown = run_inproc("show", r.json["run_id"], "--store", str(store), "--json")
    assert shown.code == 0, shown.stderr[-2000:]
    page = store / "v1" / "refs" / "reports" / (r.json["record_id"].removeprefix("sha256:") + ".html")
    assert page.is_file(), "expected the run to publish its HTML report beside its record"
    return {"root": root, "run": r.json, "show": shown.json, "page": page}


def test_console_messages_are_seen(tmp_path: Path) -> None:
    """The control: a page that breaks the same policy logs what the real one must not."""
    bad = tmp_path / "bad.html"
    bad.write_text("<!doctype html><meta http-equiv='Content-Security-Policy' content=\""
                   "default-src 'none'\"><p>x</p><img src='http://127.0.0.1:9/x.png'>", "utf-8")
    _, console = browse(bad.as_uri(), "--dump-dom", tmp=tmp_path)
    assert any("Content Security Policy" in m for m in console), console


def test_report_renders_without_console_messages(published: dict[str, Any], tmp_path: Path) -> None:
    dom, console = browse(published["page"].as_uri(), "--dump-dom", tmp=tmp_path)
    assert console == [], f"expected a silent console, got {console}"
    page = parse_page(dom)
    check_numbers(page, published["show"], published["run"])
    assert "script" not in page.tags and "img" not in page.tags, "stored text became elements"
    assert PAYLOAD.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;") in dom
    failing_first = [v for _, v in page.cases]
    assert failing_first == sorted(failing_first, key=lambda v: v == "passed"), failing_first


def test_report_screenshot(published: dict[str, Any], tmp_path: Path) -> None:
    shot = tmp_path / "report.png"
    _, console = browse(published["page"].as_uri(), f"--screenshot={shot}",
                        "--window-size=1280,1600", "--hide-scrollbars", tmp=tmp_path)
    assert console == []
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1280, 1600)
    assert len(data) > 50_000, "expected a page with content, not a blank screenshot"
