"""CLI commands: verify, gc, import-adk-history, accept, pin, unpin. Registered on
``evalsnap.cli.app``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from evalsnap import exitcodes
from evalsnap.cli._app import (
    JsonOpt,
    OptionOpt,
    RunArg,
    StoreOpt,
    _opened,
    _print_json,
    app,
    err,
    out,
)

if TYPE_CHECKING:
    from evalsnap.records import RunManifest


@app.command()
def verify(
    store: StoreOpt = ".evalsnap",
    storage_option: OptionOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Re-hash and parse every object, follow every run manifest. Exit 1 if anything is wrong."""
    from evalsnap.reports.verify import verify_store

    with _opened(store, storage_option) as s:
        report = verify_store(s)
    if as_json:
        _print_json(report.as_dict())
    else:
        counted = ", ".join(f"{n} {kind}" for kind, n in report.objects.items())
        out.print(f"{report.store}: {counted}; {report.runs} run manifest(s), "
                  f"{report.index_entries} index entries, {report.task_results} cached task "
                  "result(s)", highlight=False)
        for f in report.findings:
            err.print(f"[red]{f.kind}[/] {escape(f.location)}: {escape(f.message)}", highlight=False,
                      soft_wrap=True)
        for note in report.notes:
            err.print(f"[yellow]note:[/] {escape(note)}", highlight=False, soft_wrap=True)
        out.print("ok: nothing wrong" if report.ok else
                  f"{len(report.findings)} problem(s) found", highlight=False)
    raise typer.Exit(exitcodes.exit_code(exitcodes.Findings(found=not report.ok)))


@app.command()
def gc(
    keep_last: Annotated[int | None, typer.Option(
        help="Keep the newest N runs of each eval set")] = None,
    older_than: Annotated[float | None, typer.Option(
        help="Remove runs older than DAYS (with --keep-last: only beyond the newest N)")] = None,
    grace: Annotated[str, typer.Option(help=(
        "Keep everything younger than this (e.g. 1h, 30m, 0); above your longest run"))] = "1h",
    dry_run: Annotated[bool, typer.Option(help="Only list what would be removed")] = False,
    store: StoreOpt = ".evalsnap",
    storage_option: OptionOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Remove old runs and every object no kept run names (the newest run of each eval set stays)."""
    from evalsnap.records.gc import collect, gc_table, parse_duration
    from evalsnap.reports.lastgood import is_good
    from evalsnap.reports.site import after_gc

    with _opened(store, storage_option) as s:  # never writes v1/STORE: gc is not a writer
        report = collect(s, good=is_good, keep_last=keep_last, older_than_days=older_than,
                         grace=parse_duration(grace), dry_run=dry_run)
        after_gc(s, report)  # the site stops listing and linking the removed runs
    if as_json:
        _print_json(report.as_dict())
        return
    verb = "would remove" if dry_run else "removed"
    for run in report.runs_removed:
        out.print(f"{verb} run {run['run_id']} ({run['eval_set_id']}, {run['created_at']})",
                  highlight=False)
    for run in report.runs_kept:  # why each run stays, as --json says it (a pin's label
        # is a person's text: printed as it is, never read as markup)
        out.print(escape(f"kept run {run['run_id']}"
                         + (f" ({run['eval_set_id']})" if run.get("eval_set_id") else "")
                         + f": {run['why']}"), highlight=False)
    out.print(gc_table(report))
    for line in ([report.objects_deferred] if report.objects_deferred else []) + report.warnings:
        err.print(f"[yellow]note:[/] {line}", highlight=False, soft_wrap=True)


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

    with _opened(store, storage_option, write=True) as s:
        imported = import_history(s, directory, app_name)
    if as_json:
        _print_json({"store": s.url, "imported": imported})
        return
    for item in imported:
        out.print(f"{item['file']} → run {item['run_id']} record {item['record_id']} "
                  f"({item['cases']} case(s), {item['units']} unit(s))", highlight=False)


# ---- baselines that stick: accept, pin, unpin (evalsnap.records.marks) ----------------------

def _manifest_of(s: Any, run: str) -> RunManifest:
    """The manifest of the run ``run`` names (a run id, a record id or ``latest``, as
    ``show`` takes); a run gc removed says so."""
    from evalsnap.errors import NotFoundError
    from evalsnap.records import repo

    _, record = repo.resolve_record(s, run)
    try:
        return repo.read_manifest(s, record.run_id)
    except NotFoundError:
        repo.resolve_record(s, record.run_id)  # says "removed by gc on …" if it was
        raise


@app.command()
def accept(
    run: RunArg,
    note: Annotated[str | None, typer.Option(
        help="Why the run is accepted (kept in the store with who and when)")] = None,
    store: StoreOpt = ".evalsnap",
    storage_option: OptionOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Accept a full run: `--baseline last-good` compares with it from now on (until a newer
    run passes its gate), and gc keeps it."""
    from evalsnap.records import marks

    with _opened(store, storage_option, write=True) as s:
        mark = marks.accept(s, _manifest_of(s, run), note)
    if as_json:
        _print_json({"store": s.url, "accepted": mark.model_dump()})
        return
    out.print(escape(f"accepted run {mark.run_id} ({mark.eval_set_id}) by {mark.by} on "
                     f"{mark.at}" + (f": {mark.note}" if mark.note else "")
                     + "; `--baseline last-good` compares with it from now on (until a newer "
                     "run passes its gate), and gc keeps it"), highlight=False)


@app.command()
def pin(
    run: RunArg,
    label: Annotated[str | None, typer.Option(
        help="A name for the pin (kept in the store with who and when)")] = None,
    store: StoreOpt = ".evalsnap",
    storage_option: OptionOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Pin a run: gc keeps it, and everything it names, until it is unpinned."""
    from evalsnap.records import marks

    with _opened(store, storage_option, write=True) as s:
        mark = marks.pin(s, _manifest_of(s, run), label)
    if as_json:
        _print_json({"store": s.url, "pinned": mark.model_dump()})
        return
    out.print(escape(f"pinned run {mark.run_id} ({mark.eval_set_id})"
                     + (f" as {mark.label!r}" if mark.label else "")
                     + f" by {mark.by} on {mark.at}; gc keeps it until "
                     f"`evalsnap unpin {mark.run_id}`"), highlight=False)


@app.command()
def unpin(
    run: RunArg,
    store: StoreOpt = ".evalsnap",
    storage_option: OptionOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Remove a run's pin: gc may remove the run again (unless other rules keep it)."""
    from evalsnap.errors import NotFoundError
    from evalsnap.records import marks, repo

    with _opened(store, storage_option, write=True) as s:
        run_id = run
        if s.get_ref(marks.PINS, repo.ref_name(run)) is None:  # a record id, or latest
            run_id = repo.resolve_record(s, run)[1].run_id
        if not marks.unpin(s, run_id):
            raise NotFoundError(f"run {run_id} is not pinned in store {s.url}; `evalsnap ls` "
                                "shows which runs are.")
    if as_json:
        _print_json({"store": s.url, "unpinned": run_id})
        return
    out.print(escape(f"unpinned run {run_id}: gc may remove it again (unless another rule "
                     "keeps it)"), highlight=False)
