"""The demo trip planner: a LangGraph graph in the package shape ``evalsnap run`` loads.

The package exposes ``graph`` (a compiled LangGraph graph), which is how evalsnap tells a
LangGraph agent from an ADK one (an ADK package exposes ``root_agent``).
"""

from .agent import graph

__all__ = ["graph"]
