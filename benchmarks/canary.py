"""The sampler-trainer canary on the demo: the honest gap, and what realistic planted bugs read, against the
default limit (`agentic_grpo.canaries.canary_limit`).

    agentic-grpo bench canary --adapter outputs/cpu-demo      # a trained LoRA adapter of the demo (an output_dir)

Each arm rolls out the same rows from the same seed with HF `generate` and reads `canary/logprob_diff/mean`:
- `honest`: nothing planted;
- `dropout_0.05`, `dropout_0.1`: the adapter's dropout at that rate, left on while sampling;
- `temperature_0.9_vs_1.0`: sampled at 0.9, scored at 1.0;
- `adapter_off`: the sampler with the adapter disabled.
A fresh adapter is zero (PEFT's B), so switching it off would change nothing: give a trained one.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

PLANTS = ("honest", "dropout_0.05", "dropout_0.1", "temperature_0.9_vs_1.0", "adapter_off")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def planted(trainer: Any, plant: str) -> contextlib.AbstractContextManager:
    """The backend's sampling model with `plant` in it, and the trainer as the plant needs it; undone on exit."""
    backend = trainer.generation_backend
    generating = backend._generating_model

    @contextlib.contextmanager
    def sampling(change: Callable[[Any], contextlib.AbstractContextManager]) -> Iterator[None]:
        @contextlib.contextmanager
        def changed() -> Iterator[Any]:
            with generating() as model, change(model):
                yield model

        backend._generating_model = changed
        try:
            yield
        finally:
            backend._generating_model = generating

    @contextlib.contextmanager
    def dropout_on(rate: float) -> Iterator[None]:
        # Each LoRA layer's dropout at `rate` (PEFT holds an Identity where the adapter's own rate is 0).
        layers = [
            m for m in trainer.model.modules() if isinstance(getattr(m, "lora_dropout", None), torch.nn.ModuleDict)
        ]
        saved = [dict(layer.lora_dropout) for layer in layers]
        for layer in layers:
            for adapter in list(layer.lora_dropout):
                layer.lora_dropout[adapter] = torch.nn.Dropout(rate)

        @contextlib.contextmanager
        def left_on(model: Any) -> Iterator[None]:
            model.train(True)
            yield

        try:
            with sampling(left_on):
                yield
        finally:
            for layer, dropouts in zip(layers, saved, strict=True):
                layer.lora_dropout.update(dropouts)

    @contextlib.contextmanager
    def temperatures(sampled: float, scored: float) -> Iterator[None]:
        config, saved = backend.generation_config, (backend.generation_config.temperature, trainer.temperature)
        config.temperature, trainer.temperature = sampled, scored
        try:
            yield
        finally:
            config.temperature, trainer.temperature = saved

    if plant == "honest":
        return contextlib.nullcontext()
    if plant.startswith("dropout_"):
        return dropout_on(float(plant.removeprefix("dropout_")))
    if plant == "temperature_0.9_vs_1.0":
        return temperatures(0.9, 1.0)
    if plant == "adapter_off":
        return sampling(lambda model: model.disable_adapter())
    raise ValueError(f"unknown plant `{plant}` (known: {', '.join(PLANTS)})")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, overrides = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(
        prog="agentic-grpo bench canary", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--adapter", required=True, help="a trained LoRA adapter of the recipe's model (a directory)")
    parser.add_argument("--recipe", default="cpu_demo", help="recipe file or shipped name (default: cpu_demo)")
    parser.add_argument("--questions", type=int, default=2, help="training questions rolled out per arm (default: 2)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed, the same for every arm (default: 0)")
    args = parser.parse_args(own)

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from agentic_grpo.canaries import canary_limit
    from agentic_grpo.resources import find_shipped
    from agentic_grpo.train import prepare
    from agentic_grpo.trainer_layers import trainer_class

    with tempfile.TemporaryDirectory(prefix="agentic-grpo-canary-") as output_dir:
        recipe = str(find_shipped(args.recipe, "recipes", ".yaml"))
        run = prepare(["--config", recipe, *overrides, "--output_dir", output_dir, "--save_strategy", "no",
                       "--eval_before_after", "false", "--report_to", "none", "--save_trajectories_steps", "0"])  # fmt: skip
        base = AutoModelForCausalLM.from_pretrained(run.model_path, **(run.config.model_init_kwargs or {}))
        model = PeftModel.from_pretrained(base, args.adapter, is_trainable=True)
        trainer = trainer_class(run.config, run.rollout_parts)(model=model, reward_funcs=run.rewards, args=run.config, train_dataset=run.train,
                                     rollout_parts=run.rollout_parts)  # fmt: skip
        limit = canary_limit(trainer)  # the default for this set-up, before the arms lift it to read every gap
        trainer.args.canary_logprob_limit = float("inf")
        rows = [run.train[i] for i in range(args.questions) for _ in range(run.config.num_generations)]
        trainer.model.train()
        gaps: dict[str, dict[str, float]] = {}
        for plant in PLANTS:
            torch.manual_seed(args.seed)
            began = time.time()
            with planted(trainer, plant):
                trainer.generate_and_score(rows)
            logged = trainer._metrics["train"]
            gaps[plant] = {
                "mean": logged["canary/logprob_diff/mean"][-1],
                "max": logged["canary/logprob_diff/max"][-1],
                "over_default_limit": logged["canary/logprob_diff/mean"][-1] / limit,
            }
            log(f"{plant}: {gaps[plant]} ({time.time() - began:.0f} s)")
    result = {
        "benchmark": "canary",
        "recipe": recipe,
        "adapter": args.adapter,
        "trajectories_per_arm": len(rows),
        "policy_dtype": str(next(trainer.model.parameters()).dtype),
        "default_limit": limit,
        "gaps": gaps,
        "caught_by_default": {plant: gaps[plant]["mean"] > limit for plant in PLANTS},
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
