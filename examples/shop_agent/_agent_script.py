"""The keyword table behind :class:`shop_agent.offline_models.ScriptedAgentLlm`.

Pure functions, no ADK model machinery: given the latest user text they return the tool
calls to make (in order), and given this turn's tool results they return the final answer.
Keeping the script here makes the behaviour table readable in one place and testable
without running an agent.

Behaviour table (first matching row wins; matching is case-insensitive except for the
``FAIL_MODEL`` token):

=====================  ================================  ===================================
user text contains     tool calls (one per model call)   final answer
=====================  ================================  ===================================
``FAIL_MODEL``         none: the model raises            ``ScriptedModelError``
``weather`` + city(s)  ``get_weather(city)`` per city    "It is sunny and 21°C in Paris."
``weather``, no city   none                              "Which city would you like the
                                                         weather for?"
``add`` + N item(s)    ``add_to_cart(item, quantity)``   "Added 2 apples and 1 banana to
                       per item                          your cart."
``add``, no item       none                              "What would you like to add to
                                                         your cart?"
``cart``               ``get_cart()``                    "Your cart has 3 apples." /
                                                         "Your cart is empty."
starts hi/hello/hey    none                              "Hello! I can check the weather
                                                         and manage your shopping cart."
``thank``              none                              "You're welcome!"
anything else          none                              "Sorry, I can only help with
                                                         weather and shopping."
=====================  ================================  ===================================

Tool errors become the answer: "Sorry, I have no weather data for Atlantis." (city not in
``KNOWN_CITIES``), "Sorry, I could not add pear: quantity must be at least 1." Several
weather results are joined with spaces; several added items become one "Added …" sentence.
Agent model calls per turn = tool calls + 1.

A city is a known city name (see ``KNOWN_CITIES``) or, failing that, the capitalised
word(s) after "in"/"for". Items are "<count> <noun>" pairs after "add", the count a digit
or a number word ("a", "an", "one" … "ten"); nouns are singularised by dropping a final
"s" and pluralised by adding one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = [
    "KNOWN_CITIES",
    "UNKNOWN_ANSWER",
    "PlannedCall",
    "answer_from_tool_results",
    "format_items",
    "plan_turn",
    "pluralize",
]

# Deterministic weather table shared by the get_weather tool and the docs above.
KNOWN_CITIES: dict[str, tuple[str, int]] = {
    "paris": ("sunny", 21),
    "london": ("rainy", 14),
    "tokyo": ("cloudy", 18),
    "berlin": ("windy", 12),
    "rome": ("sunny", 26),
}

UNKNOWN_ANSWER = "Sorry, I can only help with weather and shopping."
GREETING_ANSWER = "Hello! I can check the weather and manage your shopping cart."
THANKS_ANSWER = "You're welcome!"
ASK_CITY_ANSWER = "Which city would you like the weather for?"
ASK_ITEM_ANSWER = "What would you like to add to your cart?"

_NUMBER_WORDS = {
    "a": 1,
    "an": 1,
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
}
_COUNT = r"\d+|" + "|".join(_NUMBER_WORDS)
_ITEM_RE = re.compile(rf"\b({_COUNT})\s+([a-z]+)\b")
# Capitalised words after "in"/"for": the fallback for cities the table does not know,
# so the tool (not the model) is what reports "no data" for them.
_CITY_AFTER_RE = re.compile(r"\b(?:in|for)\s+([A-Z][a-zA-Z]+(?:\s+[A-Z][a-zA-Z]+)*)")


@dataclass(frozen=True)
class PlannedCall:
    """One tool call the scripted model will emit, in plan order."""

    name: str
    args: dict[str, Any]


def pluralize(item: str, quantity: int) -> str:
    """'2 apples' / '1 apple': the one English rule the demo's item names need."""
    return item if quantity == 1 else f"{item}s"


def format_items(items: list[dict[str, Any]]) -> str:
    """'2 apples, 1 pear and 3 lemons' from cart-shaped dicts."""
    parts = [f"{it['quantity']} {pluralize(str(it['item']), int(it['quantity']))}" for it in items]
    if len(parts) <= 1:
        return "".join(parts)
    return ", ".join(parts[:-1]) + " and " + parts[-1]


def _singular(noun: str) -> str:
    return noun[:-1] if noun.endswith("s") and not noun.endswith("ss") else noun


def _cities(text: str) -> list[str]:
    lowered = text.lower()
    found = [
        (m.start(), name.title())
        for name in KNOWN_CITIES
        for m in re.finditer(rf"\b{name}\b", lowered)
    ]
    if found:
        return [name for _, name in sorted(found)]
    return [m.group(1) for m in _CITY_AFTER_RE.finditer(text)]


def _items(text: str) -> list[tuple[str, int]]:
    lowered = text.lower()
    after_add = lowered[lowered.index("add") + 3 :] if "add" in lowered else lowered
    items = []
    for count, noun in _ITEM_RE.findall(after_add):
        if noun in ("my", "the", "your", "to", "cart"):
            continue
        quantity = int(count) if count.isdigit() else _NUMBER_WORDS[count]
        items.append((_singular(noun), quantity))
    return items


def plan_turn(user_text: str) -> list[PlannedCall] | str:
    """Tool calls for this user text, or the direct answer when no tool is needed.

    ``FAIL_MODEL`` is handled by the model class (it must raise, not answer).
    """
    lowered = user_text.lower()
    if "weather" in lowered:
        cities = _cities(user_text)
        if not cities:
            return ASK_CITY_ANSWER
        return [PlannedCall("get_weather", {"city": city}) for city in cities]
    if re.search(r"\badd\b", lowered):
        items = _items(user_text)
        if not items:
            return ASK_ITEM_ANSWER
        return [
            PlannedCall("add_to_cart", {"item": item, "quantity": quantity})
            for item, quantity in items
        ]
    if "cart" in lowered:
        return [PlannedCall("get_cart", {})]
    if re.match(r"\s*(hi|hello|hey)\b", lowered):
        return GREETING_ANSWER
    if "thank" in lowered:
        return THANKS_ANSWER
    return UNKNOWN_ANSWER


def _weather_sentence(result: dict[str, Any]) -> str:
    if result.get("status") != "ok":
        return f"Sorry, I have no weather data for {result.get('city', 'that city')}."
    return f"It is {result['condition']} and {result['temperature_c']}°C in {result['city']}."


def answer_from_tool_results(results: list[tuple[str, dict[str, Any]]]) -> str:
    """The final answer once every planned call of the turn has a (name, response)."""
    sentences: list[str] = []
    added: list[dict[str, Any]] = []
    for name, result in results:
        if name == "get_weather":
            sentences.append(_weather_sentence(result))
        elif name == "add_to_cart":
            if result.get("status") == "added":
                added.append(result)
            else:
                sentences.append(
                    f"Sorry, I could not add {result.get('item', 'that item')}:"
                    f" {result.get('error_message', 'unknown error')}"
                )
        elif name == "get_cart":
            items = list(result.get("items") or [])
            sentences.append(
                f"Your cart has {format_items(items)}." if items else "Your cart is empty."
            )
        else:  # A tool the script does not know: say so rather than guess.
            sentences.append(f"I received an unexpected result from {name}.")
    if added:
        sentences.insert(0, f"Added {format_items(added)} to your cart.")
    return " ".join(sentences) if sentences else UNKNOWN_ANSWER
