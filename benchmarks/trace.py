"""Which project files does one training step run? A trace of a real step, for the README's drawing.

Runs a recipe through `train` (default: the demo, `cpu_demo`) for `--steps` steps and records, during the last
step only, every function called in a file of this project (the package, `tools/`, `rewards/`), in every thread.
Prints JSON: the count of files and each file with the functions it ran. Anything after `--` is passed to the recipe:

    agentic-grpo bench trace                                   # the demo's second step (SmolLM2; ~10 min traced)
    agentic-grpo bench trace -- --model_name_or_path tiny-random-llama   # faster; a random model calls no tool
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import threading
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agentic-grpo bench trace", description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", default="cpu_demo", help="recipe name or path (default: cpu_demo)")
    parser.add_argument("--steps", type=int, default=2, help="steps to run; the last one is traced (default: 2)")
    parser.add_argument("overrides", nargs="*", help="recipe fields after `--`, e.g. -- --seed 1")
    args = parser.parse_args(argv)

    from transformers import TrainerCallback

    import agentic_grpo
    import agentic_grpo.rewards
    import agentic_grpo.tools
    import agentic_grpo.trainer as trainer_module
    from agentic_grpo.train import main as train

    # The package's own files, then the plug-in folders (`tools/`, `rewards/` in a checkout, inside it installed).
    roots = {str(Path(module.__file__).parent) + "/": prefix
             for module, prefix in ((agentic_grpo.tools, "tools/"), (agentic_grpo.rewards, "rewards/"), (agentic_grpo, ""))}  # fmt: skip
    seen: dict[str, set[str]] = {}
    tracing = threading.Event()

    def record(frame, event, arg):  # noqa: ANN001 - the profiler's signature
        if event != "call" or not tracing.is_set():
            return
        name = frame.f_code.co_filename
        root = next((r for r in roots if name.startswith(r)), None)
        if root is not None and "/benchmarks/" not in name:
            seen.setdefault(roots[root] + name[len(root) :], set()).add(frame.f_code.co_name)

    class LastStep(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001
            if state.global_step == state.max_steps - 1:
                tracing.set()

        def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001
            tracing.clear()

    built = trainer_module.AgenticGRPOTrainer.__init__

    def with_tracer(self, *a, **k):  # noqa: ANN001, ANN002, ANN003
        built(self, *a, **k)
        self.add_callback(LastStep())

    trainer_module.AgenticGRPOTrainer.__init__ = with_tracer
    sys.setprofile(record)
    threading.setprofile(record)
    with tempfile.TemporaryDirectory() as out, contextlib.redirect_stdout(sys.stderr):  # stdout: the JSON alone
        status = train(["--config", args.recipe, "--max_steps", str(args.steps), "--eval_before_after", "false",
                        "--save_steps", str(args.steps + 1), "--output_dir", out, *args.overrides])  # fmt: skip
    sys.setprofile(None)
    threading.setprofile(None)
    files = {name: sorted(functions) for name, functions in sorted(seen.items())}
    print(
        json.dumps({"recipe": args.recipe, "traced_step": args.steps, "count": len(files), "files": files}, indent=1)
    )
    return status


if __name__ == "__main__":
    sys.exit(main())
