"""Which lane an agent is, loading it, and running it on one case into an inference record.

The lanes are named in one table, :data:`LANES`, by the module that holds each one's
:data:`LANE` (a :class:`~evalsnap.agents.base.Lane`); a lane's module is imported only when
it is needed, so an ADK agent never imports LangGraph (an optional extra). A new framework
is a new lane module and one entry here.

Detection (:func:`load_agent`): ``--framework`` forces a lane; else a dir holding a lane's
marker file (``langgraph.json``) is that lane's; else the package is imported the default
lane's way (ADK's: its ``.env`` first) and the default lane's entry points (ADK's ``app``,
``root_agent``, ``get_agent_async``) win over another lane's (LangGraph's ``graph``).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from google.adk.version import __version__ as ADK_VERSION

from evalsnap.agents.base import DefaultLane, Lane, LoadedAgent, failure_record, now_iso
from evalsnap.errors import AgentLoadError, UsageError
from evalsnap.fingerprint import inference_fingerprint
from evalsnap.records import InferenceRecord

if TYPE_CHECKING:
    from google.adk.evaluation.eval_case import EvalCase

__all__ = ["DEFAULT", "FRAMEWORKS", "LANES", "check_framework", "lane", "load_agent",
           "missing_extra", "run_inference"]

LANES: dict[str, str] = {"adk": "evalsnap.adk.lane", "langgraph": "evalsnap.langgraph.lane"}
"""Lane name → the module holding its ``LANE``, in detection order."""
DEFAULT = "adk"
"""The lane that imports a package to detect its framework, and whose entry points win."""
FRAMEWORKS = tuple(LANES)
"""The values of ``--framework`` (``load_agent(framework=...)``); None detects."""


def lane(name: str) -> Lane:
    """The lane of that name (its module imported now, on first use)."""
    return cast(Lane, importlib.import_module(LANES[name]).LANE)


def _default() -> DefaultLane:
    return cast(DefaultLane, importlib.import_module(LANES[DEFAULT]).LANE)


def check_framework(framework: str | None) -> str | None:
    if framework is not None and framework not in FRAMEWORKS:
        raise UsageError(f"--framework {framework!r} is not known; use one of {', '.join(FRAMEWORKS)} "
                         "(or leave it out to detect it from the agent dir).")
    return framework


def missing_extra(path: Path, exc: BaseException) -> AgentLoadError | None:
    """The typed error for an import of an agent package that failed because a lane's
    optional extra is not installed (``pip install 'evalsnap[langgraph]'``); None else."""
    for name in FRAMEWORKS:
        found = lane(name).missing_extra(path, exc)
        if found is not None:
            return found
    return None


def _by_marker(agent_dir: str | Path) -> str | None:
    for name in FRAMEWORKS:
        marker = lane(name).marker
        if marker is not None and (Path(agent_dir) / marker).is_file():
            return name
    return None


def load_agent(agent_dir: str | Path, agent_name: str | None = None,
               framework: str | None = None) -> LoadedAgent:
    """Imports an agent package, with the lane ``framework`` names (``--framework``) or the
    one detected (see the module docstring). ``agent_name``: the lane's choice of one agent
    in the dir (ADK: a sub-agent of the tree; LangGraph: a graph of ``langgraph.json``)."""
    framework = check_framework(framework) or _by_marker(agent_dir)
    if framework is not None:
        return lane(framework).load(agent_dir, agent_name)
    default = _default()
    modules = default.import_package(agent_dir)
    if not default.exposes(*modules):
        for name in FRAMEWORKS:
            if name != DEFAULT and lane(name).exposes(*modules):
                return lane(name).load(agent_dir, agent_name)
    return default.load(agent_dir, agent_name, modules)


async def run_inference(agent: LoadedAgent, case: EvalCase, *, eval_set_id: str, repetition: int = 0,
                        run_id: str = "", attempt: int = 1, fingerprint: str | None = None,
                        **options: Any) -> InferenceRecord:
    """Runs the agent over one case with its lane; an exception becomes a ``failure`` record
    (with its traceback, and whether a retry could fix it: :mod:`evalsnap.agents.failures`).

    ``fingerprint``: the inference key the plan computed (default: from ``agent.identity``).
    ``options``: the lane's own (ADK: ``user_simulator_config``, ``session_service``).
    """
    run = lane(agent.framework).case_run(agent, case, **options)
    fields: dict[str, Any] = dict(
        inference_fingerprint=fingerprint or inference_fingerprint(agent.identity, case, repetition),
        eval_set_id=eval_set_id, eval_id=case.eval_id, repetition=repetition,
        app_name=case.session_input.app_name if case.session_input else agent.name,
        agent_name=agent.root_agent.name, adk_version=ADK_VERSION, attempts=attempt,
        run_id=run_id, created_at=now_iso(), agent_manifest=agent.manifest,
    )
    try:
        invocations = await run.run()
    except Exception as exc:  # the agent's own failures are the inference's, recorded
        return failure_record(exc, run.model_calls, run.model_usage, run.initial_state, fields)
    final = await run.final_state()
    return InferenceRecord(
        status="success", invocations=invocations, model_calls=run.model_calls,
        model_usage=run.model_usage, initial_session_state=run.initial_state,
        final_session_state=final, **fields,
    )
