"""CLI commands: verify, import-adk-history. Registered on ``evalsnap.cli.app``."""

from __future__ import annotations

from typing import Annotated

import typer

from evalsnap.cli import (
    JsonOpt,
    OptionOpt,
    StoreOpt,
    _handled,
    _open_store,
    _print_json,
    app,
    err,
    out,
)


@app.command()
def verify(
    store: StoreOpt = ".evalsnap",
    storage_option: OptionOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Re-hash and parse every object, follow every run manifest. Exit 1 if anything is wrong."""
    from evalsnap.reports.verify import verify_store

    with _handled():
        s = _open_store(store, storage_option)
        report = verify_store(s)
    if as_json:
        _print_json(report.as_dict())
    else:
        counted = ", ".join(f"{n} {kind}" for kind, n in report.objects.items())
        out.print(f"{report.store}: {counted}; {report.runs} run manifest(s), "
                  f"{report.index_entries} index entries", highlight=False)
        for f in report.findings:
            err.print(f"[red]{f.kind}[/] {f.location}: {f.message}", highlight=False,
                      soft_wrap=True)
        out.print("ok: nothing wrong" if report.ok else
                  f"{len(report.findings)} problem(s) found", highlight=False)
    raise typer.Exit(0 if report.ok else 1)


@app.command(name="import-adk-history")
def import_adk_history(
    directory: Annotated[str, typer.Argument(
        help="An agent's .adk/eval_history directory (or the agent directory)")],
    store: StoreOpt = ".evalsnap",
    storage_option: OptionOpt = None,
    app_name: Annotated[str | None, typer.Option(
        help="App name for the records (default: from each result's id)")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Import ADK *.evalset_result.json files as records of kind 'import' (no snapshot)."""
    from evalsnap.adk.history import import_history

    with _handled():
        s = _open_store(store, storage_option, write=True)
        imported = import_history(s, directory, app_name)
    if as_json:
        _print_json({"store": s.url, "imported": imported})
        return
    for item in imported:
        out.print(f"{item['file']} → run {item['run_id']} record {item['record_id']} "
                  f"({item['cases']} case(s), {item['units']} unit(s))", highlight=False)
