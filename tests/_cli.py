"""The command line in this process: ``evalsnap.cli``'s typer app through typer's ``CliRunner``.

A CLI subprocess pays 2–5 s of start-up (imports of ADK and Prefect) before it does anything;
in the test process those imports are paid once. :func:`run_inproc` takes what
:func:`tests.conftest.run_cli` takes and returns the same :class:`CliResult`, and makes the
call look like a fresh process to the code it runs:

* ``env`` is applied to ``os.environ`` for the call (and ``EVALSNAP_*`` settings re-read), and
  the environment is restored after it (an agent's ``.env`` loaded by the run included);
* ``cwd`` is the working directory for the call;
* user code (agent packages, custom metrics, plugins: every module whose file is outside the
  installed environment and the product's packages) is imported afresh, as in a new process,
  and forgotten after the call, as are ``sys.path`` entries the run added; ADK's model
  registry is restored;
* what stays process-global by design (:mod:`evalsnap.pipeline.context`) starts as in a new
  process: a config's identity declarations, the CLI's signal state after a printed result,
  and fsspec's filesystem instances (a run's store, published records, verdicts and limits
  live in its run context, new for every call).

What differs from ``main`` (``python -m evalsnap.cli``) and stays tested by subprocess tests:
the start-up tricks (the early temporary API: the suite's server is given by
``PREFECT_API_URL``), the fast exit (``os._exit`` after the exit handlers), signals, and what
user code prints on file descriptor 1 from another process. Settings read when a process
starts (``PREFECT_*`` and the others in :data:`_PROCESS_ENV`) cannot change per call: such a
call runs the CLI in a process. ``EVALSNAP_TEST_CLI=process`` runs every call in a process
(to tell a product failure from one of this helper).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Code of the product, its dependencies and bench, imported once per test process (as are the
# suite's own modules, the files directly in tests/; its fixture packages are user code).
_KEPT_ROOTS = tuple(str(p) + os.sep for p in (
    Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), ROOT / "evalsnap",
    ROOT / "storage", ROOT / "tasks", ROOT / "flows", ROOT / "bench"))
_TESTS = ROOT / "tests"


class CliResult:
    """What a CLI call gave: exit code, stdout, stderr (and the one JSON line of ``--json``)."""

    def __init__(self, proc: subprocess.CompletedProcess[str]) -> None:
        self.code = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr

    @property
    def json(self) -> dict:
        lines = [ln for ln in self.stdout.splitlines() if ln.strip()]
        assert len(lines) == 1, f"expected one JSON line on stdout, got: {self.stdout!r}\n" \
                                f"stderr: {self.stderr[-3000:]}"
        return json.loads(lines[0])


def score_status(summary: dict[str, Any]) -> dict[tuple[str, str], tuple[Any, str]]:
    """(eval id, metric) → (score, status) of a ``--json`` summary of one eval set."""
    return {(c["eval_id"], metric): (m["score"], m["status"])
            for c in summary["cases"] for metric, m in c["metrics"].items()}


def ok(result: CliResult, code: int = 0) -> dict[str, Any]:
    """The ``--json`` object of a call that exited ``code`` (else the tails of its output)."""
    assert result.code == code, (result.stdout[-2000:], result.stderr[-3000:])
    return result.json


def _user_module(module: Any) -> bool:
    """True for a module of user code (an agent package, a metric, a plugin)."""
    file = getattr(module, "__file__", None)
    if not isinstance(file, str) or not file:
        return False
    # a relative path depends on the working directory, which a call changes
    return _user_file(file) if os.path.isabs(file) else _user_file.__wrapped__(file)


@functools.cache
def _user_file(file: str) -> bool:
    """``_user_module`` by file: a file's place does not change within a session (resolving
    every module's path on every call was most of an in-process call's own cost)."""
    try:
        path = Path(file).resolve()
    except (OSError, ValueError):
        return False
    return not (str(path).startswith(_KEPT_ROOTS) or path.parent == _TESTS)


def _user_modules() -> dict[str, Any]:
    return {name: m for name, m in list(sys.modules.items())
            if m is not None and _user_module(m)}


@contextmanager
def fresh_user_code() -> Iterator[None]:
    from google.adk.evaluation.metric_evaluator_registry import DEFAULT_METRIC_EVALUATOR_REGISTRY as metrics
    from google.adk.models import registry

    from evalsnap.adk import plugins

    saved_modules = _user_modules()
    # a plugin named in a config registers its metrics in ADK's process-wide registry on
    # import (a seed's class may replace evalsnap's built-in of the same name): per call here
    saved_metrics = (dict(metrics._registry), dict(metrics._custom_function_paths))
    saved_plugins = (set(plugins._loaded), plugins._scanned)
    for name in saved_modules:
        del sys.modules[name]
    saved_path = list(sys.path)
    saved_llms = dict(registry._llm_registry_dict)
    try:
        yield
    finally:
        for name in _user_modules():
            sys.modules.pop(name, None)
        sys.modules.update(saved_modules)
        sys.path[:] = saved_path
        registry._llm_registry_dict.clear()
        registry._llm_registry_dict.update(saved_llms)
        registry.LLMRegistry.resolve.cache_clear()
        metrics._registry.clear()
        metrics._registry.update(saved_metrics[0])
        metrics._custom_function_paths.clear()
        metrics._custom_function_paths.update(saved_metrics[1])
        plugins._loaded.clear()
        plugins._loaded.update(saved_plugins[0])
        plugins._scanned = saved_plugins[1]


@contextmanager
def _environment(env: dict[str, str] | None, cwd: Path | None) -> Iterator[None]:
    from evalsnap import settings

    saved = dict(os.environ)
    saved_cwd = os.getcwd()
    os.environ.update(env or {})
    os.chdir(cwd or ROOT)
    try:
        yield
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved)
        try:
            settings.reload()
        except Exception:  # noqa: BLE001 - the next call reports a bad value itself
            pass


def _forget_process_memos() -> None:
    """What stays per process (see the module docstring), as a new process has it: every
    run starts with a new run context (:mod:`evalsnap.pipeline.context`), so what one run
    learnt (its store, published records, verdicts, limits) is not kept for the next."""
    from evalsnap.agents import identity

    identity.forget_declared()  # a config's evalsnapIdentity declarations are per process
    from evalsnap.cli import signals

    state = getattr(signals, "_State", None)  # what a signal does after a printed result
    if state is not None:
        state.finishing, state.pending, state.printed = False, None, None
    # fsspec keeps one filesystem per set of arguments: credentials and endpoints an
    # earlier call found in its environment must not serve this one
    from fsspec.registry import _registry

    for cls in list(_registry.values()):
        cls.clear_instance_cache()


@contextmanager
def _console_width() -> Iterator[None]:
    """The CLI's rich consoles measure ``COLUMNS`` per call, as at a process's start."""
    import evalsnap.cli as cli

    widths = [(c, c._width) for c in (cli.out, cli.err)]
    for c, _ in widths:
        c._width = None
    try:
        yield
    finally:
        for c, w in widths:
            c._width = w


@contextmanager
def _prefect_logs_to(stream: Any) -> Iterator[None]:
    """Prefect's console handlers write to ``stream`` (the call's stderr) for the call."""
    import logging

    from prefect.logging.handlers import PrefectConsoleHandler

    loggers = [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                       if isinstance(lg, logging.Logger)]
    handlers = {h for lg in loggers for h in lg.handlers if isinstance(h, PrefectConsoleHandler)}
    saved = [(h, h.stream, h.console.file) for h in handlers]
    for h in handlers:
        h.stream = stream
        h.console.file = stream
    try:
        yield
    finally:
        for h, old_stream, old_file in saved:
            h.stream = old_stream
            h.console.file = old_file


#: Variables read when a process starts (Prefect's settings, the interpreter's, the deferred
#: imports) or that make a run start processes of its own (scoring pool, Dask).
_PROCESS_ENV = ("PREFECT_", "PYTHON", "EVALSNAP_LAZY_IMPORTS", "EVALSNAP_SCORE_PROCESSES",
                "EVALSNAP_SCORE_POOL_MIN_UNITS", "EVALSNAP_TASK_RUNNER", "EVALSNAP_DASK_")
_PROCESS_ARGS = ("--task-runner", "--dask-address")


def needs_a_process(args: tuple[str, ...], env: dict[str, str] | None) -> bool:
    """True when a call means something only in a process of its own (see ``_PROCESS_ENV``):
    :func:`run_inproc` then runs it as :func:`tests.conftest.run_cli` does."""
    import threading

    return (os.environ.get("EVALSNAP_TEST_CLI") == "process"  # every call in a process
            # the environment, the working directory and sys.modules are the process's
            or threading.current_thread() is not threading.main_thread()
            or any(k.startswith(_PROCESS_ENV) for k in env or {})
            or any(a.split("=")[0] in _PROCESS_ARGS for a in args))


def run_inproc(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
               timeout: float = 300) -> CliResult:
    """Runs ``evalsnap ARGS`` in this process, as ``main`` does without leaving it, unless
    the call needs a process of its own (:func:`needs_a_process`). ``timeout`` is taken
    for the same calls as :func:`tests.conftest.run_cli`, but nothing here stops a stuck
    call: a test that may hang runs the CLI in a process."""
    if needs_a_process(args, env):
        from tests.conftest import run_cli

        return run_cli(*args, env=env, cwd=cwd, timeout=timeout)
    # Prefect sets up its logging once per process, when it is first imported whole, and
    # closes every handler there is then (absl's among them, whose stream is this process's
    # stderr): done here, outside the call's own streams, as a process does it at its start
    import prefect.main  # noqa: F401
    from typer.testing import CliRunner

    import evalsnap.cli as cli
    from evalsnap import errors, settings

    runner = CliRunner()
    with _environment(env, cwd), fresh_user_code(), _console_width():
        _forget_process_memos()
        with runner.isolation() as (out, err, _):
            with _prefect_logs_to(sys.stderr):
                code = _main(cli, settings, errors, args)
            stdout = out.getvalue().decode("utf-8", "replace")
            stderr = err.getvalue().decode("utf-8", "replace")
    return CliResult(subprocess.CompletedProcess(args, code, stdout, stderr))


def _main(cli: Any, settings: Any, errors: Any, args: tuple[str, ...]) -> int:
    """``evalsnap.cli.main`` up to its exit: the settings check, the app, the exit code
    (what ``main`` does after that, leaving the process, is the subprocess tests')."""
    from evalsnap import exitcodes

    try:
        settings.reload()  # a bad EVALSNAP_* value is a usage error, whatever the command
    except errors.UsageError as exc:
        cli.err.print(f"[red]error:[/] {exc}", highlight=False, soft_wrap=True)
        return int(exitcodes.exit_code(exitcodes.Failed(exc)))
    code: Any
    try:
        cli.app(args=list(args), prog_name="evalsnap")
        code = 0
    except SystemExit as exc:
        code = exc.code
    except Exception as exc:  # noqa: BLE001 - outside a command's own handling: a crash
        cli.crash_message(exc)
        code = exitcodes.exit_code(exitcodes.Failed(exc))
    if isinstance(code, str):  # SystemExit("message") prints the message and exits 1
        sys.stderr.write(code + "\n")
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    return code if isinstance(code, int) else 0
