"""The LangGraph lane: a compiled LangGraph graph evaluated through ADK's invocation contract.

An agent dir that exposes ``graph`` (or holds a ``langgraph.json``) is run turn by turn on
the graph (:mod:`.inference`); each turn's messages become one ADK ``Invocation``, so
freeze, every metric, the judge ledger, publish and reuse are the ADK lane's. Its identity
is the package files plus the graph's structure (:mod:`.identity`); :mod:`.loader` loads
it, and :mod:`.lane` is the lane as the dispatcher (:mod:`evalsnap.agents.lanes`) sees it.
Importing this package imports no LangGraph: it is an optional extra
(``evalsnap[langgraph]``), imported only when a LangGraph agent is loaded.
"""

from __future__ import annotations

__all__ = ["EXTRA_HINT"]

EXTRA_HINT = "pip install 'evalsnap[langgraph]'"
"""What to run when a LangGraph agent meets an install without LangGraph."""
