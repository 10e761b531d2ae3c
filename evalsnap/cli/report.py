"""CLI commands: report, history, site. Registered on ``evalsnap.cli._app.app``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from evalsnap import errors
from evalsnap.cli._app import (
    JsonOpt,
    OptionOpt,
    RunArg,
    StoreOpt,
    _handled,
    _open_store,
    _opened,
    _print_json,
    app,
    err,
    out,
)
from evalsnap.records import repo


def _write(path: str, data: bytes, what: str) -> str:
    """Writes a local output file whole (temp file + rename); returns its absolute path."""
    target = Path(path).expanduser().absolute()
    if target.is_dir():
        raise errors.InputFileError(f"{what} {target} is a directory; name a file, "
                                    f"e.g. {target / 'report.html'}.")
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise errors.InputFileError(f"cannot write {what} {target}: {exc.strerror or exc}; "
                                    "check that its folder exists and can be written.") from exc
    return str(target)


@app.command()
def report(
    record: RunArg,
    html_out: Annotated[str | None, typer.Option(
        "--html", help="Write the self-contained HTML page here")] = None,
    junit_out: Annotated[str | None, typer.Option(
        "--junit", help="Write JUnit XML here (one test case per case × metric)")] = None,
    store: StoreOpt = ".evalsnap",
    storage_option: OptionOpt = None,
    last: Annotated[int, typer.Option(
        "--last", min=1, help="Runs of the eval set in the page's trend, this one included")] = 10,
    baseline: Annotated[str | None, typer.Option(
        help="Record to mark regressions against, or 'last-good' (of the record's eval set, "
             "the record's own run left out); default: the record's previous record")] = None,
    store_page: Annotated[bool, typer.Option(
        "--store-page", help="Write the record's page into the store beside it, as its run "
                             "does (for a page the run could not write: `verify` notes it)")] = False,
) -> None:
    """Write a record as an HTML page (trend, failing cases first, judge ledger) and/or JUnit XML."""
    from evalsnap.reports.html import render, report_url, store_report
    from evalsnap.reports.junit import junit_xml

    with _handled():
        if not html_out and not junit_out and not store_page:
            raise errors.UsageError("say what to write: --html OUT.html, --junit FILE.xml "
                                    "and/or --store-page.")
        s = _open_store(store, storage_option, write=store_page)
        oid, rec = repo.resolve_record(s, record)
        base = _baseline(s, rec, baseline) if baseline else None
        written = []
        if store_page:
            store_report(s, oid, rec, again=True)
            written.append(report_url(s, oid))
        if html_out:
            page = render(s, oid, rec, trend_runs=last, baseline_oid=base)
            written.append(_write(html_out, page.encode("utf-8"), "HTML report"))
        if junit_out:
            written.append(_write(junit_out, junit_xml(s, oid, rec), "JUnit file"))
    for path in written:
        out.print(f"wrote {path}", highlight=False, soft_wrap=True)


def _baseline(s: Any, rec: Any, baseline: str) -> str | None:
    """The record ``--baseline`` names (``last-good``: of the record's eval set, never the
    record's own run; None when there is none yet)."""
    from evalsnap.records.marks import LAST_GOOD

    if baseline != LAST_GOOD:
        return repo.resolve_record(s, baseline)[0]
    from evalsnap.reports.lastgood import last_good

    found = last_good(s, rec.eval_set_id, exclude_run=repo.ref_name(rec.run_id))
    if found is None:
        err.print(f"[yellow]note:[/] eval set {escape(rec.eval_set_id)} has no last-good run "
                  "yet; regressions are marked against the previous record", highlight=False)
        return None
    return found.manifest.record_oid


@app.command()
def history(
    evalset: Annotated[str, typer.Argument(help="Eval set id (as `evalsnap ls` shows it)")],
    store: StoreOpt = ".evalsnap",
    storage_option: OptionOpt = None,
    last: Annotated[int | None, typer.Option(
        "--last", min=1, help="Only the N newest runs")] = None,
    flaky: Annotated[bool, typer.Option(
        "--flaky", help="The cases whose status flipped within the last N runs (--last, "
                        "default 10), with how often")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Per metric, the pass rate and mean score of every run of an eval set, newest last."""
    from evalsnap.reports.history import history as runs_of
    from evalsnap.reports.history import history_table

    if flaky:
        return _flaky(evalset, store, storage_option, last or 10, as_json)
    with _opened(store, storage_option) as s:
        points = runs_of(s, evalset, last)
        if not points:
            raise errors.NotFoundError(f"no readable run of eval set {evalset!r} in store "
                                       f"{s.url}; list eval sets and runs with `evalsnap ls`.")
    if as_json:
        _print_json({"store": s.url, "eval_set_id": evalset, "runs": points})
    else:
        out.print(history_table(evalset, points))


def _flaky(evalset: str, store: str, storage_option: list[str] | None, last: int,
           as_json: bool) -> None:
    """``history EVALSET --flaky``."""
    from evalsnap.reports.history import _runs_of, flaky_cases, flaky_table

    with _opened(store, storage_option) as s:
        if not _runs_of(s, evalset):
            raise errors.NotFoundError(f"no run of eval set {evalset!r} in store {s.url}; list "
                                       "eval sets and runs with `evalsnap ls`.")
        entries = flaky_cases(s, evalset, last)
    if as_json:
        _print_json({"store": s.url, "eval_set_id": evalset, "last": last, "flaky": entries})
    else:
        out.print(flaky_table(evalset, entries, last))


@app.command()
def site(
    out_dir: Annotated[str | None, typer.Option(
        "--out", help="Write the whole site into this folder (created if needed); open "
                      "its index.html")] = None,
    store: StoreOpt = ".evalsnap",
    storage_option: OptionOpt = None,
    store_site: Annotated[bool, typer.Option(
        "--store-site", help="Rewrite the store's own site (v1/site/) whole, as every run "
                             "refreshes its part of it")] = False,
) -> None:
    """Write the browsable site of the store: eval sets, runs, trends, case history, run pages."""
    from evalsnap.reports.site import CONTENT_TYPE, build, write_dir

    with _handled():
        if not out_dir and not store_site:
            raise errors.UsageError("say where to write the site: --out DIR and/or "
                                    "--store-site.")
        target = Path(out_dir).expanduser().absolute() if out_dir else None
        if target is not None and target.exists() and not target.is_dir():
            raise errors.InputFileError(f"--out {target} is a file; name a folder (it is "
                                        "created if needed), e.g. ./site.")
        s = _open_store(store, storage_option, write=store_site)
        pages = build(s, save=store_site)
        written = []
        if store_site:
            s.put_site(pages, CONTENT_TYPE)
            from evalsnap import settings

            written.append(s.site_link("index.html", public_url=settings.get().public_url))
        if target is not None:
            try:
                root = write_dir(target, pages)
            except OSError as exc:
                raise errors.InputFileError(
                    f"cannot write the site into {target}: {exc.strerror or exc}; check that "
                    "the folder can be written.") from exc
            written.append(str(root / "index.html"))
    for path in written:
        out.print(f"wrote {path} ({len(pages)} pages)", highlight=False, soft_wrap=True)
