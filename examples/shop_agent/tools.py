"""The shop assistant's tools: one pure, two that read or write session state."""

from __future__ import annotations

import copy
from typing import Any

from google.adk.tools import ToolContext

from ._agent_script import KNOWN_CITIES

__all__ = ["add_to_cart", "get_cart", "get_weather"]

CART_KEY = "cart"


def get_weather(city: str) -> dict[str, Any]:
    """Returns the current weather for a city.

    Args:
      city: The city name, for example "Paris".

    Returns:
      status "ok" with condition and temperature_c, or status "error" with error_message.
    """
    known = KNOWN_CITIES.get(city.strip().lower())
    if known is None:
        return {"status": "error", "city": city, "error_message": f"No weather data for {city}."}
    condition, temperature_c = known
    return {"status": "ok", "city": city, "condition": condition, "temperature_c": temperature_c}


def add_to_cart(item: str, quantity: int, tool_context: ToolContext) -> dict[str, Any]:
    """Adds a quantity of an item to the user's shopping cart.

    Args:
      item: The item name in singular, for example "apple".
      quantity: How many to add; at least 1.

    Returns:
      status "added" with the item, quantity and total_items, or status "error".
    """
    if quantity < 1:
        return {"status": "error", "item": item, "error_message": "quantity must be at least 1."}
    # Copy, then assign: ADK records state changes on assignment, not on in-place mutation.
    cart: list[dict[str, Any]] = copy.deepcopy(tool_context.state.get(CART_KEY) or [])
    for entry in cart:
        if entry.get("item") == item:
            entry["quantity"] = int(entry.get("quantity", 0)) + quantity
            break
    else:
        cart.append({"item": item, "quantity": quantity})
    tool_context.state[CART_KEY] = cart
    total = sum(int(entry.get("quantity", 0)) for entry in cart)
    return {"status": "added", "item": item, "quantity": quantity, "total_items": total}


def get_cart(tool_context: ToolContext) -> dict[str, Any]:
    """Returns the items in the user's shopping cart.

    Returns:
      status "ok" and items, a list of {item, quantity}.
    """
    return {"status": "ok", "items": copy.deepcopy(tool_context.state.get(CART_KEY) or [])}
