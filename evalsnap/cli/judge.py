"""CLI commands: replay. Registered on ``evalsnap.cli._app.app``."""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated

import typer

from evalsnap.cli._app import JsonOpt, OptionOpt, RunArg, StoreOpt, _emit, _handled, _open_store, app


@app.command()
def replay(
    record: RunArg,
    store: StoreOpt = ".evalsnap",
    storage_option: OptionOpt = None,
    agent: Annotated[str | None, typer.Option(
        "--agent", help="Agent package to import first (models or evaluators it registers)")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Parse and aggregate the recorded judge answers again; no model is called, nothing is
    written. Exit 2 when a judge request no longer matches the ledger."""
    from evalsnap.reports.replay import replay as replay_record

    logging.getLogger("google_adk").setLevel(logging.ERROR)
    with _handled():
        result = asyncio.run(replay_record(_open_store(store, storage_option), record,
                                           agent_dir=agent))
    _emit(result, as_json)
    raise typer.Exit(result.exit_code)
