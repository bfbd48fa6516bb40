"""`agentic-grpo sandbox check` and `agentic-grpo sandbox exec`: verify a host, run one command in a slot.

`check` is what a user runs on a new cluster before training: it prints the layer in use,
what each protection rests on, and runs the attack suite against the live configuration
(exit status 1 if any attack did harm, 2 if no layer works).
"""

from __future__ import annotations

import argparse
import json
import sys

if __name__ == "__main__" and not __package__:
    # Run as a file (the fast path for scripts): load this package without agentic_grpo/__init__.py,
    # which imports transformers (~0.7 s) for the tool contracts the sandbox never uses.
    import os
    import types

    _top = types.ModuleType("agentic_grpo")
    _top.__path__ = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
    sys.modules.setdefault("agentic_grpo", _top)
    sys.path.pop(0)  # this directory: its modules must load as agentic_grpo.sandbox.*, not top-level
    from agentic_grpo.sandbox.cli import main as _main

    raise SystemExit(_main())

from .config import MODES, SandboxConfig, SandboxUnavailable  # noqa: E402


def _config(args: argparse.Namespace) -> SandboxConfig:
    return SandboxConfig(mode=args.mode)


def check(args: argparse.Namespace) -> int:
    """Print the probe report and the attack suite's results; non-zero if any attack succeeded."""
    from .checks import run_all
    from .pool import SandboxPool
    from .probe import probe

    config = _config(args)
    report = probe(config, refresh=True)  # a check re-verifies the host: never a cached answer
    try:
        pool = SandboxPool(config)
    except SandboxUnavailable as exc:
        if args.json:
            print(json.dumps({"probe": report.to_dict(), "error": str(exc)}, indent=2))
        else:
            print(report.format())
            print(f"ERROR: {exc}")
        return 2
    try:
        results = run_all(pool)
    finally:
        pool.close()
    failed = [r for r in results if not r.blocked and not r.gap]
    gaps = [r for r in results if not r.blocked and r.gap]
    report = pool.report  # the probe's report plus the pool's cgroup and resource bounds
    if args.json:
        print(json.dumps({"probe": report.to_dict(), "attacks": [r.to_dict() for r in results]}, indent=2))
    else:
        print(report.format())
        print(f"attack suite ({len(results)} attacks against the live configuration):")
        for r in results:
            status = "skipped" if r.skipped else "blocked" if r.blocked else "GAP    " if r.gap else "HARMED "
            first = r.skipped or (r.detail.splitlines()[0][:100] if r.detail else "")
            print(f"  {status}  {r.name:<26} {(r.gap + ': ') if r.gap else ''}{first}")
        verdict = f"{len(failed)} attack(s) did harm" if failed else "every attack was blocked"
        if gaps:
            verdict += f"; {len(gaps)} did harm the report above lists as open (NOT bounded or NOT mediated)"
        skipped = [r for r in results if r.skipped]
        if skipped:
            verdict += f"; {len(skipped)} could not be tried here"
        print("RESULT: " + verdict)
    return 1 if failed else 0


def exec_command(args: argparse.Namespace) -> int:
    """Run one command in a fresh slot and print its ExecResult as JSON."""
    from .pool import SandboxPool

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("sandbox exec: give a command after --", file=sys.stderr)
        return 2
    try:
        pool = SandboxPool(_config(args))
    except SandboxUnavailable as exc:
        print(f"sandbox exec: {exc}", file=sys.stderr)
        return 2
    try:
        with pool.acquire() as slot:
            result = slot.run(
                command,
                stdin=sys.stdin.buffer.read() if args.stdin else None,
                timeout=args.timeout,
                memory_mb=args.memory,
                max_output_bytes=args.max_output,
            )
    finally:
        pool.close()
    print(json.dumps({"layer": pool.layer, "downgraded": pool.report.downgraded, **result.to_dict()}, indent=2))
    return 0


def add_sandbox_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `sandbox check` and `sandbox exec` on an argparse subparsers object."""
    parser = subparsers.add_parser("sandbox", help="Check the code sandbox on this host, or run a command in it.")
    commands = parser.add_subparsers(dest="sandbox_command", required=True)

    check_parser = commands.add_parser(
        "check", help="Show the sandbox layer and what each protection rests on, then run the attack suite."
    )
    check_parser.add_argument("--mode", choices=MODES, default="auto", help="Layer to check (default: auto).")
    check_parser.add_argument("--json", action="store_true", help="Print the report as JSON.")
    check_parser.set_defaults(func=check)

    exec_parser = commands.add_parser("exec", help="Run one command in a fresh sandbox slot; print JSON.")
    exec_parser.add_argument("--mode", choices=MODES, default="auto", help="Layer to use (default: auto).")
    exec_parser.add_argument("--timeout", type=float, default=None, metavar="S", help="Wall-clock seconds.")
    exec_parser.add_argument("--memory", type=int, default=None, metavar="MB", help="Address-space limit in MB.")
    exec_parser.add_argument(
        "--max-output", type=int, default=None, metavar="BYTES", help="Bytes kept of each of stdout and stderr."
    )
    exec_parser.add_argument("--stdin", action="store_true", help="Feed this process's stdin to the command.")
    exec_parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARG ...]")
    exec_parser.set_defaults(func=exec_command)


def main(argv: list[str] | None = None) -> int:
    """`python -m agentic_grpo.sandbox.cli sandbox check|exec ...`, or `python .../sandbox/cli.py sandbox exec ...`."""
    parser = argparse.ArgumentParser(prog="agentic-grpo")
    add_sandbox_parser(parser.add_subparsers())
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
