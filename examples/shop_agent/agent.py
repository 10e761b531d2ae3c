"""``root_agent`` of the demo: an ADK Agent on the scripted offline model."""

from __future__ import annotations

from google.adk.agents import Agent

# The demo's models live in this package, so a copy of the agent dir carries them. The
# relative import loads them as shop_agent.offline_models, the module test_config.json
# names under evalsnapPlugins (one module, one set of classes and counters); importing it
# registers both models with ADK's LLMRegistry.
from . import offline_models
from .tools import add_to_cart, get_cart, get_weather

__all__ = ["root_agent"]

root_agent = Agent(
    name="shop_agent",
    model=offline_models.AGENT_MODEL,
    description="A shop assistant that reports the weather and manages a shopping cart.",
    instruction=(
        "You are a shop assistant. Use get_weather for weather questions, add_to_cart to add"
        " items to the user's cart and get_cart to show it. Answer in one short sentence."
        " Politely decline anything else."
    ),
    tools=[get_weather, add_to_cart, get_cart],
)
