"""CLI commands: verify, import-adk-history. Registered on ``evalsnap.cli.app``."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer

from evalsnap import repo
from evalsnap.cli import (
    JsonOpt,
    OptionOpt,
    StoreOpt,
    _handled,
    _storage_options,
    app,
    err,
    out,
)


def _print_json(value: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(value, default=str) + "\n")
    sys.stdout.flush()


@app.command()
def verify(
    store: StoreOpt = ".evalsnap",
    storage_option: OptionOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Re-hash and parse every object, follow every run manifest. Exit 1 if anything is wrong."""
    from evalsnap.verify import verify_store

    with _handled():
        repo.configure_store(store, _storage_options(storage_option))
        s = repo.open_store(store)
        s.check(write=False)
        report = verify_store(s)
    if as_json:
        _print_json(report.as_dict())
    else:
        counted = ", ".join(f"{n} {kind}" for kind, n in report.objects.items())
        out.print(f"{report.store}: {counted}; {report.runs} run manifest(s)", highlight=False)
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
    from evalsnap.adk_history import import_history

    with _handled():
        repo.configure_store(store, _storage_options(storage_option))
        s = repo.open_store(store)
        s.check()
        imported = import_history(s, directory, app_name)
    if as_json:
        _print_json({"store": s.url, "imported": imported})
        return
    for item in imported:
        out.print(f"{item['file']} → run {item['run_id']} record {item['record_id']} "
                  f"({item['cases']} case(s), {item['units']} unit(s))", highlight=False)
