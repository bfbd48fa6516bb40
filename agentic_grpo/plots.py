"""PNG training curves from a run's `metrics.jsonl`: reward, accuracy, KL, tool use, trainable ratio, tool
selection and routing, calls per tool.

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
    "tool_selection": (
        "Tool selection and routing",
        "fraction of trajectories",
        [
            "tools/selection_accuracy",
            "tools/wrong_tool_rate",
            "tools/no_tool_rate",
            "routing/accuracy",
            "eval_tools/selection_accuracy",
            "eval_routing/accuracy",
        ],
    ),
    "tool_calls": ("Calls per tool", "calls per trajectory", ["tools/calls/*"]),
}
# chart -> (held_out.json metric, label) drawn as before/after points on it
HELD_OUT = {
    "accuracy": [("accuracy", "held-out accuracy, before and after (test split)")],
    "tool_selection": [
        ("tools/selection_accuracy", "held-out selection accuracy, before and after"),
        ("routing/accuracy", "held-out routing accuracy, before and after"),
    ],
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


def held_out_points(output_dir: Path, rows: list[dict], chart: str = "accuracy") -> dict[str, tuple[list, list]]:
    """The chart's held-out metrics before (step 0) and after (last step) training, from `held_out.json`."""
    path = output_dir / "held_out.json"
    if not path.is_file() or chart not in HELD_OUT:
        return {}
    held_out = json.loads(path.read_text())
    last = max((int(r["step"]) for r in rows if "step" in r), default=0)
    return {
        label: ([0, last], [held_out["before"][key], held_out["after"][key]])
        for key, label in HELD_OUT[chart]
        if key in held_out.get("before", {}) and key in held_out.get("after", {})
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
        lines.update(held_out_points(output_dir, rows, name))
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
