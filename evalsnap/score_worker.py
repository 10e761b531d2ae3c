"""A warm worker process that scores part of a run's metrics, on a second core.

A run is Python on one interpreter lock: inference, scoring and the flow's bookkeeping take
turns on one core while the other serves, at most, Prefect's API. Scoring some metrics in
another process gives the run that second core: every metric that calls no judge
(trajectory, ROUGE, state match, custom code metrics: CPU-bound), and every second judge
metric, so that both processes have judge work when the judge answers fast.

One judge limit holds for the run, whichever process calls the judge: the worker draws on
its parent's :class:`evalsnap.pipeline.judge.ProcessLimiter`, whose slots are tokens in a pipe the
worker inherits (GNU make's jobserver protocol), so ``EVALSNAP_JUDGE_CONCURRENCY`` bounds
the requests in flight of both together; if the worker dies holding slots, its parent puts
them back. A Prefect global concurrency limit on judge calls (``evalsnap-judge-model``) is
taken through the flow's Prefect context, which the worker has not: when that limit
exists on the server, judge metrics stay in the flow's process.

The worker starts when a flow that will score starts, so its imports (ADK's evaluators,
the metrics' libraries) overlap the inference. It is one ``python -m
evalsnap.score_worker`` child, talking over two pipes (``multiprocessing.connection``
framing, pickled messages); it exits when its parent closes the pipe or dies
(:mod:`evalsnap._child`), and the flow stops it by PID on the way out. Each request is one
metric of one snapshot, scored by the same :func:`evalsnap.pipeline.stages.score_metric` a task
calls in-process, and flushed before the answer, so the units are where they would have
been.

Nothing is lost if the worker is unusable: a task whose worker died, or is still importing
when the task starts (a small run's inference can end first), scores its metric in its own
process (units already written are content-addressed, so the same objects are written
again; judge answers the worker recorded are in the ledger, so with ``--reuse`` they are
not asked again). An error raised by the scoring itself (a config that
changed, a broken custom metric's import) comes back as the same exception type where it
can be rebuilt, otherwise as :class:`ScoreWorkerError` carrying the type and message.

``EVALSNAP_SCORE_WORKER``: ``auto`` (default: on with two or more cores, when at least
``EVALSNAP_SCORE_WORKER_MIN_UNITS`` units, default 200, of the worker's metrics may score),
``on`` (any size, and a task waits for the worker's imports rather than scoring
in-process), or ``off``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import pickle
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from multiprocessing.connection import Connection
from typing import Any

from evalsnap._child import module_command
from evalsnap.errors import EvalsnapError
from evalsnap.pipeline.judge import SHARED_LIMITER_ENV, judge_limiter
from evalsnap.records import repo

logger = logging.getLogger(__name__)

#: With ``EVALSNAP_SCORE_WORKER=on``, how long a task waits for the worker's imports.
READY_TIMEOUT = 120.0


class ScoreWorkerError(EvalsnapError):
    """The worker raised an exception that cannot be rebuilt in the flow's process."""


class WorkerUnavailable(Exception):
    """The worker died or never became ready: the caller scores in its own process."""


def mode() -> str:
    raw = os.environ.get("EVALSNAP_SCORE_WORKER", "auto").strip().lower() or "auto"
    if raw in ("0", "off", "false", "no"):
        return "off"
    if raw in ("1", "on", "true", "yes"):
        return "on"
    return "auto"


def wanted(units: int) -> bool:
    """Whether a run with ``units`` units for the worker to score should start one."""
    chosen = mode()
    if chosen == "off" or units <= 0:
        return False
    if chosen == "on":
        return True
    min_units = int(os.environ.get("EVALSNAP_SCORE_WORKER_MIN_UNITS", "200"))
    return (os.cpu_count() or 1) >= 2 and units >= min_units


def metrics_for_worker(rules: list[Any], store_url: str, runner: str, units_per_metric: int,
                       *, reuse: bool, force: bool, prefect_judge_limit: bool = False
                       ) -> list[str]:
    """The metrics a run's worker would score; empty when the run should start none.

    A worker is for a run that scores its metrics itself: the thread runner (a Dask
    cluster has its own processes), no ``--reuse`` or with ``--force`` (a reused unit costs
    no CPU), a store another process can open (not ``memory://``), and enough units
    (:func:`wanted`). It takes every metric that calls no judge, and every second judge
    metric in config order, unless judge calls go through a Prefect concurrency limit
    (``prefect_judge_limit``), which only the flow's process takes. ``rules`` are the
    run's ``MetricRule`` objects.
    """
    if runner != "threads" or (reuse and not force) or store_url.startswith("memory://"):
        return []
    picked = [r.metric_name for r in rules if not r.judge]
    if not prefect_judge_limit:
        picked += [r.metric_name for r in rules if r.judge][1::2]
    return picked if wanted(len(picked) * units_per_metric) else []


class ScoreWorker:
    """The flow's handle on one worker process. Thread-safe: every metric task may call."""

    def __init__(self, metrics: list[str]) -> None:
        self.metrics = frozenset(metrics)
        """The metrics this worker scores; a task for any other scores in its own process."""
        # the run's one judge limit, shared (see the module docstring)
        self._judge = judge_limiter()
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        env = {**os.environ,
               # the same imports as here: the flow's packages, examples, user paths
               "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
               "EVALSNAP_SCORE_WORKER_LOG_LEVEL": str(logging.getLogger().getEffectiveLevel()),
               SHARED_LIMITER_ENV: ",".join(map(str, (*self._judge.fds, self._judge.slots)))}
        try:
            self.proc = subprocess.Popen(
                module_command("evalsnap.score_worker", str(to_child_r), str(from_child_w),
                               *metrics),
                pass_fds=(to_child_r, from_child_w, *self._judge.fds), env=env,
                stdin=subprocess.DEVNULL)
        except BaseException:
            os.close(to_child_w)
            os.close(from_child_r)
            raise
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        self._out = Connection(to_child_w, readable=False)
        self._in = Connection(from_child_r, writable=False)
        self._send_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[Future[Any], Callable[[], None] | None]] = {}
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._dead: str | None = None
        self._reader = threading.Thread(target=self._read, name="evalsnap-score-worker",
                                        daemon=True)
        self._reader.start()

    def is_ready(self) -> bool:
        return self._ready.is_set() and not self._dead

    def wait_ready(self, timeout: float) -> bool:
        """Waits until the worker has imported what it needs (True) or is unusable."""
        return self._ready.wait(timeout) and not self._dead

    @property
    def pid(self) -> int:
        return self.proc.pid

    # -- requests ----------------------------------------------------------------------------

    def score_metric(self, on_unit: Callable[[], None] | None = None,
                     **kwargs: Any) -> list[dict[str, Any]]:
        """``stages.score_metric(**kwargs)`` in the worker, flushed; the outcomes as dicts.

        Raises :class:`WorkerUnavailable` if the worker is (or becomes) unusable, or has not
        finished its imports (:func:`score_in_worker` decides whether to wait for them).
        """
        if not self._ready.is_set() or self._dead:
            raise WorkerUnavailable(self._dead or "the worker is still starting")
        future: Future[Any] = Future()
        req = next(self._ids)
        with self._lock:
            if self._dead:
                raise WorkerUnavailable(self._dead)
            self._pending[req] = (future, on_unit)
        # --storage-option values go by the private pipe, never by argv or environment
        options = repo.storage_options_of(kwargs["store_url"])
        try:
            with self._send_lock:
                self._out.send(("score", req, kwargs, options))
        except (OSError, ValueError) as exc:
            self._fail(self._why_gone(exc))
        return future.result()

    def close(self, timeout: float = 10.0) -> None:
        """Asks the worker to exit, then stops it by PID if it has not."""
        try:
            with self._send_lock:
                self._out.send(("stop",))
        except (OSError, ValueError):
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for conn in (self._out, self._in):
            try:
                conn.close()
            except OSError:
                pass
        self._fail("the worker was stopped")

    # -- the reader thread -----------------------------------------------------------------

    def _read(self) -> None:
        while True:
            try:
                msg = self._in.recv()
            except (EOFError, OSError, pickle.UnpicklingError) as exc:
                self._fail(self._why_gone(exc))
                return
            try:
                self._dispatch(msg)
            except Exception:  # noqa: BLE001 - a progress or log hook must not stop replies
                logger.exception("could not handle the scoring worker's message %r", msg[0])

    def _dispatch(self, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == "ready":
            self._ready.set()
        elif kind == "log":
            record = logging.makeLogRecord(msg[1])
            logging.getLogger(record.name).handle(record)
        elif kind == "unit":
            entry = self._pending.get(msg[1])
            if entry and entry[1] is not None:
                entry[1]()
        elif kind in ("done", "error"):
            with self._lock:
                entry = self._pending.pop(msg[1], None)
            if entry is None:
                return
            if kind == "done":
                entry[0].set_result(msg[2])
            else:
                entry[0].set_exception(_rebuild(msg[2]))

    def _why_gone(self, exc: BaseException) -> str:
        try:
            code = self.proc.wait(timeout=2)  # a closed pipe usually means it is exiting
        except subprocess.TimeoutExpired:
            return f"the worker's pipe broke ({exc!r})"
        return f"the worker exited (code {code})"

    def _fail(self, why: str) -> None:
        with self._lock:
            if self._dead is None:
                self._dead = why
            pending, self._pending = self._pending, {}
        if self.proc.poll() is not None:
            # judge slots the worker held when it died would be gone from the run for good
            lost = self._judge.recover()
            if lost:
                logger.warning("the scoring worker held %d judge slots when it stopped; "
                               "returned them", lost)
        self._ready.set()  # wake waiters: they see _dead
        for future, _ in pending.values():
            if not future.done():
                future.set_exception(WorkerUnavailable(why))


def _rebuild(error: dict[str, Any]) -> BaseException:
    """The worker's exception, unpickled when it can be, else a ScoreWorkerError."""
    try:
        exc = pickle.loads(error["pickled"]) if error.get("pickled") else None
    except Exception:  # noqa: BLE001 - a type whose constructor needs other arguments
        exc = None
    if isinstance(exc, BaseException):
        return exc
    return ScoreWorkerError(f"{error['type']} in the scoring worker: {error['message']}\n"
                            f"{error['traceback']}")


# ---- the flow's worker ----------------------------------------------------------------------

_current: ScoreWorker | None = None
_current_lock = threading.Lock()


def current() -> ScoreWorker | None:
    return _current


@contextmanager
def running(metrics: list[str]) -> Iterator[ScoreWorker | None]:
    """Inside a flow: a worker for this block that scores ``metrics`` (none if empty; see
    :func:`metrics_for_worker`), with their libraries loaded before the first request.

    One per process at a time: a flow run inside another (or a second concurrent flow in
    the same process) shares the first one's worker.
    """
    global _current
    with _current_lock:
        if _current is not None or not metrics:
            worker = None
        else:
            try:
                worker = _current = ScoreWorker(metrics)
            except OSError as exc:
                logger.warning("could not start the scoring worker (%s); scoring in-process",
                               exc)
                worker = None
    try:
        yield worker or _current
    finally:
        if worker is not None:
            with _current_lock:
                _current = None
            worker.close()


def score_in_worker(on_unit: Callable[[], None] | None, **kwargs: Any
                    ) -> list[dict[str, Any]] | None:
    """The outcomes from the flow's worker, or None: no worker, or it is unusable."""
    worker = _current
    if worker is None:
        return None
    if not worker.is_ready() and not (mode() == "on" and worker.wait_ready(READY_TIMEOUT)):
        logger.info("scoring %s in the flow's process: its worker is still starting",
                    kwargs.get("metric_name"))
        return None
    try:
        return worker.score_metric(on_unit=on_unit, **kwargs)
    except WorkerUnavailable as why:
        logger.warning("scoring %s in the flow's process: %s", kwargs.get("metric_name"), why)
        return None


# ---- the worker process -------------------------------------------------------------------

class _Forward(logging.Handler):
    def __init__(self, send: Callable[[tuple[Any, ...]], None]) -> None:
        super().__init__()
        self._send = send

    def emit(self, record: logging.LogRecord) -> None:
        try:
            data = dict(record.__dict__)
            data["msg"] = record.getMessage()
            data["args"] = None
            if record.exc_info:
                data["exc_text"] = logging.Formatter().formatException(record.exc_info)
            data["exc_info"] = None
            self._send(("log", data))
        except Exception:  # noqa: BLE001 - a log line must never break scoring
            self.handleError(record)


def _serve(argv: list[str]) -> None:
    inbound = Connection(int(argv[0]), writable=False)
    outbound = Connection(int(argv[1]), readable=False)
    send_lock = threading.Lock()

    def send(msg: tuple[Any, ...]) -> None:
        with send_lock:
            outbound.send(msg)

    import warnings

    # ADK marks its eval API experimental and warns on every construction (as the CLI
    # filters); any other warning reaches the flow's process as a log record.
    warnings.filterwarnings("ignore", message=r"\[EXPERIMENTAL\]", category=UserWarning)
    logging.captureWarnings(True)
    root = logging.getLogger()
    root.setLevel(int(os.environ.get("EVALSNAP_SCORE_WORKER_LOG_LEVEL", logging.WARNING)))
    root.addHandler(_Forward(send))

    from evalsnap import lazy_imports as _lazy
    from evalsnap.pipeline import stages  # importing evalsnap installs the deferred imports

    loaded = _lazy.preload(argv[2:])
    if loaded is not None:
        loaded.join()
    send(("ready",))

    def score(req: int, kwargs: dict[str, Any], options: dict[str, str]) -> None:
        try:
            if options:
                repo.configure_store(kwargs["store_url"], options)
            outcomes = asyncio.run(stages.score_metric(
                **kwargs, on_unit=lambda: send(("unit", req))))
            repo.open_store(kwargs["store_url"]).flush()
            send(("done", req, [o.model_dump(mode="json") for o in outcomes]))
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to the task
            try:
                pickled: bytes | None = pickle.dumps(exc)
            except Exception:  # noqa: BLE001
                pickled = None
            send(("error", req, {"type": type(exc).__qualname__, "message": str(exc),
                                 "traceback": "".join(traceback.format_exception(exc)),
                                 "pickled": pickled}))

    threads: list[threading.Thread] = []
    while True:
        try:
            msg = inbound.recv()
        except (EOFError, OSError):
            os._exit(0)  # the flow's process is gone: nothing to answer
        if msg[0] == "stop":
            for thread in threads:
                thread.join()
            sys.stdout.flush()
            os._exit(0)
        thread = threading.Thread(target=score, args=msg[1:], daemon=True)
        thread.start()
        threads = [t for t in threads if t.is_alive()] + [thread]


if __name__ == "__main__":
    _serve(sys.argv[1:])
