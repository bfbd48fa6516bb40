"""Where does a training step's memory go? Peak resident memory per phase of a few real steps. Prints JSON.

Builds the run from the recipe exactly as `train` does, wraps the trainer's phases (rollout, scoring,
loss forward, backward, optimizer step) and samples the process's resident set size every 50 ms,
keeping the peak seen inside each phase. Anything after `--` is passed to the recipe as overrides,
so two layouts can be compared on the same seed:

    agentic-grpo bench memory --steps 3
    agentic-grpo bench memory --steps 3 -- --per_device_train_batch_size 8 --gradient_accumulation_steps 1

`--prompt-tokens N` pads every prompt to about N tokens with worked examples in the system prompt (the recipe's
own example turns, written out and repeated, the last one cut to fit): how memory grows with the prompt.

Resident memory is what the machine must have; CPU tensors freed by PyTorch may stay with the
allocator, so a phase's peak can include what an earlier phase left behind.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil


class PhasePeaks:
    """The peak resident memory (MB) seen while each named phase ran, from a 50 ms sampler thread, and the
    seconds spent in each (a phase's own time: a phase called inside another is not counted twice)."""

    def __init__(self) -> None:
        self.process = psutil.Process()
        self.phase = "start-up"
        self.peaks: dict[str, float] = {}
        self.seconds: dict[str, float] = {}
        self._since = time.perf_counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            rss = self.process.memory_info().rss / 2**20
            self.peaks[self.phase] = max(self.peaks.get(self.phase, 0.0), rss)
            time.sleep(0.05)

    def enter(self, name: str) -> None:
        """Charge the time since the last switch to the current phase, then make `name` current."""
        now = time.perf_counter()
        self.seconds[self.phase] = self.seconds.get(self.phase, 0.0) + now - self._since
        self._since, self.phase = now, name

    def wrap(self, name: str, function: Callable) -> Callable:
        @functools.wraps(function)
        def in_phase(*args: Any, **kwargs: Any) -> Any:
            outer = self.phase
            self.enter(name)
            try:
                return function(*args, **kwargs)
            finally:
                self.enter(outer)

        return in_phase

    def stop(self) -> dict[str, int]:
        self.enter(self.phase)
        self._stop.set()
        self._thread.join()
        return {name: round(peak) for name, peak in self.peaks.items()}


def prompt_tokens(run: Any) -> int:
    """The tokens of the first training row's prompt, as the chat template renders it for generation."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(run.model_path)
    return len(tokenizer.apply_chat_template(run.train[0]["prompt"], add_generation_prompt=True, tokenize=True,
                                             return_dict=True)["input_ids"])  # fmt: skip


def padded_recipe(recipe: str, tokens: int, prepare_run: Callable[[str], Any], folder: str) -> tuple[str, int]:
    """A copy of `recipe` (written in `folder`) whose prompts hold about `tokens` tokens, padded with worked examples
    appended to the system prompt (`format_kwargs.examples`), and its first prompt's length. `prepare_run(path)`
    prepares a run of a recipe file. Raises ValueError when the recipe's own prompt is already longer."""
    import yaml
    from transformers import AutoTokenizer

    with open(recipe) as file:
        base = yaml.safe_load(file)
    first = prepare_run(recipe)
    length = prompt_tokens(first)
    if tokens < length:
        raise ValueError(f"the recipe's prompt already holds {length} tokens, more than --prompt-tokens {tokens}")
    turns = base.get("format_kwargs", {}).get("example_turns") or [{"question": "What is 214 * 37?",
                                                                     "response": "Final Answer: 7918"}]  # fmt: skip
    unit = "\n\n".join(f"Question: {turn['question']}\n{turn['response'].strip()}" for turn in turns)
    tokenizer = AutoTokenizer.from_pretrained(first.model_path)
    unit_ids = tokenizer(unit, add_special_tokens=False)["input_ids"]
    path, size = recipe, 0
    for _ in range(4):  # the example's heading and the tokens merged at the cut move the count a little: settle it
        if length == tokens:
            break
        size = max(1, size + tokens - length)
        path, padded = f"{folder}/padded-recipe.yaml", copy.deepcopy(base)
        filler = (unit_ids * (size // len(unit_ids) + 1))[:size]
        padded.setdefault("format_kwargs", {})["examples"] = [tokenizer.decode(filler)]
        with open(path, "w") as file:
            yaml.safe_dump(padded, file, sort_keys=False)
        length = prompt_tokens(prepare_run(path))
    return path, length


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, overrides = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(
        prog="agentic-grpo bench memory", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--recipe", default="cpu_demo", help="recipe file or shipped name (default: cpu_demo)")
    parser.add_argument("--steps", type=int, default=3, help="training steps to measure (default: 3)")
    parser.add_argument("--prompt-tokens", type=int, help="pad every prompt to about this many tokens (see above)")
    args = parser.parse_args(own)

    from agentic_grpo.resources import find_shipped
    from agentic_grpo.train import prepare
    from agentic_grpo.trainer_layers import trainer_class

    peaks = PhasePeaks()
    with tempfile.TemporaryDirectory(prefix="agentic-grpo-memory-") as output_dir:
        recipe = str(find_shipped(args.recipe, "recipes", ".yaml"))

        def prepare_run(path: str) -> Any:
            return prepare(["--config", path, *overrides, "--max_steps", str(args.steps), "--output_dir", output_dir,
                            "--save_strategy", "no", "--eval_before_after", "false", "--report_to", "none"])  # fmt: skip

        padded = recipe
        if args.prompt_tokens:
            padded, _ = padded_recipe(recipe, args.prompt_tokens, prepare_run, output_dir)
        run = prepare_run(padded)
        tokens = prompt_tokens(run)
        peaks.enter("model and trainer set-up")
        trainer = trainer_class(run.config, run.rollout_parts)(model=run.model_path, reward_funcs=run.rewards, args=run.config,
                                     train_dataset=run.train, rollout_parts=run.rollout_parts,
                                     peft_config=run.peft_config)  # fmt: skip
        trainer.rollout_func = peaks.wrap("rollout (generation and tools)", trainer.rollout_func)
        trainer._generate_and_score_completions = peaks.wrap(
            "scoring (rewards, old and reference log-probs)", trainer._generate_and_score_completions
        )
        trainer.compute_loss = peaks.wrap("loss forward", trainer.compute_loss)
        trainer.accelerator.backward = peaks.wrap("backward", trainer.accelerator.backward)
        peaks.enter("optimizer step and logging")
        began = time.time()
        trainer.train()
        seconds = time.time() - began
        steps = [row for row in trainer.state.log_history if "step_time" in row]
    phases = peaks.stop()
    result = {
        "benchmark": "memory",
        "recipe": recipe,
        "overrides": overrides,
        "prompt_tokens": tokens,
        "steps": args.steps,
        "peak_mb": max(phases.values()),
        "peak_mb_by_phase": phases,
        "step_seconds": [round(row["step_time"], 1) for row in steps],
        "seconds_by_phase": {name: round(value, 1) for name, value in peaks.seconds.items()},
        "train_seconds": round(seconds, 1),
        "command": " ".join(["agentic-grpo bench memory", *argv]),
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
