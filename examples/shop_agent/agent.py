"""``root_agent`` of the demo: an ADK Agent on the scripted offline model."""

from __future__ import annotations

import sys
from pathlib import Path

# `adk eval` and evalsnap put only the agent dir's parent (examples/) on sys.path; the
# offline models must still be imported under their one canonical name
# (examples.offline_models), so add the repository root when it is missing.
try:
    from examples import offline_models
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from examples import offline_models

from google.adk.agents import Agent

from .tools import add_to_cart, get_cart, get_weather

__all__ = ["root_agent"]

offline_models.register()

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
