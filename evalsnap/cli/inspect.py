"""CLI commands: explain, diff, ls. Registered on ``evalsnap.cli._app.app``."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.markup import escape

from evalsnap import exitcodes
from evalsnap.cli._app import JsonOpt, OptionOpt, RunArg, StoreOpt, _opened, _print_json, app, out
from evalsnap.records import marks, repo


@app.command()
def explain(
    record: RunArg,
    store: StoreOpt = ".evalsnap",
    storage_option: OptionOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """For every unit: reused (from which record and run) or scored, and why."""
    from evalsnap.reports.explain import explain as explain_record
    from evalsnap.reports.explain import explain_table

    with _opened(store, storage_option) as s:
        oid, rec = repo.resolve_record(s, record)
        result = explain_record(s, oid, rec)
    if as_json:
        _print_json(result)
    else:
        out.print(explain_table(result))


@app.command()
def diff(
    record_a: Annotated[str, typer.Argument(help="Run id, record id or 'latest' (before)")],
    record_b: Annotated[str, typer.Argument(help="Run id, record id or 'latest' (after)")],
    store: StoreOpt = ".evalsnap",
    storage_option: OptionOpt = None,
    all_rows: Annotated[bool, typer.Option("--all", help="Show unchanged units too")] = False,
    fail_on_change: Annotated[bool, typer.Option(
        "--fail-on-change", help="Exit 1 when any unit changed, was added or removed (0 when "
                                 "nothing moved)")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Per case × metric: score and status changes, and which input moved."""
    from evalsnap.reports.diff import diff as diff_records
    from evalsnap.reports.diff import diff_table, moved, nothing_moved

    with _opened(store, storage_option) as s:
        a_oid, a = repo.resolve_record(s, record_a)
        b_oid, b = repo.resolve_record(s, record_b)
        result = diff_records(s, a_oid, a, b_oid, b)
    if as_json:
        _print_json(result)
    elif moved(result) or all_rows:
        out.print(diff_table(result, all_rows=all_rows))
    else:
        out.print(nothing_moved(result))
    if fail_on_change:
        raise typer.Exit(exitcodes.exit_code(exitcodes.Findings(found=moved(result))))


@app.command(name="ls")
def ls(
    store: StoreOpt = ".evalsnap",
    storage_option: OptionOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Runs, snapshots and records in the store, newest first."""
    with _opened(store, storage_option) as s:
        manifests = repo.list_manifests(s)
        pins, bad_pins = marks.pins(s)
        acceptances, bad_acceptances = marks.accepted(s)

    def marked(name: str, good: dict[str, Any], bad: dict[str, str]) -> Any:
        if name in bad:
            return {"damaged": bad[name]}
        return good[name].model_dump(exclude={"run_id", "eval_set_id", "record_id"}) \
            if name in good else None

    runs: list[dict[str, Any]] = [{"run_id": m.run_id, "kind": m.kind, "created_at": m.created_at,
             "eval_set_id": m.eval_set_id, "app_name": m.app_name,
             "record_id": m.record_oid, "snapshot_id": m.snapshot_oid,
             "passed": m.passed, "complete": m.complete,
             "full": m.full is not False,
             "pinned": marked(repo.ref_name(m.run_id), pins, bad_pins),
             "accepted": marked(repo.ref_name(m.run_id), acceptances, bad_acceptances)}
            for m in manifests]
    snapshots: dict[str, dict[str, Any]] = {}
    for r in runs:  # newest first, so the first run seen is the snapshot's latest use
        if r["snapshot_id"] and r["snapshot_id"] not in snapshots:
            snapshots[r["snapshot_id"]] = {"snapshot_id": r["snapshot_id"],
                                           "eval_set_id": r["eval_set_id"],
                                           "runs": []}
        if r["snapshot_id"]:
            snapshots[r["snapshot_id"]]["runs"].append(r["run_id"])
    records = [{"record_id": r["record_id"], "run_id": r["run_id"], "kind": r["kind"],
                "created_at": r["created_at"]} for r in runs]
    result = {"store": s.url, "runs": runs, "snapshots": list(snapshots.values()),
              "records": records}
    if as_json:
        _print_json(result)
        return
    from rich.table import Table

    from evalsnap.fingerprint import short

    table = Table(title=f"{s.url} — {len(runs)} run(s), newest first")
    table.add_column("created")
    table.add_column("run", no_wrap=True, min_width=max((len(r["run_id"]) for r in runs),
                                                        default=3))
    for column in ("kind", "eval set", "covers", "record", "snapshot", "result", "kept"):
        table.add_column(column)
    for r in runs:
        verdict = ("[green]passed[/]" if r["passed"] else
                   "[red]failed[/]" if r["complete"] else "[yellow]incomplete[/]")
        table.add_row(r["created_at"][:16].replace("T", " "), r["run_id"], r["kind"],
                      r["eval_set_id"], "full" if r["full"] else "[yellow]subset[/]",
                      short(r["record_id"], 8),
                      short(r["snapshot_id"] or "-", 8), verdict, escape(_kept(r)))
    out.print(table)


def _kept(run: dict[str, Any]) -> str:
    """What keeps a run from gc whatever its age: its pin (label), its acceptance (by whom)."""
    bits = []
    for what, mark in (("pinned", run["pinned"]), ("accepted", run["accepted"])):
        if mark is None:
            continue
        if "damaged" in mark:
            bits.append(f"{what} (unreadable mark: run verify)")
        elif what == "pinned":
            bits.append(f"pinned ({mark['label']})" if mark.get("label") else "pinned")
        else:
            bits.append(f"accepted by {mark['by']} on {str(mark['at'])[:10]}")
    return "; ".join(bits)
