"""PNG training curves from a run's `metrics.jsonl`: reward, accuracy, KL, tool use, trainable ratio.

Written at the end of every run to `output_dir/plots/`, and on demand with
`agentic-grpo plot OUTPUT_DIR` (also while a run is still going). Matplotlib's Agg
backend: no display needed. A chart whose metrics the run never logged is skipped,
so the accuracy chart only appears when a correctness reward or an evaluation exists.
"""

from __future__ import annotations

import json
from pathlib import Path

# chart file name -> (title, y label, metric names drawn on it, or a prefix ending in "*")
CHARTS: dict[str, tuple[str, str, list[str]]] = {
    "reward": ("Reward", "mean reward", ["reward", "rewards/*"]),
    "accuracy": ("Accuracy", "fraction correct", ["rewards/correctness/mean", "eval_rewards/correctness/mean"]),
    "kl": ("KL to the reference", "KL per token; kl_coef (beta)", ["kl", "kl_coef"]),
    "tool_call_rate": ("Tool use", "rate", ["tools/call_rate", "tools/error_rate", "trajectories/answered_rate"]),
    "trainable_ratio": ("Trainable tokens", "model tokens / completion tokens", ["tokens/trainable_ratio"]),
}


def read_metrics(path: Path) -> list[dict]:
    """The rows of a metrics.jsonl (a half-written last line, from a run still going, is skipped)."""
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def series(rows: list[dict], pattern: str) -> dict[str, tuple[list[int], list[float]]]:
    """Metric name -> (steps, values) for a name or a `prefix*` pattern; steps logged twice keep the last value."""
    found: dict[str, dict[int, float]] = {}
    for row in rows:
        for key, value in row.items():
            match = key.startswith(pattern[:-1]) if pattern.endswith("*") else key == pattern
            if match and isinstance(value, (int, float)) and not isinstance(value, bool) and "step" in row:
                if key.endswith(("_std", "/std")) or key.startswith("eval/runtime") or "per_second" in key:
                    continue
                found.setdefault(key, {})[int(row["step"])] = float(value)
    return {k: (sorted(v), [v[s] for s in sorted(v)]) for k, v in sorted(found.items())}


def held_out_points(output_dir: Path, rows: list[dict]) -> dict[str, tuple[list[int], list[float]]]:
    """Held-out accuracy before (step 0) and after (last step) training, from `held_out.json` when present."""
    path = output_dir / "held_out.json"
    if not path.is_file():
        return {}
    held_out = json.loads(path.read_text())
    last = max((int(r["step"]) for r in rows if "step" in r), default=0)
    return {
        "held-out accuracy, before and after (test split)": (
            [0, last],
            [held_out["before"]["accuracy"], held_out["after"]["accuracy"]],
        )
    }


def plot_run(output_dir: str | Path) -> list[Path]:
    """Write one PNG per chart with data to `output_dir/plots/`; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    output_dir = Path(output_dir)
    metrics = output_dir / "metrics.jsonl"
    if not metrics.is_file():
        raise FileNotFoundError(f"{metrics} does not exist: is `{output_dir}` a run's output directory?")
    rows = read_metrics(metrics)
    written = []
    for name, (title, ylabel, patterns) in CHARTS.items():
        lines: dict[str, tuple[list[int], list[float]]] = {}
        for pattern in patterns:
            lines.update(series(rows, pattern))
        if name == "accuracy":
            lines.update(held_out_points(output_dir, rows))
        if name == "reward":  # per-reward means only; `reward` itself is the weighted sum
            lines = {k: v for k, v in lines.items() if k == "reward" or k.endswith("/mean")}
        if not lines:
            continue
        figure, axes = plt.subplots(figsize=(7, 4), dpi=100)
        for label, (steps, values) in lines.items():
            if label.startswith("held-out"):  # two measurements, not a curve: dashed, big markers
                axes.plot(steps, values, linestyle="--", marker="D", markersize=7, label=label)
                continue
            axes.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3, label=label)
        axes.set(title=f"{title} ({output_dir.name})", xlabel="step", ylabel=ylabel)
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8)
        figure.tight_layout()
        path = output_dir / "plots" / f"{name}.png"
        path.parent.mkdir(exist_ok=True)
        figure.savefig(path)
        plt.close(figure)
        written.append(path)
    return written
