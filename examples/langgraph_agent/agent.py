"""``graph`` of the demo: a LangGraph tool-calling loop on the scripted chat model.

``agent`` (the chat model, bound to the tools) → ``tools`` (LangGraph's ``ToolNode``) while
the model asks for tools, then the end. The state holds the messages, the booked ``trip``
(merged by a reducer, so parallel bookings add up) and an optional ``traveller`` name,
which the agent node passes to the model as a system message.
"""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

from langchain_core.messages import AnyMessage, SystemMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition

from .chat_model import ScriptedChatModel
from .tools import TOOLS

__all__ = ["TripState", "graph", "merge_trip"]


def merge_trip(current: list[dict[str, Any]] | None,
               update: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Adds the nights of each stay in ``update`` to the same city's stay, else appends it."""
    merged = [dict(stay) for stay in current or []]
    for stay in update or []:
        same = next((s for s in merged if s["city"] == stay["city"]), None)
        if same is None:
            merged.append(dict(stay))
        else:
            same["nights"] += stay["nights"]
    return merged


class TripState(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    trip: Annotated[list[dict[str, Any]] | None, merge_trip]
    traveller: str


MODEL = ScriptedChatModel().bind_tools(TOOLS)


def call_model(state: TripState, config: RunnableConfig) -> dict[str, Any]:
    messages = list(state["messages"])
    if state.get("traveller"):
        messages.insert(0, SystemMessage(f"The traveller's name is {state['traveller']}."))
    return {"messages": [MODEL.invoke(messages, config)]}


builder = StateGraph(TripState)
builder.add_node("agent", call_model)
builder.add_node("tools", ToolNode(TOOLS))
builder.add_edge(START, "agent")
builder.add_conditional_edges("agent", tools_condition)
builder.add_edge("tools", "agent")
graph = builder.compile(name="trip_agent")
