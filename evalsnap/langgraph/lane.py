"""The LangGraph lane as the dispatcher (:mod:`evalsnap.agents.lanes`) sees it.

A dir holding ``langgraph.json`` is this lane's; so is a package exposing ``graph`` and no
ADK agent. Importing this module imports no LangGraph: :mod:`.loader` imports it when a
graph is loaded, :mod:`.inference` (imported when the first case runs) needs it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from evalsnap.agents.base import Lane, LoadedAgent
from evalsnap.errors import AgentLoadError
from evalsnap.langgraph import loader

if TYPE_CHECKING:
    from google.adk.evaluation.eval_case import EvalCase

    from evalsnap.langgraph.inference import GraphCaseRun

__all__ = ["LANE", "LangGraphLane"]


class LangGraphLane:
    name = "langgraph"
    marker: str | None = loader.CONFIG_FILE

    def exposes(self, *modules: Any) -> bool:
        return loader.exposes_graph(*modules)

    def missing_extra(self, path: Path, exc: BaseException) -> AgentLoadError | None:
        return loader.missing_extra(path, exc)

    def load(self, agent_dir: str | Path, agent_name: str | None) -> LoadedAgent:
        return loader.load_agent(agent_dir, agent_name)

    def case_run(self, agent: LoadedAgent, case: EvalCase, **options: Any) -> GraphCaseRun:
        from evalsnap.langgraph.inference import GraphCaseRun

        return GraphCaseRun(agent, case, **options)


LANE: Lane = LangGraphLane()
