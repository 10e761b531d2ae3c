"""The ADK lane as the dispatcher (:mod:`evalsnap.agents.lanes`) sees it: the default lane.

It imports a package to detect its framework (its ``.env`` first, as ``adk eval``), and
its entry points (``app``, ``root_agent``, ``get_agent_async``) win over another lane's.
Loading is :mod:`evalsnap.adk.agent`'s, running a case :mod:`evalsnap.adk.inference`'s
(imported when the first case runs).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from evalsnap.adk import agent as _agent
from evalsnap.agents.base import DefaultLane, LoadedAgent
from evalsnap.errors import AgentLoadError

if TYPE_CHECKING:
    from google.adk.evaluation.eval_case import EvalCase

    from evalsnap.adk.inference import AdkCaseRun

__all__ = ["LANE", "AdkLane"]


class AdkLane:
    name = "adk"
    marker: str | None = None

    def import_package(self, agent_dir: str | Path) -> tuple[Any, ...]:
        return _agent.import_package(agent_dir)

    def exposes(self, *modules: Any) -> bool:
        return _agent.exposes_agent(*modules)

    def missing_extra(self, path: Path, exc: BaseException) -> AgentLoadError | None:
        return None  # google-adk is evalsnap's own dependency

    def load(self, agent_dir: str | Path, agent_name: str | None,
             imported: tuple[Any, ...] | None = None) -> LoadedAgent:
        return _agent.load_agent(agent_dir, agent_name, imported)

    def case_run(self, agent: LoadedAgent, case: EvalCase, **options: Any) -> AdkCaseRun:
        from evalsnap.adk.inference import AdkCaseRun

        return AdkCaseRun(agent, case, **options)


LANE: DefaultLane = AdkLane()
