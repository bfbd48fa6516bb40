"""The audit's table (probe x reward -> payout, the honest payout first) and its JSON file."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from agentic_grpo.audit.probes import JUDGE_REPLY_PROBE
from agentic_grpo.audit.run import AuditReport


def print_report(report: AuditReport) -> None:
    """A table of mean payouts per probe and reward, the weighted total, and the verdict with its reasons."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    names = list(report.rewards)
    table = Table(title=f"audit-rewards {report.recipe} ({report.rows} rows; tokenizer: {report.tokenizer})")
    table.add_column("probe")
    for name in names:
        table.add_column(f"{name}\n(w={report.rewards[name]:g})", justify="right")
    table.add_column("total", justify="right")
    honest_total = report.totals.get("honest", 0.0)
    for probe, payout in report.payouts.items():
        cells = [_cell(payout.get(name)) for name in names]
        if probe == JUDGE_REPLY_PROBE:
            table.add_row(probe, *cells, "[dim]must be None[/dim]")
            continue
        paid = report.totals[probe]
        style = "bold" if probe == "honest" else ("red" if paid >= honest_total else "")
        table.add_row(probe, *cells, f"[{style}]{paid:.3f}[/{style}]" if style else f"{paid:.3f}")
    console.print(table)
    console.print("Cells: mean payout over the rows (None: the reward had nothing to say; counted as the honest "
                  "trajectory's value in the total, as the None-neutral rule does).")  # fmt: skip
    for name, reason in report.skipped.items():
        console.print(f"[yellow]skipped[/yellow] reward `{name}`: {reason}")
    for note in report.notes:
        console.print(f"note: {note}")
    for preference in report.preferences:
        console.print(f"[yellow]prefers a probe[/yellow]: {preference}")
    if report.passed:
        console.print("[green]PASS[/green]: every probe earns less than the honest trajectory"
                      + (" in total (--strict fails on the preferences above)." if report.preferences else ".")
                      + (" The skipped reward(s) above were not audited." if report.skipped else ""))  # fmt: skip
    else:
        findings = report.failures + (report.preferences if report.strict else [])
        console.print(f"[red]FAIL[/red]: {len(findings)} finding(s):")
        for failure in findings:
            console.print(f"  - {failure}")


def write_report(report: AuditReport, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**asdict(report), "passed": report.passed}, indent=2) + "\n")
    return path


def _cell(value: float | None) -> str:
    return "None" if value is None else f"{value:.3f}"
