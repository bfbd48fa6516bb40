"""A Python interpreter tool: the model's code runs in the trajectory's sandbox slot.

The code never runs in the trainer's process: it goes to a fresh interpreter inside
the slot (its own workspace, no network, limits on time, memory, processes, files and
output), and whatever it prints comes back as the observation.
"""

from __future__ import annotations

from agentic_grpo import ToolEnvironment, ToolResult


class PythonInterpreter(ToolEnvironment):
    """Runs Python code in an isolated sandbox slot; the workspace persists across calls of one trajectory."""

    needs_sandbox = True

    def python(self, code: str) -> ToolResult:
        """Run Python code and return what it prints.

        Args:
            code: A complete Python program; use print() to show results.
        """
        result = self.sandbox.run_python(code)  # the slot's deadline: the recipe's `tool_timeout`
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
