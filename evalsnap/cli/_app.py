"""The ``evalsnap`` command line: the typer app, shared options, ``run``, ``rescore``, ``show``.

Imported by ``evalsnap.cli.main`` once its start-up tricks have run (:mod:`evalsnap.startup`);
``evalsnap.cli`` itself stays light and re-exports these names."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any, Literal

import typer
from rich.console import Console, ConsoleDimensions
from rich.markup import escape

from evalsnap import errors, exitcodes
from evalsnap.records import repo
from evalsnap.reports.summary import score_table, summary
from evalsnap.reports.summary_model import Summary, write_json
from evalsnap.spec import RunSpec

app: typer.Typer = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Auditable, reusable evaluations of Google ADK agents.")
class _WholeColumns(Console):
    """rich's Console, but where its output is no terminal (a CI log, a pipe, a file) and
    ``COLUMNS`` says nothing, tables keep every column whole (ids included) instead of
    being cut at 80 columns (``weath…``); on a terminal, its width as usual."""

    @property  # type: ignore[override]
    def size(self) -> ConsoleDimensions:
        size = super().size
        if self._width is None and not self.is_terminal and not self._environ.get("COLUMNS"):
            return ConsoleDimensions(1000, size.height)
        return size

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)  # type: ignore[attr-defined]


err: Console = Console(stderr=True)
out: Console = _WholeColumns()

StoreOpt = Annotated[str, typer.Option("--store", envvar="EVALSNAP_STORE",
                                       help="Store URL: local path, s3://…, gs://…")]
OptionOpt = Annotated[list[str] | None, typer.Option(
    "--storage-option", help="KEY=VALUE passed to the fsspec backend (repeatable)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object on stdout")]
RunArg = Annotated[str, typer.Argument(help="Run id, record id or 'latest'")]
RunnerOpt = Annotated[str | None, typer.Option(
    "--task-runner", envvar="EVALSNAP_TASK_RUNNER",
    help="Where tasks run: threads (default) or dask (local cluster, or --dask-address)")]
DaskAddressOpt = Annotated[str | None, typer.Option(
    "--dask-address", envvar="EVALSNAP_DASK_ADDRESS",
    help="Existing Dask scheduler, e.g. tcp://host:8786 (implies --task-runner dask)")]
BaselineOpt = Annotated[str | None, typer.Option(
    "--baseline", metavar="REF",
    help="Compare with this run or record of the same eval set, 'latest' (the newest full "
         "run of it) or 'last-good' (the newest full run of it that passed its own "
         "--fail-on gate, or that `evalsnap accept` accepted): the summary lists regressions "
         "and fixes")]
ToleranceOpt = Annotated[float, typer.Option(
    "--tolerance", min=0.0,
    help="With --baseline: a score drop of more than this is a regression too (default 0: "
         "only PASSED → FAILED and complete → incomplete are)")]
GateOpt = Annotated[str, typer.Option(
    "--repetition-gate", metavar="mean|every|rate:P",
    help="How the repetitions of a case × metric pass: mean (default: ADK AgentEvaluator's "
         "rule, the mean of the per-invocation scores of all repetitions), every (every "
         "repetition passed), rate:P (a pass rate of at least P)")]
AlphaOpt = Annotated[float, typer.Option(
    "--alpha", min=0.0, max=1.0,
    help="With --baseline and at least 2 repetitions on both sides: a pass-count change is "
         "a regression only when Fisher's exact test gives p below this (default 0.05)")]
FailOnOpt = Annotated[Literal["quality", "incomplete", "regression", "never"], typer.Option(
    "--fail-on",
    help="What makes the exit code non-zero: quality (default: 1 a quality failure, 3 "
         "incomplete), incomplete (3), regression (1, needs --baseline), never")]


def _storage_options(pairs: list[str] | None) -> dict[str, str]:
    """``--storage-option KEY=VALUE`` pairs as a dict; whether the backend takes each key
    is checked when the store is opened (an unknown one is exit 2 naming it)."""
    opts = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise errors.UsageError(f"--storage-option {pair!r} must look like KEY=VALUE, "
                                    "e.g. --storage-option endpoint_url=http://127.0.0.1:9000.")
        opts[key.strip()] = value
    return opts


def _open_store(url: str, storage_option: list[str] | None, *, write: bool = False) -> Any:
    """Opens the store of ``url`` with ``--storage-option`` (the command's own: nothing is
    remembered in this process) and probes it: for reading only unless the command writes
    (``write``), so read-only credentials and mounts serve every command that only reads."""
    store = repo.open_store(url, _storage_options(storage_option))
    store.check(write=write)
    return store


def _print_json(value: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(value, default=str) + "\n")
    sys.stdout.flush()


@contextmanager
def _handled(commits: Any = None) -> Iterator[None]:
    """Typed errors become a message on stderr and their code (2); anything else is an
    internal error (:func:`crash_message`, code 4, naming what the run of ``commits``
    published): :mod:`evalsnap.exitcodes`."""

    try:
        yield
    except errors.EvalsnapError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        raise typer.Exit(exitcodes.exit_code(exitcodes.Failed(exc))) from None
    except (typer.Exit, KeyboardInterrupt):
        raise
    except Exception as exc:  # noqa: BLE001 - a crash is never a quality verdict
        crash_message(exc, commits.published() if commits is not None else [])
        raise typer.Exit(exitcodes.exit_code(exitcodes.Failed(exc))) from None


@contextmanager
def _opened(url: str, storage_option: list[str] | None, *, write: bool = False) -> Iterator[Any]:
    """A command's store (:func:`_open_store`), opened and used under :func:`_handled`."""
    with _handled():
        yield _open_store(url, storage_option, write=write)


def crash_message(exc: BaseException, published: list[Any] | None = None) -> None:
    """The traceback and one line on stderr for an internal error: what was published
    (``published``: :class:`evalsnap.pipeline.commits.Published` records)."""
    import traceback

    traceback.print_exception(exc, file=sys.stderr)
    done = ", ".join(f"{p.record_oid} ({p.eval_set_id})" for p in published or [])
    what = (f"records {done} were published before it, and nothing else was" if done
            else "nothing partial was published")
    err.print(f"[red]internal error:[/] {escape(f'{type(exc).__name__}: {exc}')}; the run is "
              f"incomplete ({escape(what)}). Please report it with the traceback above.",
              highlight=False, soft_wrap=True)


def _emit(result: Summary, as_json: bool) -> None:
    if as_json:
        # straight from the model, a row at a time: no dict of the whole run (70,000 units:
        # 400 MB), nor one string of it, on the way
        write_json(result, sys.stdout)
        sys.stdout.write("\n")
        sys.stdout.flush()
    else:
        from evalsnap.reports.suite import parts

        for part in parts(result):
            out.print(score_table(part))
            out.print(f"record {part.record_id}  snapshot {part.snapshot_id}")


@contextmanager
def _progress(enabled: bool, sink: Any) -> Iterator[None]:
    """A progress bar on stderr for the stages the flow announces to ``sink`` (its run
    context's :class:`~evalsnap.pipeline.progress.Progress`)."""
    if not enabled:
        yield
        return
    from rich.progress import Progress

    with Progress(console=err, transient=True) as bar:
        ids: dict[str, Any] = {}

        def show(stage: str, advance: int, total: int | None) -> None:
            if stage not in ids:
                ids[stage] = bar.add_task(stage, total=total)
            if total is not None:
                bar.update(ids[stage], total=total)
            if advance:
                bar.advance(ids[stage], advance)

        unsubscribe = sink.subscribe(show)
        try:
            yield
        finally:
            unsubscribe()


def _metrics_in(config: str | None, evalset: str | list[str] | None) -> list[str]:
    """The metric names a config file lists, read cheaply (only to preload what they need;
    the flow plans and validates the run, and reports what is wrong with the file)."""
    from evalsnap.adk.config import read_config_file
    from evalsnap.adk.targets import default_config_path

    first = evalset[0] if isinstance(evalset, list) and evalset else evalset
    path = config or (default_config_path(first.split(":")[0])
                      if isinstance(first, str) else None)
    try:
        criteria = read_config_file(path)[0].get("criteria") if path else None
    except errors.EvalsnapError:
        return []
    return [str(name) for name in criteria] if isinstance(criteria, dict) else []


def _run_spec(spec: RunSpec, preload: list[str], ctx: Any, progress: bool) -> Summary:
    """Runs the flow of ``spec`` in this process (:func:`evalsnap.api.run_spec`) with the
    run context ``ctx``; returns its summary. SIGINT, SIGTERM and SIGHUP stop it within
    seconds (:mod:`evalsnap.cli.signals`: the commits of ``ctx`` are waited for)."""
    from evalsnap.api import check_store_url
    from evalsnap.cli.signals import run_stoppable

    check_store_url(spec.store)  # before the temporary API is waited for
    return run_stoppable(_in_this_process, spec, preload, commits=ctx.commits,
                         run_context=ctx, progress=_progress(progress, ctx.progress))


def _load_ahead(spec: RunSpec, ctx: Any) -> None:
    """What a flow's later steps load on first use (its module, ~0.1 s; the page templates,
    compiled on first render, ~0.15 s; for a ``--reuse`` run, what its pages read of the
    cases they detail, ~0.2 s at 210 cases: :func:`evalsnap.api.read_ahead`), loaded while
    the temporary API still starts."""
    from evalsnap import startup

    if not startup.api_starting():
        return
    import importlib

    from evalsnap.api import read_ahead
    from evalsnap.reports.html import compile_templates

    importlib.import_module("flows.rescore" if spec.kind == "rescore" else "flows.evaluate")
    if startup.api_starting():
        try:
            compile_templates()
        except Exception:  # noqa: BLE001 - only ahead of time: publish reports a bad page
            pass
    read_ahead(ctx, startup.api_starting)


def _in_this_process(spec: RunSpec, preload: list[str], **kwargs: Any) -> Summary:
    """The CLI's own part of a flow run: its console (ADK's warnings and Prefect's tracebacks
    of typed errors, which the CLI prints once itself, kept off stderr), and the start-up
    work that overlaps the temporary API's start (:mod:`evalsnap.startup`)."""
    import logging

    from evalsnap import startup
    from evalsnap.api import prepare, run_spec

    logging.getLogger("google_adk").setLevel(logging.ERROR)
    flow_runs = logging.getLogger("prefect.flow_runs")
    if not any(isinstance(f, _TypedErrorsPrintedOnce) for f in flow_runs.filters):
        flow_runs.addFilter(_TypedErrorsPrintedOnce())
    # While the temporary API is still starting: first what the flow's start needs, then,
    # in the background, what its metrics will (this thread is idle until the API answers).
    startup.prestart_ephemeral_api()  # a no-op if main started it (or PREFECT_API_URL is set)
    startup.remember_missing()  # ADK's agent runs retry a missing optional import per call
    startup.preload_flow_engine()
    startup.preload(preload)
    if startup.api_starting() and kwargs.get("run_context") is not None:
        prepare(spec, kwargs["run_context"])  # the flow's first steps, while the API starts
        _load_ahead(spec, kwargs["run_context"])  # and what its later steps load first
    startup.wait_for_ephemeral_api()
    return run_spec(spec, **kwargs)


class _TypedErrorsPrintedOnce:
    """A logging filter that drops Prefect's traceback of a typed error (bad input found
    while the flow plans): the flow run still ends Failed with the error, which the CLI
    prints once."""

    def filter(self, record: Any) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, errors.EvalsnapError)


@contextmanager
def _stdout_kept_for_json(enabled: bool) -> Iterator[None]:
    """With ``--json``, stdout holds the one JSON object alone: while the flow runs, file
    descriptor 1 is the terminal's stderr, so whatever user code prints (a metric, a tool,
    the agent) — in this process or in a scoring process it starts — goes to stderr."""
    if not enabled:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _flow_command(spec: RunSpec, storage_option: list[str] | None, as_json: bool) -> None:
    """Runs a flow command: the flow, its summary printed, the exit code of its gate."""
    from evalsnap.cli.signals import result_printed
    from evalsnap.pipeline.context import RunContext

    # the run's collaborators: the CLI listens to its progress, and its signal handling
    # and crash message watch its commits
    ctx = RunContext(spec.store)
    with _handled(ctx.commits), _stdout_kept_for_json(as_json):
        # options of the store (opened when the flow starts) stay in this process
        ctx.storage_options.update(_storage_options(storage_option))
        # With --reuse (and no --force) most units usually come from earlier runs, and
        # preloading only competes with the run for the interpreter.
        # Only the metrics the run scores (`--metric`): nltk alone is ~1.7 s of CPU.
        preload = ([m for m in _metrics_in(spec.config, spec.evalsets)
                    if spec.metrics is None or m in spec.metrics]
                   if spec.force or not spec.reuse else [])
        result = _run_spec(spec, preload, ctx, not as_json and err.is_terminal)
    _emit(result, as_json)
    code = result.exit_code
    result_printed(code)  # from now on a signal ends the process with the printed code
    raise typer.Exit(code)


@app.command()
def run(
    agent_dir: Annotated[str, typer.Argument(
        help="Agent package directory (ADK, or LangGraph: exposes graph or has langgraph.json)")],
    evalset: Annotated[list[str], typer.Argument(help=(
        "Eval set(s) as adk eval takes them: FILE, FILE:ID,ID, an eval set id of the agent, "
        "or a directory of *.test.json files"))],
    config: Annotated[str | None, typer.Option(
        help="test_config.json for every eval set (default: the one beside each)")] = None,
    store: StoreOpt = ".evalsnap",
    storage_option: OptionOpt = None,
    reuse: Annotated[bool, typer.Option(help="Reuse complete, compatible earlier work")] = False,
    force: Annotated[bool, typer.Option(help="Score again although a reusable result exists")] = False,
    metric: Annotated[list[str] | None, typer.Option(help="Only this metric (repeatable)")] = None,
    case: Annotated[list[str] | None, typer.Option(help="Only this eval_id (repeatable)")] = None,
    repetitions: Annotated[int, typer.Option(help="Runs of the agent per case")] = 1,
    until_stable: Annotated[int | None, typer.Option(
        "--until-stable", metavar="MAX",
        help="After --repetitions, more repetitions only for the cases whose pass rate is "
             "still in doubt (its 95% interval holds the gate's line, or the baseline's "
             "rate), up to MAX per case")] = None,
    agent_name: Annotated[str | None, typer.Option(
        help="Evaluate this sub-agent instead of the root agent")] = None,
    initial_session_file: Annotated[str | None, typer.Option(
        help="Initial session of old-format *.test.json files (as AgentEvaluator's)")] = None,
    task_runner: RunnerOpt = None,
    dask_address: DaskAddressOpt = None,
    baseline: BaselineOpt = None,
    tolerance: ToleranceOpt = 0.0,
    fail_on: FailOnOpt = "quality",
    repetition_gate: GateOpt = "mean",
    alpha: AlphaOpt = 0.05,
    framework: Annotated[Literal["adk", "langgraph"] | None, typer.Option(
        help="The agent's framework; default: detected from AGENT_DIR")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Run the agent on every case, freeze, score, publish (one record per eval set)."""
    _flow_command(RunSpec(
        kind="run", agent_dir=agent_dir, evalsets=evalset, config=config, store=store,
        reuse=reuse, force=force, metrics=metric, cases=case, repetitions=repetitions,
        until_stable=until_stable, task_runner=task_runner, dask_address=dask_address, agent_name=agent_name,
        initial_session_file=initial_session_file, baseline=baseline, tolerance=tolerance,
        fail_on=fail_on, framework=framework, repetition_gate=repetition_gate, alpha=alpha),
        storage_option, as_json)


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
    agent: Annotated[str | None, typer.Option(
        "--agent", help="Agent package to import first, as a run does (never called)")] = None,
    agent_name: Annotated[str | None, typer.Option(help="Sub-agent of --agent")] = None,
    task_runner: RunnerOpt = None,
    dask_address: DaskAddressOpt = None,
    baseline: BaselineOpt = None,
    tolerance: ToleranceOpt = 0.0,
    fail_on: FailOnOpt = "quality",
    repetition_gate: GateOpt = "mean",
    alpha: AlphaOpt = 0.05,
    as_json: JsonOpt = False,
) -> None:
    """Score frozen inference again with new references or rules; never calls the agent."""
    paths = list(code_path or [])
    if evalset and not paths:
        # custom metrics usually live in the agent package beside the eval set
        paths = [os.path.dirname(os.path.dirname(os.path.abspath(evalset)))]
    _flow_command(RunSpec(
        kind="rescore", source=run_or_snapshot, evalsets=[evalset] if evalset else [],
        config=config, store=store, reuse=reuse, force=force, metrics=metric, cases=case,
        code_paths=paths, task_runner=task_runner, dask_address=dask_address,
        agent_dir=agent, agent_name=agent_name, baseline=baseline, tolerance=tolerance,
        fail_on=fail_on, repetition_gate=repetition_gate, alpha=alpha),
        storage_option, as_json)


@app.command()
def show(
    record: RunArg,
    store: StoreOpt = ".evalsnap",
    storage_option: OptionOpt = None,
    all_repetitions: Annotated[bool, typer.Option(
        "--all", help="The score table per repetition, not per case × metric")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Show a record with everything it links resolved."""
    from evalsnap.reports.show import full_record

    with _opened(store, storage_option) as s:
        oid, rec = repo.resolve_record(s, record)
        if as_json:
            sys.stdout.write(json.dumps(full_record(s, oid, rec), default=str) + "\n")
        else:
            out.print(score_table(summary(s, oid, rec), detail=all_repetitions))
            out.print(f"record {oid}  snapshot {rec.snapshot_oid}")


# Commands of each area live in their own module and register on ``app``.
from evalsnap.cli import inspect as cli_inspect  # noqa: E402,F401
from evalsnap.cli import judge as cli_judge  # noqa: E402,F401
from evalsnap.cli import report as cli_report  # noqa: E402,F401
from evalsnap.cli import store as cli_store  # noqa: E402,F401
