"""The run context: the collaborators of one run, made when its flow starts and handed down.

A :class:`RunContext` holds what a run's steps share: the open :class:`~storage.Store` (its
read cache and request counts are the run's), the :class:`~evalsnap.settings.Settings`, the
model-call limiter (:class:`~evalsnap.pipeline.limits.ModelLimiter`), the progress sink
(:class:`~evalsnap.pipeline.progress.Progress`), the run's commits and what it published
(:class:`~evalsnap.pipeline.commits.Commits`: the CLI's signal handling), the verdicts on
Prefect's cached results (bounded), and the inference failures no retry fixes. A new run
starts with a new, empty context: nothing one run learnt serves another, and nothing is
found by URL in a module-level registry.

Where a context comes from:

* a flow makes it at its start (:func:`started`), or takes the one its caller in this process
  gave (:func:`given`: the CLI and the Python API, which hold the storage options, listen to
  the progress and watch the commits);
* a read-only command opens one (:meth:`RunContext.open`);
* a task finds its run's with :func:`of` (its request's store URL; task parameters stay
  JSON): in the flow's process the flow's (the flow's task threads inherit it); in a scoring
  process the one its initializer was given (:func:`serve`); in a Dask worker one rebuilt
  from the store URL and the process's settings, kept for the next tasks of the same flow
  run (the contexts of the last :data:`_KEPT` flow runs: a worker serves run after run).

What stays process-global, and why (nothing else does):

* ADK's model registry (``LLMRegistry``) and metric-evaluator registry: ADK resolves models
  and evaluators by name there; agent packages and plugins register in them
  (:mod:`evalsnap.adk.plugins`, whose ``_loaded`` mirrors what it registered);
* imported user code: ``sys.modules`` and ``sys.path``, the agent a process's inference
  tasks run (:func:`evalsnap.pipeline.infer.use_agent`), and the ``evalsnapIdentity``
  declarations of the configs the process resolved (:mod:`evalsnap.agents.identity`), which
  join every identity computed after them, as the registered code does;
* Prefect's settings and contexts, and the saved result-storage block of a store URL
  (:func:`tasks.support.cached`);
* fsspec's filesystem instances (its own cache, per URL and options);
* the environment's settings (:func:`evalsnap.settings.get`: a new context's default, and
  what code below a run's steps reads that is handed no context: the lanes' call and
  inference deadlines, Prefect task options fixed when a task is declared);
* the process's CPU slots (:func:`evalsnap.pipeline.runners.cpu_slot`: the cores are the
  process's, whatever runs it serves);
* the CLI's signal handling (:mod:`evalsnap.cli.signals`: a process has one set of handlers);
* the contexts a process that did not start the run keeps for it (above).
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from evalsnap import settings as _settings
from evalsnap.pipeline.commits import Commits
from evalsnap.pipeline.limits import ModelLimiter
from evalsnap.pipeline.progress import Progress

if TYPE_CHECKING:
    from evalsnap.settings import Settings
    from storage import Store

#: Flow runs whose rebuilt contexts a process keeps (a Dask worker between its tasks).
_KEPT = 2
#: Verdicts on Prefect's cached results a run keeps (a hit is read twice: exists, read).
VERDICTS = 4096


class Verdicts:
    """A bounded memo of verdicts: ``key → bool``, the oldest forgotten first."""

    def __init__(self, size: int = VERDICTS) -> None:
        self._size = size
        self._items: OrderedDict[tuple[str, str], bool] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str]) -> bool | None:
        with self._lock:
            return self._items.get(key)

    def put(self, key: tuple[str, str], ok: bool) -> None:
        with self._lock:
            self._items[key] = ok
            self._items.move_to_end(key)
            while len(self._items) > self._size:
                self._items.popitem(last=False)


class RunContext:
    """The collaborators of one run (see the module docstring). The store is opened on
    first use, so a caller can make the context before the flow that uses it starts (an
    unusable store URL or option is then the flow's error, as it always was)."""

    def __init__(self, store_url: str, *, settings: Settings | None = None,
                 storage_options: dict[str, str] | None = None) -> None:
        self.store_url = store_url
        self.settings = settings if settings is not None else _settings.get()
        #: Options of the store's backend: given by the caller, never a flow parameter.
        self.storage_options = dict(storage_options or {})
        self.limiter = ModelLimiter(self.settings)
        self.progress = Progress()
        self.commits = Commits()
        self.verdicts = Verdicts()
        #: The outcomes objects this process's scoring tasks wrote, and the cache key each
        #: may be cached under (:func:`evalsnap.pipeline.reuse.keep_outcomes`): what the
        #: result storage writes a handle of without reading the object back.
        self.kept_outcomes: dict[str, str] = {}
        #: Failures of the run's inference that no retry fixes, by inference fingerprint
        #: (:mod:`evalsnap.pipeline.infer`: a retry of their batch does not run them again).
        self.settled: dict[str, Any] = {}
        #: Set by the caller in this process that reads the run's summary from here as its
        #: model (:func:`evalsnap.api.run_spec`): the flow then returns only its head, not a
        #: second copy of the whole summary as JSON data (at 10,000 cases ~450 MB).
        self.keeps_summary = False
        #: The run's summary (the ``--json`` object's model), once the flow finished.
        self.summary: Any = None
        self._store: Store | None = None
        self._lock = threading.Lock()
        #: The run's first steps, done before its flow started (:func:`evalsnap.api.prepare`):
        #: the spec they were done for, and their plans or the error they raised.
        self._prepared: tuple[Any, Any] | None = None
        self._run_begun = False

    def begin_run_early(self, spec: Any, plans: Any) -> None:
        """``plans`` (or the error planning raised) are the first steps of the flow that
        will run ``spec`` with this context; the store's run began with them, so what they
        read is the run's (read once, counted once)."""
        self._prepared = (spec, plans)

    def start_run_early(self) -> None:
        """The run's store memory starts now, before its flow (see :meth:`begin_run_early`)."""
        self.store.new_run()
        self._run_begun = True

    def prepared(self) -> tuple[Any, Any] | None:
        """The spec and plans :meth:`begin_run_early` was given, if not taken yet (the plans
        may be the error planning raised)."""
        return self._prepared

    def take_prepared(self, spec: Any) -> Any:
        """The plans prepared for ``spec`` (raising the error planning raised), once; None
        when nothing was prepared for exactly this spec (the flow plans itself)."""
        prepared, self._prepared = self._prepared, None
        if prepared is None or prepared[0] != spec:
            return None
        if isinstance(prepared[1], BaseException):
            raise prepared[1]
        return prepared[1]

    @classmethod
    def open(cls, store_url: str, *, settings: Settings | None = None,
             storage_options: dict[str, str] | None = None) -> RunContext:
        """A context whose store is open now (read-only commands: ``show``, ``verify``…)."""
        ctx = cls(store_url, settings=settings, storage_options=storage_options)
        _ = ctx.store
        return ctx

    @property
    def store(self) -> Store:
        """The run's store (one instance: its read cache and request counts are the run's)."""
        with self._lock:
            if self._store is None:
                from evalsnap.records import repo

                self._store = repo.open_store(self.store_url, self.storage_options,
                                              timeout=self.settings.store_timeout)
            return self._store

    def serves(self, store_url: str) -> bool:
        """Whether this is the context of work on ``store_url`` (however it is spelt)."""
        return store_url == self.store_url or store_url == self.store.url


_current: contextvars.ContextVar[RunContext | None] = contextvars.ContextVar(
    "evalsnap_run_context", default=None)
_kept: OrderedDict[tuple[str, str], RunContext] = OrderedDict()
_kept_lock = threading.Lock()


@contextlib.contextmanager
def given(ctx: RunContext) -> Iterator[RunContext]:
    """``ctx`` is the context of the flow this thread runs next (the CLI, the Python API)."""
    token = _current.set(ctx)
    try:
        yield ctx
    finally:
        _current.reset(token)


@contextlib.contextmanager
def started(store_url: str) -> Iterator[RunContext]:
    """A flow's run: the context its caller gave (:func:`given`) for ``store_url``, else a
    new one; the store starts the run with nothing remembered, and forgets what it read
    when the run ends (a later command in this process reads the store afresh)."""
    ctx = _current.get()
    if ctx is None or not ctx.serves(store_url):
        ctx = RunContext(store_url)
    token = _current.set(ctx)
    if not ctx._run_begun:  # else it began before the flow, with what was prepared for it
        ctx.store.new_run()
    ctx._run_begun = False
    try:
        yield ctx
    finally:
        ctx._prepared = None
        ctx.store.end_run()
        _current.reset(token)


def serve(ctx: RunContext, flow_run_id: str | None) -> None:
    """``ctx`` serves the tasks of flow run ``flow_run_id`` in this process (a scoring
    process's initializer: the flow's store URL and storage options)."""
    ctx.store.new_run()  # this process serves one run: remember what it reads and writes
    _keep((ctx.store_url, str(flow_run_id)), ctx)


def of(store_url: str) -> RunContext:
    """The context of the run that work on ``store_url`` serves (see the module docstring);
    outside any flow run, a new one (the caller keeps it as long as it needs it)."""
    ctx = _current.get()
    if ctx is not None and ctx.serves(store_url):
        return ctx
    flow_run_id = _flow_run_id()
    if flow_run_id is None:
        return RunContext(store_url)
    key = (store_url, flow_run_id)
    with _kept_lock:
        found = _kept.get(key)
        if found is not None:
            _kept.move_to_end(key)
            return found
    ctx = RunContext(store_url)
    ctx.store.new_run()
    return _keep(key, ctx)


def _keep(key: tuple[str, str], ctx: RunContext) -> RunContext:
    with _kept_lock:
        ctx = _kept.setdefault(key, ctx)
        _kept.move_to_end(key)
        while len(_kept) > _KEPT:
            _kept.popitem(last=False)
        return ctx


def _flow_run_id() -> str | None:
    """The flow run the calling task (or flow) belongs to, if any."""
    from prefect.context import FlowRunContext, TaskRunContext

    task = TaskRunContext.get()
    if task is not None and task.task_run.flow_run_id is not None:
        return str(task.task_run.flow_run_id)
    flow = FlowRunContext.get()
    if flow is not None and flow.flow_run is not None:
        return str(flow.flow_run.id)
    return None
