"""Several tools in one environment: exact arithmetic in-process, and Python in the sandbox."""

from __future__ import annotations

from agentic_grpo.tools.calculator import Calculator
from agentic_grpo.tools.python import PythonInterpreter


class MathToolbox(Calculator, PythonInterpreter):
    """`calculator` for arithmetic, `python` for anything longer; each trajectory gets its own sandbox slot."""
