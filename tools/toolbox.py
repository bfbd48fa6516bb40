"""Environments of several tools.

- `MathToolbox`: exact arithmetic in-process and Python in the sandbox (the function-calling recipe).
- `TeamToolbox`: the team's three specialists' tools in one environment (the generalist of docs/team.md).
- `Toolbox`: eight tools with overlapping descriptions, two of them distractors, for learning to choose a tool
  (`agentic_grpo.tools.toolbox_tasks` makes tasks that name the tool each should use).
"""

from __future__ import annotations

from agentic_grpo.tools.calculator import Calculator
from agentic_grpo.tools.dates import DateCalculator
from agentic_grpo.tools.distractors import Distractors
from agentic_grpo.tools.facts import ElementTable
from agentic_grpo.tools.python import PythonInterpreter
from agentic_grpo.tools.strings import StringTools
from agentic_grpo.tools.units import UnitConverter


class MathToolbox(Calculator, PythonInterpreter):
    """`calculator` for arithmetic, `python` for anything longer; each trajectory gets its own sandbox slot."""


class TeamToolbox(DateCalculator, UnitConverter, Calculator):
    """calculator, convert_units and date_calculator: every tool of the team's specialists, for one agent."""


class Toolbox(Distractors, PythonInterpreter, StringTools, ElementTable, DateCalculator, UnitConverter, Calculator):
    """calculator, convert_units, date_calculator, lookup, string_tool, python (sandboxed), web_search and
    quick_estimate (distractors); each trajectory gets its own sandbox slot for `python`."""
