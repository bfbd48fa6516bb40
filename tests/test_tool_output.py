"""A pure tool's own printing stays off the trainer's console: captured per call (stdout and stderr), bounded, kept
with its result; what other threads print meanwhile still reaches the console."""

from __future__ import annotations

import sys
import threading

from agentic_grpo.environment import PRINTED_LIMIT, ToolEnvironment
from agentic_grpo.trajectory import ToolCall


class Chatty(ToolEnvironment):
    """Prints a lot while it works."""

    def shout(self, times: int) -> str:
        """Print, then answer.

        Args:
            times: How many 1 KB lines to print.
        """
        for _ in range(times):
            print("x" * 1023)
        print("to stderr", file=sys.stderr)
        return "done"

    def fail(self, times: int) -> str:
        """Print, then raise.

        Args:
            times: How many lines to print.
        """
        for _ in range(times):
            print("about to fail")
        raise RuntimeError("broken")


def test_ten_megabytes_printed_by_a_tool_stay_off_the_console_and_are_kept_bounded(capfd):
    result = Chatty().execute(ToolCall("shout", {"times": 10_000}), 30)
    assert result.output == "done"
    console = capfd.readouterr()
    assert "x" * 100 not in console.out and "to stderr" not in console.err
    assert result.printed.startswith("x" * 1023 + "\n")
    assert len(result.printed) < PRINTED_LIMIT + 100
    assert result.printed.endswith(f"[... {10_000 * 1024 + len('to stderr') + 1 - PRINTED_LIMIT} more characters]")


def test_a_failing_tool_keeps_what_it_printed_and_other_threads_still_print(capfd):
    printing = threading.Event()

    def trainer_thread():
        printing.wait(5)
        print("the trainer's own line")

    other = threading.Thread(target=trainer_thread)
    other.start()
    printing.set()
    result = Chatty().execute(ToolCall("fail", {"times": 2}), 30)
    other.join()
    assert result.error and "RuntimeError: broken" in result.output
    assert result.printed == "about to fail\n" * 2
    console = capfd.readouterr().out
    assert "the trainer's own line" in console and "about to fail" not in console
