"""The keyword table behind :class:`langgraph_agent.chat_model.ScriptedChatModel`.

Pure functions: given the latest user text they return the tool-call steps to make (one
model call per step, each step one ``AIMessage`` with one or more tool calls), and given
the turn's tool results they return the final answer. Model calls per turn = steps + 1.

=========================================  =================================================
user text contains                         steps (tool calls of one model call each)
=========================================  =================================================
``FAIL_MODEL``                             none: the model raises ``ScriptedModelError``
``weather`` + known cities                 ``[get_weather(city) for each city]`` (parallel)
``book N night(s) in City`` (one or more)  ``[add_to_trip(city, nights) …]``; after the
                                           weather step when both are asked
``convert AMOUNT CUR to CUR``              ``[convert_currency(amount, from, to)]``
``trip`` / ``itinerary``                   ``[get_trip()]`` (after a booking step)
starts with hi/hello/hey                   none: "Hello <traveller>! …" (the name comes from
                                           the system message the graph adds from state)
``thank``                                  none: "You're welcome!"
anything else                              none: "Sorry, I can only help with weather,
                                           currency and trip bookings."
=========================================  =================================================
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["CITIES", "RATES_TO_EUR", "answer", "plan_turn"]

CITIES: dict[str, tuple[str, int]] = {
    "paris": ("sunny", 21), "london": ("rainy", 14), "tokyo": ("cloudy", 18),
    "rome": ("sunny", 26), "oslo": ("snowy", -2),
}
RATES_TO_EUR: dict[str, float] = {"EUR": 1.0, "USD": 0.9, "GBP": 1.2, "JPY": 0.006}
FALLBACK = "Sorry, I can only help with weather, currency and trip bookings."
_NUMBERS = {"one": 1, "a": 1, "two": 2, "three": 3, "four": 4, "five": 5}
_BOOK = re.compile(r"\b(\d+|one|a|two|three|four|five)\s+nights?\s+in\s+([A-Z][a-z]+)", re.I)
_CONVERT = re.compile(r"\bconvert\s+(\d+(?:\.\d+)?)\s+([A-Za-z]{3})\s+(?:to|into)\s+([A-Za-z]{3})\b",
                      re.I)

Call = tuple[str, dict[str, Any]]


def _cities(text: str) -> list[str]:
    lowered = text.lower()
    found = sorted((m.start(), name.title()) for name in CITIES
                   for m in re.finditer(rf"\b{name}\b", lowered))
    return list(dict.fromkeys(name for _, name in found))


def plan_turn(user_text: str) -> list[list[Call]] | str:
    """The tool-call steps for this user text, or the direct answer."""
    lowered = user_text.lower()
    steps: list[list[Call]] = []
    if "weather" in lowered and _cities(user_text):
        steps.append([("get_weather", {"city": c}) for c in _cities(user_text)])
    bookings = [(city.title(), int(n) if n.isdigit() else _NUMBERS[n.lower()])
                for n, city in _BOOK.findall(user_text)]
    if re.search(r"\bbook\b", lowered) and bookings:
        steps.append([("add_to_trip", {"city": c, "nights": n}) for c, n in bookings])
    convert = _CONVERT.search(user_text)
    if convert:
        amount, src, dst = convert.groups()
        steps.append([("convert_currency", {"amount": float(amount), "from_currency": src.upper(),
                                            "to_currency": dst.upper()})])
    if re.search(r"\b(trip|itinerary)\b", lowered):
        steps.append([("get_trip", {})])
    if steps:
        return steps
    if re.match(r"\s*(hi|hello|hey)\b", lowered):
        return "Hello{name}! I can check the weather, convert currencies and book your trip."
    if "thank" in lowered:
        return "You're welcome!"
    return FALLBACK


def _stays(stays: list[dict[str, Any]]) -> str:
    parts = [f"{s['nights']} night{'s' if s['nights'] != 1 else ''} in {s['city']}" for s in stays]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def _sentence(name: str, result: dict[str, Any]) -> str:
    if result.get("status") != "ok":
        return f"Sorry, {result.get('error_message', 'that did not work')}"
    if name == "get_weather":
        return f"It is {result['condition']} and {result['temperature_c']}°C in {result['city']}."
    if name == "convert_currency":
        return (f"{result['amount']:g} {result['from_currency']} is {result['converted']:.2f} "
                f"{result['to_currency']}.")
    if name == "add_to_trip":
        return f"Booked {_stays([result])}."
    if name == "get_trip":
        stays = result.get("stays") or []
        return f"Your trip: {_stays(stays)}." if stays else "Your trip is empty."
    return f"I received an unexpected result from {name}."


def answer(results: list[tuple[str, dict[str, Any]]]) -> str:
    """The final answer once every step of the turn has its (tool name, result)s."""
    return " ".join(_sentence(name, result) for name, result in results) or FALLBACK
