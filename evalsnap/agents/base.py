"""What every framework lane shares: the loaded agent, its package files, the inference
record's parts, and the :class:`Lane` protocol a lane implements.

A lane (``evalsnap/adk/lane.py``, ``evalsnap/langgraph/lane.py``) detects its agents, loads
one into a :class:`LoadedAgent` and runs it on one case; the dispatcher
(:mod:`evalsnap.agents.lanes`) picks the lane and builds the inference record from what the
run gave (:class:`CaseRun`). No lane imports another: what two lanes need is here.
"""

from __future__ import annotations

import copy
import datetime as dt
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from google.adk.agents.base_agent import BaseAgent
from google.adk.apps.app import App

from evalsnap.agents import identity
from evalsnap.agents.failures import is_transient, traceback_of
from evalsnap.errors import AgentLoadError, InputFileError
from evalsnap.fingerprint import fingerprint
from evalsnap.records import InferenceRecord

if TYPE_CHECKING:
    from google.adk.evaluation.eval_case import EvalCase, Invocation

    from evalsnap.records.inference import ModelUsage

__all__ = ["CaseRun", "DefaultLane", "Lane", "LoadedAgent", "clean_state", "ensure_importable", "failure_record",
           "files_manifest", "now_iso"]

#: Files that describe the evaluation, not the agent: editing a reference answer
#: must not look like a new agent. (An old test file's initial session is a case input,
#: in the inference fingerprint through the case's ``session_input``.)
_EVAL_FILE_SUFFIXES = (".evalset.json", ".test.json", ".evalset_result.json")
_SKIP_NAMES = {"test_config.json", "initial.session.json"}
_SKIP_DIRS = {"__pycache__", ".adk", ".evalsnap", ".git", ".venv", "node_modules"}
#: Files that hold credentials: never part of the identity (see :func:`files_manifest`).
_SECRET_FILES = frozenset({".env", ".envrc", ".netrc", ".pypirc", ".npmrc", ".pgpass",
                           ".git-credentials"})
#: ADK writes bookkeeping such as ``__llm_request_key__`` into state.
_INTERNAL_KEY = re.compile(r"^__.*__$")


@dataclass
class LoadedAgent:
    """An imported agent package."""

    path: Path
    name: str
    root_agent: BaseAgent
    app: App | None
    base_manifest: dict[str, Any]
    """What the agent is, before the config's declarations (:mod:`evalsnap.agents.identity`):
    package files, the resolved agent tree and App, the ``.env`` values, versions (+ the
    selected sub-agent's name); for a LangGraph agent the graph's structure instead of the
    tree (:mod:`evalsnap.langgraph.identity`)."""
    framework: str = "adk"
    """The lane's name (:data:`evalsnap.agents.lanes.LANES`): ``adk``, or ``langgraph`` (then
    ``root_agent`` is a named placeholder and ``graph`` runs)."""
    graph: Any = None
    """The compiled LangGraph graph of a ``langgraph`` agent."""
    _identities: dict[Any, tuple[dict[str, Any], str]] = field(
        default_factory=dict, repr=False, compare=False)

    def _resolved(self) -> tuple[dict[str, Any], str]:
        declared = identity.declared_inputs()
        if declared not in self._identities:
            manifest = dict(self.base_manifest)
            if declared:
                manifest["declared"] = identity.resolve_declared(list(declared))
            self._identities[declared] = manifest, fingerprint("agent", manifest)
        return self._identities[declared]

    @property
    def manifest(self) -> dict[str, Any]:
        """The identity manifest (no secret values): stored with every inference."""
        return self._resolved()[0]

    @property
    def identity(self) -> str:
        """The fingerprint of :attr:`manifest`: the agent part of the inference key."""
        return self._resolved()[1]


def ensure_importable(agent_dir: str | Path) -> Path:
    """Puts the agent's parent on ``sys.path`` so ``my_agent.metrics.fn`` imports."""
    path = Path(agent_dir).resolve()
    parent = str(path.parent)
    if parent not in sys.path:
        sys.path.insert(0, parent)
    return path


# ---- the package files of an identity ---------------------------------------------------------

def _is_secret_file(name: str) -> bool:
    """``.env``, ``.env.<anything>`` (``.env.local``…) and the other credential dotfiles."""
    return name in _SECRET_FILES or name.startswith(".env.")


def _skipped_file(name: str) -> bool:
    return (name in _SKIP_NAMES or name.endswith(_EVAL_FILE_SUFFIXES) or name.endswith(".pyc")
            or _is_secret_file(name))


def files_manifest(path: Path) -> dict[str, str]:
    """Every file of the package that is code or data of the agent, by relative path, with a
    hash of its bytes.

    Left out: eval files (eval sets, ``.test.json``, ``test_config.json``,
    ``initial.session.json``: editing a reference answer is not a new agent), caches, and
    secret files: ``.env`` (and ``.env.*``, ``.envrc``, ``.netrc``, ``.pypirc``, ``.npmrc``,
    ``.pgpass``, ``.git-credentials``) are never read here. The non-secret values of the
    ``.env`` ADK loads are in the identity by key (:func:`evalsnap.agents.identity.dotenv_values_of`),
    so rotating an API key reruns nothing while a scenario switch does.
    """
    out: dict[str, str] = {}
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
        for name in sorted(files):
            if _skipped_file(name):
                continue
            file = Path(root, name)
            try:
                data = file.read_bytes()
            except OSError as exc:
                raise InputFileError(
                    f"cannot read {file} in agent dir {path} ({exc}); every file of the agent "
                    "package is part of its identity: make it readable or move it out."
                ) from exc
            out[file.relative_to(path).as_posix()] = identity.file_hash(data)
    return out


# ---- the inference record's parts -------------------------------------------------------------

def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def clean_state(state: dict[str, Any] | None) -> dict[str, Any] | None:
    """A detached copy without ADK's internal keys."""
    if state is None:
        return None
    return {k: copy.deepcopy(v) for k, v in state.items() if not _INTERNAL_KEY.match(k)}


def failure_record(exc: BaseException, calls: int, usage: list[ModelUsage] | None,
                   initial_state: dict[str, Any] | None, fields: dict[str, Any]) -> InferenceRecord:
    """A failed inference: the error, its traceback, whether a retry could fix it, and what
    the calls before it spent."""
    return InferenceRecord(status="failure", error=f"{type(exc).__name__}: {exc}",
                           traceback=traceback_of(exc), retryable=is_transient(exc),
                           model_calls=calls, model_usage=usage,
                           initial_session_state=initial_state, **fields)


# ---- the protocol -----------------------------------------------------------------------------

class CaseRun(Protocol):
    """One run of an agent over one case, set up by its lane (:meth:`Lane.case_run`).

    :meth:`run` runs it; whether it returns or raises, the other members say what it spent
    and saw so far: the dispatcher reads them for the record, a success's or a failure's
    (:meth:`final_state` after a success only).
    """

    @property
    def model_calls(self) -> int:
        """Model calls made so far."""

    @property
    def model_usage(self) -> list[ModelUsage] | None:
        """The usage each model response reported (None: the lane does not see it)."""

    @property
    def initial_state(self) -> dict[str, Any] | None:
        """The session state the case started from, once known."""

    async def run(self) -> list[Invocation]:
        """The case's invocations, one per turn; raises what failed it (a failed inference)."""

    async def final_state(self) -> dict[str, Any] | None:
        """The session state the case ended in, after :meth:`run` returned."""


class Lane(Protocol):
    """A framework lane, as the dispatcher (:mod:`evalsnap.agents.lanes`) uses it."""

    name: str
    """The ``--framework`` value and :attr:`LoadedAgent.framework`."""
    marker: str | None
    """A file whose presence in an agent dir makes the dir this lane's (``langgraph.json``)."""

    def exposes(self, *modules: Any) -> bool:
        """Whether an imported module exposes this lane's entry point."""

    def missing_extra(self, path: Path, exc: BaseException) -> AgentLoadError | None:
        """The typed error for an import of ``path`` that failed because this lane's
        optional dependencies are not installed; None when that is not why."""

    def load(self, agent_dir: str | Path, agent_name: str | None) -> LoadedAgent:
        """The agent of ``agent_dir`` (``agent_name``: the lane's choice of one in it)."""

    def case_run(self, agent: LoadedAgent, case: EvalCase, **options: Any) -> CaseRun:
        """Sets up one run of ``agent`` over ``case``; lane-specific ``options``
        (ADK: ``user_simulator_config``, ``session_service``) are ignored by other lanes."""


class DefaultLane(Lane, Protocol):
    """The lane that imports a package to detect its framework (ADK's: its entry points win
    over another lane's)."""

    def import_package(self, agent_dir: str | Path) -> tuple[Any, ...]:
        """Imports the agent package as this lane loads it (its ``.env`` first) and returns
        the modules that may expose an entry point (:meth:`Lane.exposes`)."""

    def load(self, agent_dir: str | Path, agent_name: str | None,
             imported: tuple[Any, ...] | None = None) -> LoadedAgent:
        """As :meth:`Lane.load`; ``imported``: what :meth:`import_package` returned for the
        dir, when the dispatcher imported the package already (it is not imported again)."""
