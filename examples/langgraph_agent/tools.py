"""The trip planner's tools: two pure ones, one that writes graph state, one that reads it."""

from __future__ import annotations

import json
from typing import Annotated, Any

from langchain_core.messages import ToolMessage
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.prebuilt import InjectedState
from langgraph.types import Command

from ._script import CITIES, RATES_TO_EUR

__all__ = ["TOOLS", "add_to_trip", "convert_currency", "get_trip", "get_weather"]


@tool
def get_weather(city: str) -> dict[str, Any]:
    """Returns the current weather for a city.

    Args:
        city: The city name, for example "Paris".
    """
    known = CITIES.get(city.strip().lower())
    if known is None:
        return {"status": "error", "city": city, "error_message": f"there is no weather data for {city}."}
    return {"status": "ok", "city": city, "condition": known[0], "temperature_c": known[1]}


@tool
def convert_currency(amount: float, from_currency: str, to_currency: str) -> dict[str, Any]:
    """Converts an amount of money between two currencies (EUR, USD, GBP, JPY).

    Args:
        amount: How much money, in from_currency.
        from_currency: The three-letter code of the currency to convert from.
        to_currency: The three-letter code of the currency to convert to.
    """
    if from_currency not in RATES_TO_EUR or to_currency not in RATES_TO_EUR:
        return {"status": "error", "error_message": f"I cannot convert {from_currency} to {to_currency}."}
    converted = round(amount * RATES_TO_EUR[from_currency] / RATES_TO_EUR[to_currency], 2)
    return {"status": "ok", "amount": amount, "from_currency": from_currency,
            "to_currency": to_currency, "converted": converted}


@tool
def add_to_trip(city: str, nights: int, tool_call_id: Annotated[str, InjectedToolCallId]) -> Command:
    """Books nights in a city and adds the stay to the traveller's trip.

    Args:
        city: The city to stay in.
        nights: How many nights; at least 1.
    """
    if nights < 1:
        result: dict[str, Any] = {"status": "error", "error_message": "a stay is at least one night."}
        return Command(update={"messages": [ToolMessage(json.dumps(result), tool_call_id=tool_call_id,
                                                        name="add_to_trip")]})
    result = {"status": "ok", "city": city, "nights": nights}
    # The graph's `trip` reducer merges this stay into the state (parallel bookings included).
    return Command(update={"trip": [{"city": city, "nights": nights}], "messages": [
        ToolMessage(json.dumps(result), tool_call_id=tool_call_id, name="add_to_trip")]})


@tool
def get_trip(state: Annotated[dict[str, Any], InjectedState]) -> dict[str, Any]:
    """Returns the stays booked so far on the traveller's trip."""
    return {"status": "ok", "stays": list(state.get("trip") or [])}


TOOLS = [get_weather, convert_currency, add_to_trip, get_trip]
