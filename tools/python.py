"""A Python interpreter tool: the model's code runs in the trajectory's sandbox slot.

The code never runs in the trainer's process: it goes to a fresh interpreter inside
the slot (its own workspace, no network, limits on time, memory, processes, files and
output), and whatever it prints comes back as the observation.
"""

from __future__ import annotations

from typing import ClassVar

from agentic_grpo import ToolEnvironment, ToolResult
from agentic_grpo.sandbox.slot_python import DEFAULT_PACKAGES


class PythonInterpreter(ToolEnvironment):
    """Runs Python code in an isolated sandbox slot; the workspace persists across calls of one trajectory.

    The code imports the standard library and `sandbox_packages` only, never the trainer's environment
    (which holds the task generators). A subclass widens or narrows the list, e.g.
    `sandbox_packages = (*DEFAULT_PACKAGES, "scipy")`; dependencies must be listed too.
    """

    needs_sandbox = True
    sandbox_packages: ClassVar[tuple[str, ...]] = DEFAULT_PACKAGES

    def python(self, code: str) -> ToolResult:
        """Run Python code and return what it prints.

        Args:
            code: A complete Python program; use print() to show results.
        """
        # The slot's deadline: the recipe's `tool_timeout`.
        result = self.sandbox.run_python(code, packages=self.sandbox_packages)
        output = result.stdout
        if result.stderr:
            output += ("\n" if output else "") + result.stderr
        error = None
        if result.timed_out:  # what it printed before the deadline, then why it stopped
            output += f"\n[timed out after {result.seconds:.3g} s]"
            error = "timeout"
        elif result.exit_code not in (0, None):
            error = f"exit code {result.exit_code}"
        return ToolResult(
            output=output.strip() or "(no output)",
            error=error,
            timed_out=result.timed_out,
            truncated=result.truncated,
            seconds=result.seconds,
            exit_code=result.exit_code,
        )
