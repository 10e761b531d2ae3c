"""The ``evalsnap`` command line (the public contract in DESIGN.md)."""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

from evalsnap.startup import apply_defaults, prestart_for_command

apply_defaults()
prestart_for_command(sys.argv)  # before the heavy imports below (ADK, then Prefect)

import typer  # noqa: E402
from rich.console import Console  # noqa: E402

from evalsnap import errors, startup  # noqa: E402
from evalsnap.records import repo  # noqa: E402
from evalsnap.reports.summary import EXIT_INCOMPLETE, EXIT_USAGE, score_table, summary  # noqa: E402

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Auditable, reusable evaluations of Google ADK agents.")
err = Console(stderr=True)
out = Console()

StoreOpt = Annotated[str, typer.Option("--store", envvar="EVALSNAP_STORE",
                                       help="Store URL: local path, s3://…, gs://…")]
OptionOpt = Annotated[list[str] | None, typer.Option(
    "--storage-option", help="KEY=VALUE passed to the fsspec backend (repeatable)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout")]
RunnerOpt = Annotated[str | None, typer.Option(
    "--task-runner", envvar="EVALSNAP_TASK_RUNNER",
    help="Where tasks run: threads (default) or dask (local cluster, or --dask-address)")]
DaskAddressOpt = Annotated[str | None, typer.Option(
    "--dask-address", envvar="EVALSNAP_DASK_ADDRESS",
    help="Existing Dask scheduler, e.g. tcp://host:8786 (implies --task-runner dask)")]


def _storage_options(pairs: list[str] | None) -> dict[str, str]:
    opts = {}
    for pair in pairs or []:
        if "=" not in pair:
            raise errors.UsageError(f"--storage-option {pair!r} must look like KEY=VALUE.")
        k, v = pair.split("=", 1)
        opts[k.strip()] = v
    return opts


def _open_store(url: str, storage_option: list[str] | None) -> Any:
    """Configures ``--storage-option`` for ``url`` in this process and opens the store."""
    repo.configure_store(url, _storage_options(storage_option))
    return repo.open_store(url)


def _print_json(value: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(value, default=str) + "\n")
    sys.stdout.flush()


@contextmanager
def _handled():
    """Typed errors become a message on stderr and exit 2."""

    try:
        yield
    except errors.EvalsnapError as exc:
        err.print(f"[red]error:[/] {exc}", highlight=False, soft_wrap=True)
        raise typer.Exit(getattr(exc, "exit_code", EXIT_USAGE)) from None
    except (typer.Exit, KeyboardInterrupt):
        raise
    except Exception as exc:  # noqa: BLE001 - a crash is never a quality verdict
        import traceback

        traceback.print_exc(file=sys.stderr)
        err.print(f"[red]internal error:[/] {type(exc).__name__}: {exc}; the run is incomplete "
                  "(nothing partial was published). Please report it with the traceback above.",
                  highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_INCOMPLETE) from None


def _emit(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        sys.stdout.write(json.dumps(result, sort_keys=False, default=str) + "\n")
        sys.stdout.flush()
    else:
        out.print(score_table(result))
        out.print(f"record {result['record_id']}  snapshot {result['snapshot_id']}")


@contextmanager
def _progress(enabled: bool) -> Iterator[None]:
    """A progress bar on stderr for the stages the flow announces (``pipeline.progress``)."""
    if not enabled:
        yield
        return
    from rich.progress import Progress

    from evalsnap.pipeline import progress

    with Progress(console=err, transient=True) as bar:
        ids: dict[str, Any] = {}

        def show(stage: str, advance: int, total: int | None) -> None:
            if stage not in ids:
                ids[stage] = bar.add_task(stage, total=total)
            if total is not None:
                bar.update(ids[stage], total=total)
            if advance:
                bar.advance(ids[stage], advance)

        unsubscribe = progress.subscribe(show)
        try:
            yield
        finally:
            unsubscribe()


def _metrics_in(config: str | None, evalset: str | None) -> list[str]:
    """The metric names a config file lists, read cheaply (only to preload what they need;
    the flow plans and validates the run, and reports what is wrong with the file)."""
    from evalsnap.adk.config import read_config_file
    from evalsnap.pipeline.plan import default_config_path

    path = config or (default_config_path(evalset) if evalset else None)
    try:
        criteria = read_config_file(path)[0].get("criteria") if path else None
    except errors.EvalsnapError:
        return []
    return [str(name) for name in criteria] if isinstance(criteria, dict) else []


class _TypedErrorsPrintedOnce(logging.Filter):
    """Drops Prefect's traceback of a typed error (bad input found while the flow plans):
    the flow run still ends Failed with the error, and the CLI prints it once, clearly."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, errors.EvalsnapError)


def _run_flow(flow_fn: Any, preload: list[str], storage_option: list[str] | None,
              progress: bool, **params: Any) -> dict[str, Any]:
    """Runs a flow in this process, on the temporary API (started early) or the server
    ``PREFECT_API_URL`` names; returns its summary."""
    from evalsnap.startup import prestart_ephemeral_api

    prestart_ephemeral_api()  # a no-op if the module's import started it already
    from evalsnap.pipeline.runners import resolve_runner

    params["task_runner"], params["dask_address"] = resolve_runner(params["task_runner"],
                                                                   params["dask_address"])
    repo.configure_store(params["store"], _storage_options(storage_option))
    from prefect import settings

    from evalsnap.startup import preload_flow_engine, wait_for_ephemeral_api

    logging.getLogger("google_adk").setLevel(logging.ERROR)
    logging.getLogger("prefect.flow_runs").addFilter(_TypedErrorsPrintedOnce())
    # While the temporary API is still starting: first what the flow's start needs, then,
    # in the background, what its metrics will (this thread is idle until the API answers).
    preload_flow_engine()
    startup.preload(preload)
    wait_for_ephemeral_api()
    heartbeat = getattr(settings, "PREFECT_FLOWS_HEARTBEAT_FREQUENCY", None)
    with _progress(progress):
        if heartbeat is None:
            return flow_fn(**params)
        # A sync flow run otherwise spends ~1 s joining its heartbeat thread.
        with settings.temporary_settings({heartbeat: None}):
            return flow_fn(**params)


def _flow_command(flow_fn: Any, storage_option: list[str] | None, as_json: bool,
                  **params: Any) -> None:
    """Runs a flow command: the flow, its summary printed, the exit code of its gate."""
    with _handled():
        # With --reuse (and no --force) most units usually come from earlier runs, and
        # preloading only competes with the run for the interpreter.
        preload = (_metrics_in(params["config"], params["evalset"])
                   if params["force"] or not params["reuse"] else [])
        result = _run_flow(flow_fn, preload, storage_option, not as_json and err.is_terminal,
                           **params)
    _emit(result, as_json)
    raise typer.Exit(result["exit_code"])


@app.command()
def run(
    agent_dir: Annotated[str, typer.Argument(help="ADK agent package directory")],
    evalset: Annotated[str, typer.Argument(help=".evalset.json file")],
    config: Annotated[str | None, typer.Option(help="test_config.json (default: beside EVALSET)")] = None,
    store: StoreOpt = ".evalsnap",
    storage_option: OptionOpt = None,
    reuse: Annotated[bool, typer.Option(help="Reuse complete, compatible earlier work")] = False,
    force: Annotated[bool, typer.Option(help="Score again although a reusable result exists")] = False,
    metric: Annotated[list[str] | None, typer.Option(help="Only this metric (repeatable)")] = None,
    case: Annotated[list[str] | None, typer.Option(help="Only this eval_id (repeatable)")] = None,
    repetitions: Annotated[int, typer.Option(help="Runs of the agent per case")] = 1,
    task_runner: RunnerOpt = None,
    dask_address: DaskAddressOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Run the agent on every case, freeze, score, publish."""
    from flows.evaluate import evaluate

    _flow_command(evaluate, storage_option, as_json, agent_dir=agent_dir, evalset=evalset,
                  config=config, store=store, reuse=reuse, force=force, metrics=metric,
                  cases=case, repetitions=repetitions, task_runner=task_runner,
                  dask_address=dask_address)


@app.command()
def rescore(
    run_or_snapshot: Annotated[str, typer.Argument(help="Run id, record id, snapshot id or 'latest'")],
    evalset: Annotated[str | None, typer.Option(help="Edited .evalset.json")] = None,
    config: Annotated[str | None, typer.Option(help="test_config.json")] = None,
    store: StoreOpt = ".evalsnap",
    storage_option: OptionOpt = None,
    reuse: Annotated[bool, typer.Option(help="Reuse complete, compatible units")] = False,
    force: Annotated[bool, typer.Option(help="Score every unit again")] = False,
    metric: Annotated[list[str] | None, typer.Option(help="Only this metric (repeatable)")] = None,
    case: Annotated[list[str] | None, typer.Option(help="Only this eval_id (repeatable)")] = None,
    code_path: Annotated[list[str] | None, typer.Option(help="Directory to import custom metrics from")] = None,
    task_runner: RunnerOpt = None,
    dask_address: DaskAddressOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Score frozen inference again with new references or rules; never calls the agent."""
    from flows.rescore import rescore as rescore_flow

    paths = list(code_path or [])
    if evalset and not paths:
        # custom metrics usually live in the agent package beside the eval set
        paths = [os.path.dirname(os.path.dirname(os.path.abspath(evalset)))]
    _flow_command(rescore_flow, storage_option, as_json, run_or_snapshot=run_or_snapshot,
                  evalset=evalset, config=config, store=store, reuse=reuse, force=force,
                  metrics=metric, cases=case, code_paths=paths, task_runner=task_runner,
                  dask_address=dask_address)


@app.command()
def show(
    record: Annotated[str, typer.Argument(help="Run id, record id or 'latest'")],
    store: StoreOpt = ".evalsnap",
    storage_option: OptionOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show a record with everything it links resolved."""
    from evalsnap.reports.show import full_record

    with _handled():
        s = _open_store(store, storage_option)
        oid, rec = repo.resolve_record(s, record)
        if as_json:
            sys.stdout.write(json.dumps(full_record(s, oid, rec), default=str) + "\n")
        else:
            _emit(summary(s, oid, rec), False)


# Commands of each area live in their own module and register on ``app``.
from evalsnap.cli import inspect as cli_inspect  # noqa: E402,F401
from evalsnap.cli import judge as cli_judge  # noqa: E402,F401
from evalsnap.cli import store as cli_store  # noqa: E402,F401


def main() -> None:
    """The console entry point: runs the command, then leaves without tearing down.

    Once the command has returned, the non-daemon threads are joined and the exit handlers
    run (Prefect's log and event flushes, stopping the temporary API), and output is
    flushed; then the process exits at once. Python's own teardown of a process that has
    imported ADK and Prefect (~650,000 objects) takes 1-2 s and does nothing that
    outlives the process.
    """
    import atexit
    import threading

    try:
        app()
        code: Any = 0
    except SystemExit as exc:
        code = exc.code
    if isinstance(code, str):  # SystemExit("message") prints the message and exits 1
        sys.stderr.write(code + "\n")
        code = 1
    shutdown = getattr(threading, "_shutdown", None)  # joins what the interpreter would join
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    startup.leave_now(code if isinstance(code, int) else 0)

