"""Date arithmetic: days between two dates, and the weekday of a date, from one query in words.

Dates are ISO (`2024-03-10`): the one spelling a model copies from a question without ambiguity.
"""

from __future__ import annotations

import datetime as dt
import re

from agentic_grpo import ToolEnvironment

_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def parse_date(text: str) -> dt.date:
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        raise ValueError(f"`{text}` is not a date: write dates as YYYY-MM-DD") from None


def days_between(start: str, end: str) -> int:
    """Days from `start` to `end` (negative when `end` comes first)."""
    return (parse_date(end) - parse_date(start)).days


def weekday(date: str) -> str:
    return parse_date(date).strftime("%A")


class DateCalculator(ToolEnvironment):
    """Date arithmetic."""

    def date_calculator(self, query: str) -> str:
        """Calendar arithmetic: the number of days between two dates, or the day of the week of a date.

        Args:
            query: e.g. "days from 2024-03-10 to 2024-07-02" or "weekday of 2021-06-15" (dates as YYYY-MM-DD).
        """
        dates = _DATE.findall(query)
        if len(dates) == 2:
            return str(days_between(*dates))
        if len(dates) == 1 and re.search(r"week ?day|day of the week", query, re.IGNORECASE):
            return weekday(dates[0])
        raise ValueError(
            'ask "days from YYYY-MM-DD to YYYY-MM-DD" or "weekday of YYYY-MM-DD"; '
            f"found {len(dates)} date(s) in {query!r}"
        )
