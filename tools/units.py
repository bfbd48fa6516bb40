"""Unit conversion: a tool that turns "37 miles to km" into a number, for lengths, masses, volumes, times and
temperatures.

One argument in plain words, because a small model writes one string more reliably than three typed fields;
the answer is rounded to two decimals, the same rounding the toolbox tasks' references use (`convert`).
"""

from __future__ import annotations

import re

from agentic_grpo import ToolEnvironment

# unit -> (quantity, factor to the quantity's base unit); temperatures are converted apart (an offset too).
UNITS: dict[str, tuple[str, float]] = {
    "m": ("length", 1.0), "km": ("length", 1000.0), "cm": ("length", 0.01), "mm": ("length", 0.001),
    "mile": ("length", 1609.344), "yard": ("length", 0.9144), "foot": ("length", 0.3048), "inch": ("length", 0.0254),
    "kg": ("mass", 1.0), "g": ("mass", 0.001), "lb": ("mass", 0.45359237), "oz": ("mass", 0.028349523125),
    "l": ("volume", 1.0), "ml": ("volume", 0.001), "gallon": ("volume", 3.785411784), "cup": ("volume", 0.2365882365),
    "s": ("time", 1.0), "min": ("time", 60.0), "h": ("time", 3600.0), "day": ("time", 86400.0),
    "week": ("time", 604800.0),
    "celsius": ("temperature", 1.0), "fahrenheit": ("temperature", 1.0), "kelvin": ("temperature", 1.0),
}  # fmt: skip
ALIASES = {
    "meter": "m", "metre": "m", "kilometer": "km", "kilometre": "km", "centimeter": "cm", "centimetre": "cm",
    "millimeter": "mm", "millimetre": "mm", "mi": "mile", "yd": "yard", "feet": "foot", "ft": "foot",
    "inches": "inch", "in": "inch", "kilogram": "kg", "kilo": "kg", "gram": "g", "pound": "lb", "lbs": "lb",
    "ounce": "oz", "liter": "l", "litre": "l", "milliliter": "ml", "millilitre": "ml", "second": "s", "sec": "s",
    "minute": "min", "hour": "h", "hr": "h", "days": "day", "c": "celsius", "°c": "celsius", "f": "fahrenheit",
    "°f": "fahrenheit", "k": "kelvin", "degrees celsius": "celsius", "degrees fahrenheit": "fahrenheit",
}  # fmt: skip
_QUERY = re.compile(r"^\s*(-?[\d,]*\.?\d+)\s*(.+?)\s+(?:to|in|into|as)\s+(.+?)\s*[?.]?\s*$", re.IGNORECASE)


def unit_of(word: str) -> str:
    """The unit a word names (`miles` -> `mile`); ValueError naming the known units otherwise."""
    word = word.strip().lower()
    for candidate in (word, word.removesuffix("s"), word.removesuffix("es")):
        if candidate in UNITS:
            return candidate
        if candidate in ALIASES:
            return ALIASES[candidate]
    raise ValueError(f"unknown unit `{word}`; known: {', '.join(UNITS)}")


def convert(value: float, source: str, target: str) -> float:
    """`value` in unit `source` expressed in unit `target`, rounded to two decimals."""
    source, target = unit_of(source), unit_of(target)
    if UNITS[source][0] != UNITS[target][0]:
        raise ValueError(f"cannot convert {UNITS[source][0]} ({source}) to {UNITS[target][0]} ({target})")
    if UNITS[source][0] == "temperature":
        kelvin = {"celsius": value + 273.15, "fahrenheit": (value - 32) * 5 / 9 + 273.15, "kelvin": value}[source]
        result = {"celsius": kelvin - 273.15, "fahrenheit": (kelvin - 273.15) * 9 / 5 + 32, "kelvin": kelvin}[target]
    else:
        result = value * UNITS[source][1] / UNITS[target][1]
    return round(result, 2)


def plain(value: float) -> str:
    """A number as a reference answer: `59.55`, `12` (never `12.0` or `1e+05`)."""
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return "0" if text == "-0" else text


class UnitConverter(ToolEnvironment):
    """Unit conversion."""

    def convert_units(self, query: str) -> str:
        """Convert a quantity from one unit to another (length, mass, volume, time, temperature).

        Args:
            query: The quantity and the target unit in words, e.g. "37 miles to km" or "100 fahrenheit to celsius".
        """
        found = _QUERY.match(query)
        if not found:
            raise ValueError(f'write the query as "<number> <unit> to <unit>", e.g. "37 miles to km"; got {query!r}')
        value = float(found.group(1).replace(",", ""))
        return f"{plain(convert(value, found.group(2), found.group(3)))} {unit_of(found.group(3))}"
