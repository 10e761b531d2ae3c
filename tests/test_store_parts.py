"""A ref or a site page written as its parts (a page as it is rendered): the same bytes as
written whole; a failure while the parts come leaves the page that was there, and no
temporary file; a page is never held whole on local disk."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import jinja2
import pytest

from evalsnap.reports.html import render_bytes, render_parts
from storage import Store


def _parts(n: int, fail_at: int | None = None) -> Iterator[bytes]:
    for i in range(n):
        if i == fail_at:
            raise RuntimeError("the page could not be rendered")
        yield f"<p>{i}</p>".encode() * 1000


@pytest.fixture(params=["local", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    url = str(tmp_path / "store") if request.param == "local" else f"memory://{uuid.uuid4().hex}"
    return Store(url)


def test_parts_are_written_as_the_whole(store: Store, tmp_path: Path) -> None:
    store.put_ref("reports", "a.html", _parts(5), content_type="text/html; charset=utf-8")
    assert store.get_ref("reports", "a.html") == b"".join(_parts(5))
    store.put_site({"runs/x/index.html": _parts(3), "index.html": b"<p>index</p>"},
                   "text/html; charset=utf-8")
    if store.url.startswith("memory://"):
        return  # the site is for browsers: nothing reads it back but a browser (or a file)
    site = tmp_path / "store" / "v1" / "site"
    assert (site / "runs" / "x" / "index.html").read_bytes() == b"".join(_parts(3))
    assert (site / "index.html").read_bytes() == b"<p>index</p>"


def test_a_failure_while_the_parts_come_leaves_the_page_there(store: Store,
                                                              tmp_path: Path) -> None:
    store.put_ref("reports", "a.html", b"old page")
    with pytest.raises(RuntimeError, match="could not be rendered"):
        store.put_ref("reports", "a.html", _parts(5, fail_at=3))
    assert store.get_ref("reports", "a.html") == b"old page"
    if not store.url.startswith("memory://"):
        left = [f for _, _, files in os.walk(tmp_path / "store" / "v1" / "refs") for f in files]
        assert left == ["a.html"]  # no temporary file left behind


def test_a_str_is_refused_as_before(store: Store) -> None:
    with pytest.raises(TypeError, match="must be bytes"):
        store.put_ref("reports", "a.html", "<p>not bytes</p>")  # type: ignore[arg-type]


def test_a_page_in_parts_is_the_page_rendered_whole() -> None:
    page = jinja2.Template("{% for i in range(n) %}<p>{{ i }} é</p>{% endfor %}")
    parts = list(render_parts(page, n=200_000))
    assert len(parts) > 1  # a MB at a time
    assert b"".join(parts) == page.render(n=200_000).encode() == render_bytes(page, n=200_000)
