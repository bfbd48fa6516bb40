"""The `agentic-grpo` command: train, eval, audit-rewards, show, plot, bench, sandbox."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["train"]:  # every recipe field is a flag of its own: hand them all to the recipe parser
        from agentic_grpo.train import main as train_main

        return train_main(argv[1:], prog="agentic-grpo train")
    if argv[:1] == ["bench"] and len(argv) > 1 and not argv[1].startswith("-"):
        # Verbatim: argparse would drop a `--` right after the name (`bench trace -- --seed 1`).
        return _bench(argparse.Namespace(name=argv[1], args=argv[2:]))
    parser = argparse.ArgumentParser(
        prog="agentic-grpo",
        description="Train LLM agents with GRPO on multi-turn tool-use trajectories.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    train = commands.add_parser(
        "train",
        help="train with a recipe (the CPU demo without arguments)",
        description="Train with a recipe: agentic-grpo train --config recipes/X.yaml [--field value ...]. "
        "Every recipe field can be overridden on the command line; `agentic-grpo train --help` lists them.",
        add_help=False,
    )
    train.add_argument("args", nargs=argparse.REMAINDER, help="recipe arguments")
    train.set_defaults(func=_train)

    evaluate = commands.add_parser(
        "eval",
        help="held-out accuracy of a model or checkpoint with a recipe's tools and rewards",
        description="Evaluate a model (directory, checkpoint, LoRA adapter, alias or hub id) on the recipe's test "
        "split, or on --data FILE.jsonl with `question` and `answer` per line. Prints and writes JSON.",
    )
    evaluate.add_argument("--model", required=True, help="model directory, checkpoint, LoRA adapter or alias")
    evaluate.add_argument("--recipe", required=True, help="recipe YAML: tools, format, rewards and data")
    evaluate.add_argument("--split", default="test", choices=["test", "train"], help="recipe split to use")
    evaluate.add_argument(
        "--data",
        help="instead of the recipe's data: a JSONL file with `question` and `answer` per line, or a reasoning-gym "
        "task's test split, `reasoning_gym:NAME` (config as a query: `reasoning_gym:products?min_digits=3&max_digits=3"
        "&seed=0`; --limit questions, default 100)",
    )
    evaluate.add_argument("-k", type=int, default=1, help="samples per question: 1 = greedy pass@1, k>1 = pass@k")
    evaluate.add_argument("--temperature", type=float, default=0.7, help="sampling temperature for k > 1")
    evaluate.add_argument("--limit", type=int, help="evaluate only the first N questions")
    evaluate.add_argument("--batch-size", type=int, default=16, help="trajectories generated at once")
    evaluate.add_argument("--output", help="where to write the JSON report (default: next to the model)")
    evaluate.set_defaults(func=_eval)

    audit = commands.add_parser(
        "audit-rewards",
        help="try to game a recipe's rewards with adversarial trajectories (run it before spending GPU hours)",
        description="Write adversarial trajectories for real rows of the recipe's data (the question's expression "
        "echoed as the answer, the right number only in a thought, an empty answer, several answers, a forged tool "
        "output, the answer buried in long or repeated text, format without content, and text that tries to steer "
        "an LLM judge), play them through the recipe's real format and tools next to an honest trajectory, score "
        "them with every reward of the recipe, print a table and write JSON. Exits 1 when a probe earns as much "
        "as the honest trajectory (or a judge reads a score out of a mangled reply), 2 on bad input. Needs the "
        "model's tokenizer only (a stand-in when it is not on this machine), never its weights.",
    )
    audit.add_argument("--recipe", required=True, help="recipe YAML or shipped recipe name")
    audit.add_argument("--data", help="rows to audit on: JSONL with `question` and `answer`, or reasoning_gym:NAME "
                       "(default: the recipe's training data)")  # fmt: skip
    audit.add_argument("--limit", type=int, default=3, help="rows to audit (default 3)")
    audit.add_argument("--judge-endpoint", help="audit LLM judges against this OpenAI-compatible URL instead of "
                       "the recipe's (a judge whose endpoint does not answer is reported as skipped)")  # fmt: skip
    audit.add_argument("--judge-model", help="the model name to ask at --judge-endpoint")
    audit.add_argument("--tokenizer", help="tokenizer to use instead of the recipe model's")
    audit.add_argument("--strict", action="store_true", help="also fail when any one reward pays a gaming probe "
                       "more than the honest trajectory, even if the weighted total does not")  # fmt: skip
    audit.add_argument("--output", help="JSON report path (default: outputs/audit/RECIPE.json)")
    audit.set_defaults(func=_audit)

    show = commands.add_parser(
        "show",
        help="print trajectories of a run or an evaluation",
        description="Print trajectories from a run's output directory, a trajectories/step_N.jsonl file, or an "
        "evaluation's *.trajectories.jsonl (or the directory `agentic-grpo eval` wrote it to).",
    )
    show.add_argument("path", help="output directory, model directory with an eval report, or trajectory file")
    show.add_argument("--step", type=int, help="step to show (default: the last saved)")
    show.add_argument("--rank", type=int, help="a multi-process run: show only this process's trajectories "
                      "(default: every process's file of the step, in process order)")  # fmt: skip
    show.add_argument("--index", type=int, help="show only this trajectory of the step")
    show.add_argument("--limit", type=int, default=4, help="trajectories to show (default 4)")
    show.set_defaults(func=_show)

    plot = commands.add_parser(
        "plot",
        help="PNG curves (reward, accuracy, KL, tool use, trainable ratio) of a run",
        description="Draw a run's metrics.jsonl as PNG curves in OUTPUT_DIR/plots/ (runs do it when they finish; "
        "this works on a run still going, too).",
    )
    plot.add_argument("output_dir", help="the run's output directory (holds metrics.jsonl)")
    plot.set_defaults(func=_plot)

    bench = commands.add_parser(
        "bench",
        help="run a shipped benchmark (prints JSON)",
        description="Run the benchmark NAME (agentic_grpo.benchmarks.NAME, the checkout's benchmarks/NAME.py); any "
        "further arguments go to it (e.g. `bench learning --seed 1`, `bench sandbox --help`).",
    )
    bench.add_argument("name", help="benchmark name: " + ", ".join(benchmark_names()))
    bench.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the benchmark")
    bench.set_defaults(func=_bench)

    try:
        from agentic_grpo.sandbox.cli import add_sandbox_parser
    except ImportError:  # the sandbox package is optional only while it is being installed
        pass
    else:
        add_sandbox_parser(commands)

    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return args.func(args)


def benchmark_names() -> list[str]:
    from agentic_grpo.resources import shipped_names

    return shipped_names("benchmarks", ".py")


def _bench(args: argparse.Namespace) -> int:
    import subprocess

    if args.name not in benchmark_names():
        print(f"error: no benchmark `{args.name}` (known: {', '.join(benchmark_names())})", file=sys.stderr)
        return 2
    return subprocess.call([sys.executable, "-m", f"agentic_grpo.benchmarks.{args.name}", *args.args])


def _train(args: argparse.Namespace) -> int:
    from agentic_grpo.train import main as train_main

    return train_main(args.args, prog="agentic-grpo train")


def _eval(args: argparse.Namespace) -> int:
    from datasets import load_dataset

    from agentic_grpo.data import check_columns, check_json_files, load_task_data, reasons
    from agentic_grpo.evaluate import EvaluationError, correctness_reward_name, evaluate, load_policy_for, write_report
    from agentic_grpo.reward_setup import check_reward_columns
    from agentic_grpo.run_parts import build_recipe

    try:
        argv = ["--config", args.recipe, "--output_dir", "/tmp/agentic-grpo-eval"]
        built = build_recipe(argv, load_data=False)
        trained_on = with_recorded_seed(built.recipe.dataset, args.model)
        if not args.data:
            built.train, built.test = load_task_data(trained_on)
        if args.data and args.data.startswith("reasoning_gym:"):
            from datasets import Dataset

            from agentic_grpo.reasoning_gym_tasks import held_out_rows

            rows = Dataset.from_list(held_out_rows(args.data, args.limit or 100))
        elif args.data:
            if not Path(args.data).is_file():
                raise ValueError(f"--data file `{args.data}` does not exist")
            check_json_files(args.data, "--data")
            try:
                rows = load_dataset("json", data_files=args.data, split="train")
            except Exception as exc:  # noqa: BLE001 - one line naming the file beats a datasets traceback
                raise ValueError(f"--data file `{args.data}` cannot be loaded: {reasons(exc)}") from exc
        else:
            rows = built.train if args.split == "train" else built.test
            if rows is None:
                raise ValueError(f"recipe `{args.recipe}` has no test split: pass --data or --split train")
        check_columns(rows, ["question"], "evaluation data")
        check_reward_columns(built.rewards, rows.column_names, "evaluation data")
        rows = list(rows)[: args.limit] if args.limit else list(rows)
        if args.data:
            rows = without_training_questions(rows, trained_on)
        if args.k < 1:
            raise ValueError("-k must be at least 1")
        correctness_reward_name(built.rewards, built.config.correctness_reward)  # before a model loads
        model, tokenizer = load_policy_for(args.model, built.rollout_parts)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    output = args.output or (
        str(Path(args.model) / "eval.json") if Path(args.model).is_dir() else "outputs/eval/eval.json"
    )
    try:
        metrics, records = evaluate(model, tokenizer, built.rollout_parts, built.rewards, rows, k=args.k,
                                    temperature=args.temperature, top_p=built.config.top_p,
                                    batch_size=args.batch_size, correctness=built.config.correctness_reward)  # fmt: skip
    except EvaluationError as exc:  # a reward raised: the trajectories are what its author needs to debug it
        write_report(output, {"model": args.model, "error": str(exc)}, exc.records)
        print(f"error: {exc}\nThe trajectories are in {Path(output).with_suffix('.trajectories.jsonl')}; "
              "`on_reward_error: none` in the recipe gives None for a raising reward instead", file=sys.stderr)  # fmt: skip
        return 1
    metrics["model"] = args.model
    write_report(output, metrics, records)
    print(json.dumps(metrics, indent=2))
    print(f"report: {output} (trajectories beside it)")
    return 0


def with_recorded_seed(dataset: object, model: str) -> object:
    """The recipe's `dataset` with the training seed the evaluated run drew (its `run.json`), so that `--split train`
    and the check of `--data` rows see the rows it trained on; as given when the model is no such run."""
    from agentic_grpo.data import recorded_training_seed

    seed = recorded_training_seed(model)
    if seed is None or not isinstance(dataset, dict) or dataset.get("train_seed") is not None:
        return dataset
    return {**dataset, "train_seed": seed}


def without_training_questions(rows: list[dict], dataset: object) -> list[dict]:
    """`rows` less any question the recipe trains on (held-out figures must be held out), saying how many went."""
    from agentic_grpo.data import load_task_data

    try:
        train, _ = load_task_data(dataset)
    except (ValueError, OSError) as exc:
        print(f"note: the recipe's training data cannot be loaded ({exc}); --data rows are not checked against it")
        return rows
    trained = set(train["question"])
    kept = [row for row in rows if row["question"] not in trained]
    if len(kept) < len(rows):
        print(f"note: {len(rows) - len(kept)} of {len(rows)} --data rows are training questions of the recipe; "
              f"evaluating on the other {len(kept)}")  # fmt: skip
    if not kept:
        raise ValueError("every --data row is a training question of the recipe, and held-out figures must be "
                         "held out: to measure on the training data, drop --data and pass --split train")  # fmt: skip
    return kept


def _audit(args: argparse.Namespace) -> int:
    from agentic_grpo.audit.report import print_report, write_report
    from agentic_grpo.audit.run import audit_recipe
    from agentic_grpo.train import quiet_known_warnings

    quiet_known_warnings()

    try:
        report = audit_recipe(
            args.recipe, data=args.data, limit=args.limit, judge_endpoint=args.judge_endpoint,
            judge_model=args.judge_model, tokenizer_path=args.tokenizer, strict=args.strict,
        )  # fmt: skip
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print_report(report)
    output = args.output or str(Path("outputs") / "audit" / f"{Path(args.recipe).stem}.json")
    print(f"report: {write_report(report, output)}")
    return 0 if report.passed else 1


def _plot(args: argparse.Namespace) -> int:
    from agentic_grpo.plots import plot_run

    try:
        paths = plot_run(args.output_dir)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not paths:
        print(f"error: {args.output_dir}/metrics.jsonl has no metric to plot yet", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0


def _show(args: argparse.Namespace) -> int:
    from rich.console import Console

    from agentic_grpo.trajectory_view import trajectory_view

    path = Path(args.path)
    if path.is_dir():
        files = _step_files(path, args.step, args.rank)
        if isinstance(files, str):
            print(f"error: {files}", file=sys.stderr)
            return 2
    elif path.is_file():
        files = [path]
    else:
        print(f"error: {path} does not exist", file=sys.stderr)
        return 2
    records, sources = [], []
    for file in files:
        try:
            read = [json.loads(line) for line in file.read_text().splitlines() if line.strip()]
        except ValueError:
            read = []
        if not read or not all(isinstance(r, dict) and "segments" in r for r in read):
            print(f"error: {file} is not a trajectory file (JSON lines with `segments`: a run's trajectories/"
                  "step_N.jsonl or eval's *.trajectories.jsonl)", file=sys.stderr)  # fmt: skip
            return 2
        records += read
        sources += [_rank_of(file)] * len(read)
    if args.index is not None and not -len(records) <= args.index < len(records):
        print(f"error: --index {args.index}: the step holds {len(records)} trajectories", file=sys.stderr)
        return 2
    numbers = [args.index % len(records)] if args.index is not None else list(range(min(args.limit, len(records))))
    console = Console()
    processes = f" from {len(files)} processes ({', '.join(f.name for f in files)})" if len(files) > 1 else ""
    console.print(f"[bold]{files[0] if len(files) == 1 else files[0].parent}[/bold]: {len(records)} trajectories"
                  f"{processes}")  # fmt: skip
    for number in numbers:
        record = records[number]
        rank = f"  rank={sources[number]}" if sources[number] is not None else ""
        console.print(trajectory_view(record, f"#{number}{rank}  finish={record['finish_reason']}"))
    legend = "[green]model tokens (trained)[/green]  [yellow]tool output (not trained)[/yellow]"
    if any(records[number].get("children") for number in numbers):
        legend += "  [magenta]sub-agent trajectories (under the call; never in the caller's loss)[/magenta]"
    console.print(legend)
    return 0


_STEP_FILE = re.compile(r"step_(\d+)(?:\.rank(\d+))?\.jsonl")


def _rank_of(file: Path) -> int | None:
    found = _STEP_FILE.fullmatch(file.name)
    return int(found.group(2)) if found and found.group(2) is not None else None


def _step_files(directory: Path, step: int | None, rank: int | None) -> list[Path] | str:
    """The trajectory files of one step of a run in `directory` (every process's, in process order, or `rank`'s),
    or an eval report's newest *.trajectories.jsonl; a message when there is none."""
    by_step: dict[int, list[Path]] = {}
    for file in (directory / "trajectories").glob("step_*.jsonl"):
        if found := _STEP_FILE.fullmatch(file.name):
            by_step.setdefault(int(found.group(1)), []).append(file)
    if not by_step:
        if step is None and rank is None:  # a model directory that `agentic-grpo eval` wrote its report into
            reports = sorted(directory.glob("*.trajectories.jsonl"), key=lambda f: f.stat().st_mtime)
            if reports:
                return reports[-1:]
        return (f"no trajectory files under {directory / 'trajectories'} (nor an eval report's "
                f"*.trajectories.jsonl in {directory})")  # fmt: skip
    if step is None:
        step = max(by_step)
    elif step not in by_step:
        return f"--step {step}: no trajectories saved for it (saved steps: {', '.join(map(str, sorted(by_step)))})"
    files = sorted(by_step[step], key=lambda f: _rank_of(f) or 0)
    if rank is not None:
        ranks = [_rank_of(f) for f in files]
        if rank not in ranks and not (rank == 0 and ranks == [None]):
            shown = ", ".join(str(r) for r in ranks if r is not None) or "0 (a one-process run)"
            return f"--rank {rank}: step {step} has trajectory files of processes {shown}"
        files = [f for f, r in zip(files, ranks, strict=True) if r == rank or r is None]
    return files


if __name__ == "__main__":
    raise SystemExit(main())
