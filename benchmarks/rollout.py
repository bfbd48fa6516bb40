"""How fast is a rollout, against its generation-only bound and against TRL's own tool loop? Prints JSON.

Everything runs in one process, one after another, on the same model, questions and seed, after an
untimed warm-up rollout of the same size, so the machine's load is shared alike:

- `bound_before`: the project's `RolloutManager` with instant tools, every context read whole each turn
  (`reuse_cache=False`, the generation path before keys and values were kept across turns);
- `bound_full_batch`: the same with kept keys and values, every row decoded until the turn's last one stops
  (`shrink_batch=False`, as `generate` does);
- `bound`: the same with kept keys and values and rows leaving the batch as they stop (the default): the
  generation-only bound;
- `ours`: the same with a calculator that sleeps `latency` seconds per call, for each `--latencies` value;
- `trl`: TRL's own multi-turn tool loop (`GRPOTrainer(tools=[calculator])`, its `_generate`: one
  `generate` per turn over the prompts that called a tool, the calls run one after another, parsed with
  the chat template's tool-call format) with the same sleeping calculator.

TRL parses tool calls in a chat template's own format (`<tool_call>{json}</tool_call>`), which SmolLM2's
template does not have; its loop is driven with the ChatML tool template TRL ships (Qwen2.5's, the same
`<|im_start|>` markup SmolLM2 uses), and the recipe's worked example rewritten as a native tool call (the
question and the call: see `trl_prompts`). The questions, tool, model and sampling are the same; the
prompts differ in format, so each side reports its own tool calls and model tokens beside its time.
TRL has no per-turn budget: each of its turns may run to `max_completion_length`.

Rates count model tokens only (tool output excluded). Anything after `--` goes to the recipe as overrides.

    agentic-grpo bench rollout                                   # SmolLM2, the demo: 8 questions x G=4
    agentic-grpo bench rollout --smoke --model PATH              # seconds, on a tiny model (the tests)
    agentic-grpo bench rollout --engine vllm --no-trl --no-before # HF generate against a colocated vLLM engine

With `--engine vllm` the same rollouts then run on a colocated vLLM engine that TRL builds as the trainer does
(`vllm_bound`, `vllm`), loaded from the model's directory in the policy's dtype; `hf_dtype` and `vllm_dtype` say
what each ran in.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import torch


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def sleeping(environment: type, latency: float) -> type:
    """`environment` whose every tool call first sleeps `latency` seconds (a slow tool)."""

    class Sleeping(environment):  # type: ignore[misc, valid-type]
        def execute(self, call: Any, timeout: float) -> Any:
            time.sleep(latency)
            return super().execute(call, timeout)

    return Sleeping


def measured(seconds: float, cpu_seconds: float, trajectories_tokens: int, calls: int, **extra: Any) -> dict[str, Any]:
    """One run's figures; `cpu_seconds` is this process's CPU time, the fairer measure on a machine others load."""
    return {"seconds": round(seconds, 2), "cpu_seconds": round(cpu_seconds, 2), "model_tokens": trajectories_tokens,
            "tokens_per_s": round(trajectories_tokens / seconds, 2) if seconds else None, "tool_calls": calls,
            **extra}  # fmt: skip


def ours(model: Any, tokenizer: Any, built: Any, rows: list[dict], group: int, latency: float, reuse: bool,
         seed: int, shrink: bool = True, backend: Any = None) -> tuple[dict[str, Any], list[list[int]]]:  # fmt: skip
    """One rollout of the project's `RolloutManager` over `rows` x `group`; its figures and its model tokens.
    `backend`: instead of HF `generate` on `model` (a `VLLMBackend`)."""
    from agentic_grpo.backends import TransformersBackend
    from agentic_grpo.rollout import RolloutManager

    parts, config = built.rollout_parts, built.config
    if backend is None:
        generation_config, eos_ids = sampling(model, tokenizer, config)
        backend = TransformersBackend(model, tokenizer, generation_config, eos_ids, reuse_cache=reuse,
                                      shrink_batch=shrink)  # fmt: skip
    environment = sleeping(parts.environment, latency)
    manager = RolloutManager(lambda: environment(**parts.environment_kwargs), parts.trajectory_format, tokenizer,
                             parts.limits)  # fmt: skip
    repeated = [row for row in rows for _ in range(group)]
    prompts = [parts.trajectory_format.prompt_messages(str(row["question"])) for row in repeated]
    torch.manual_seed(seed)
    start, cpu_start = time.perf_counter(), time.process_time()
    try:
        trajectories, stats = manager.rollout(prompts, repeated, backend)
    finally:
        manager.close()
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    tokens = [[i for s in t.segments if s.role == "model" for i in s.token_ids] for t in trajectories]
    calls = sum(len(t.tool_calls) for t in trajectories)
    figures = measured(seconds, cpu_seconds, sum(map(len, tokens)), calls, turns=stats.turns,
                       generation_seconds=round(stats.generation_seconds, 2),
                       tool_seconds=round(stats.tool_seconds, 2))  # fmt: skip
    return figures, tokens


def sampling(model: Any, tokenizer: Any, config: Any) -> tuple[Any, list[int]]:
    """The recipe's sampling (temperature, top-p, top-k) as a `GenerationConfig`, and the EOS ids."""
    from transformers import GenerationConfig

    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    eos = model.generation_config.eos_token_id
    eos_ids = sorted({tokenizer.eos_token_id, *([eos] if isinstance(eos, int) else (eos or []))})
    generation_config = GenerationConfig(
        do_sample=True, temperature=config.temperature, top_p=config.top_p, top_k=config.top_k or None,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=eos_ids,
    )  # fmt: skip
    return generation_config, eos_ids


def trl_prompts(built: Any, questions: list[str]) -> list[list[dict[str, Any]]]:
    """The recipe's chat in TRL's format: each worked example's question and its call, as a native tool call.

    The example stops at the call. With the tool's response and the answer after it, as the ReAct example has,
    SmolLM2 copies the last thing it saw, the `<tool_response>` block inside a user turn, and never writes
    `<tool_call>` (measured: 0 calls in 32 trajectories); ending on the call, it writes one in nearly every first
    turn. TRL's loop then runs tools, which is what the comparison is for."""
    from agentic_grpo.trajectory import ToolCall

    trajectory_format = built.rollout_parts.trajectory_format
    example: list[dict[str, Any]] = []
    for turn in getattr(trajectory_format, "example_turns", []):
        call = trajectory_format.parse(turn["response"].strip().partition("Observation:")[0])
        if not isinstance(call, ToolCall):
            raise ValueError(f"the recipe's example turn does not open with a tool call: {turn['response'][:80]!r}")
        example += [
            {"role": "user", "content": turn["question"].strip()},
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": call.name, "arguments": call.arguments}}]},
        ]  # fmt: skip
    return [[*example, {"role": "user", "content": question}] for question in questions]


def trl_tool_loop(model: Any, tokenizer: Any, built: Any, rows: list[dict], group: int, latency: float, seed: int,
                  output_dir: str) -> dict[str, Any]:  # fmt: skip
    """One batch through TRL's own `_generate` (generation, `parse_response`, `_tool_call_loop`)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen2_5_chat_template

    environment = built.rollout_parts.environment(**built.rollout_parts.environment_kwargs)
    tool_method = getattr(environment, "calculator", None)
    if tool_method is None:
        raise ValueError("the TRL comparison drives the calculator tool; this recipe's environment has none")

    def calculator(expression: str) -> str:
        """Evaluate an arithmetic expression exactly.

        Args:
            expression: Numbers with + - * / // % ** and parentheses, e.g. "123 * 456".
        """
        time.sleep(latency)
        return tool_method(expression)

    config = built.config
    tokenizer.chat_template = qwen2_5_chat_template  # TRL recognises it and sets its tool-call parser
    tokenizer.response_template = tokenizer.response_schema = None
    args = GRPOConfig(
        output_dir=output_dir, num_generations=group, per_device_train_batch_size=group,
        max_completion_length=config.max_completion_length, max_tool_calling_iterations=config.max_turns - 1,
        temperature=config.temperature, top_p=config.top_p, top_k=config.top_k or 0, report_to=[],
        use_cpu=True, seed=seed, logging_steps=1, save_strategy="no",
    )  # fmt: skip
    questions = [str(row["question"]) for row in rows for _ in range(group)]
    prompts = trl_prompts(built, questions)
    trainer = GRPOTrainer(model=model, reward_funcs=[lambda completions, **_: [0.0] * len(completions)], args=args,
                          train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]),
                          processing_class=tokenizer, tools=[calculator])  # fmt: skip
    # What `_generate_and_score_completions` sets up before it calls `_generate`: each prompt's tools by name.
    trainer._sync_tool_dicts = [{tool.__name__: tool for tool in trainer._standalone_tools} for _ in prompts]
    trainer._async_tool_dicts = [{} for _ in prompts]
    trainer.model.eval()
    torch.manual_seed(seed)
    start, cpu_start = time.perf_counter(), time.process_time()
    _, completion_ids, tool_mask, _, _, _, _, _ = trainer._generate(prompts)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    metrics = trainer._metrics["eval"]
    calls = round(metrics["tools/call_frequency"][-1] * len(prompts)) if metrics.get("tools/call_frequency") else 0
    model_tokens = sum(sum(mask) for mask in tool_mask) if tool_mask is not None else sum(map(len, completion_ids))
    return measured(seconds, cpu_seconds, model_tokens, calls)


def vllm_backend(model: Any, tokenizer: Any, built: Any, sequences: int) -> Any:
    """A colocated vLLM engine on `model`'s weights (from its directory), built by TRL's `VLLMGeneration` as the
    trainer builds it, with the recipe's sampling, behind the trainer's `VLLMBackend`."""
    from types import SimpleNamespace

    from accelerate import Accelerator
    from trl.generation.vllm_generation import VLLMGeneration

    from agentic_grpo.vllm_backend import VLLMBackend, engine_as_the_policy

    config = built.config
    _, eos_ids = sampling(model, tokenizer, config)
    colocated = SimpleNamespace(use_vllm=True, vllm_mode="colocate")
    with engine_as_the_policy(colocated, model):
        engine = VLLMGeneration(
            model=model, accelerator=Accelerator(), processing_class=tokenizer, mode="colocate",
            gpu_memory_utilization=config.vllm_gpu_memory_utilization, max_model_length=config.vllm_max_model_length,
            max_num_seqs=sequences, temperature=config.temperature, top_p=config.top_p, top_k=config.top_k or 0,
            min_p=config.min_p or 0.0, max_completion_length=config.max_tokens_per_turn, logprobs=0,
        )  # fmt: skip
    # The three parts of a trainer the backend reads.
    return VLLMBackend(SimpleNamespace(vllm_generation=engine, processing_class=tokenizer, eos_token_ids=eos_ids))


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, overrides = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(
        prog="agentic-grpo bench rollout", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--recipe", default="cpu_demo", help="recipe file or shipped name (default: cpu_demo)")
    parser.add_argument("--model", default=None, help="model instead of the recipe's (e.g. a tiny test model)")
    parser.add_argument("--questions", type=int, default=8, help="questions from the training split (default: 8)")
    parser.add_argument("--group", type=int, default=4, help="trajectories per question, G (default: 4)")
    parser.add_argument("--max-turns", type=int, default=3, help="turns per trajectory (default: 3)")
    parser.add_argument("--latencies", type=float, nargs="+", default=[0.0, 0.1, 1.0],
                        help="tool latencies in seconds (default: 0 0.1 1)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="sampling seed, the same for every rollout (default: 0)")
    parser.add_argument("--no-trl", action="store_true", help="skip TRL's tool loop")
    parser.add_argument("--engine", choices=["hf", "vllm"], default="hf",
                        help="vllm: also run the rollouts on a colocated vLLM engine (TRL's, as `use_vllm: true` "
                             "builds it) after the HF ones, and compare (default: hf)")  # fmt: skip
    parser.add_argument("--no-before", action="store_true",
                        help="skip the rollouts that read whole contexts and that keep the full batch")  # fmt: skip
    parser.add_argument("--smoke", action="store_true",
                        help="2 questions x G=2, latencies 0 and 0.1, 24 tokens a turn: seconds on a tiny --model")  # fmt: skip
    args = parser.parse_args(own)
    if args.smoke:
        args.questions, args.group, args.latencies = 2, 2, [0.0, 0.1]
        overrides = ["--max_tokens_per_turn", "24", "--max_completion_length", "64", *overrides]

    import tempfile

    from agentic_grpo.evaluate import load_policy
    from agentic_grpo.resources import find_shipped
    from agentic_grpo.run_parts import build_recipe

    recipe = str(find_shipped(args.recipe, "recipes", ".yaml"))
    built = build_recipe(["--config", recipe, "--max_turns", str(args.max_turns), *overrides])
    model_path = args.model or built.model_config.model_name_or_path
    model, tokenizer = load_policy(model_path)
    model.eval()
    rows = [dict(row) for row in built.train.select(range(args.questions))]
    result: dict[str, Any] = {
        "benchmark": "rollout", "recipe": recipe, "model": model_path, "questions": args.questions,
        "group": args.group, "max_turns": args.max_turns, "max_tokens_per_turn": built.config.max_tokens_per_turn,
        "max_completion_length": built.config.max_completion_length, "seed": args.seed,
        "torch_threads": torch.get_num_threads(),
    }  # fmt: skip

    # Untimed, at full size: the first rollout of a size pays one-time costs (fresh pages for the allocator's
    # large blocks, the stop-string tables) that would otherwise fall on whichever arm runs first (measured:
    # 23-25 s for the bound run first, 19.5-20 s for the same rollout run later).
    log("warm-up (the same rollout, not timed) ...")
    ours(model, tokenizer, built, rows, args.group, 0.0, True, args.seed)
    log("generation-only bound (instant tools), kept keys and values ...")
    result["bound"], bound_tokens = ours(model, tokenizer, built, rows, args.group, 0.0, True, args.seed)
    log(f"  {result['bound']}")
    if not args.no_before:
        log("generation-only bound, every context read whole each turn (before) ...")
        result["bound_before"], before_tokens = ours(model, tokenizer, built, rows, args.group, 0.0, False, args.seed)
        result["bound_before"]["same_tokens_as_bound"] = before_tokens == bound_tokens
        log(f"  {result['bound_before']}")
        log("generation-only bound, kept keys and values, every row decoded until the last one stops ...")
        result["bound_full_batch"], full_tokens = ours(model, tokenizer, built, rows, args.group, 0.0, True,
                                                       args.seed, shrink=False)  # fmt: skip
        result["bound_full_batch"]["same_tokens_as_bound"] = full_tokens == bound_tokens
        log(f"  {result['bound_full_batch']}")
    result["ours"], result["trl"] = {}, {}
    for latency in args.latencies:
        log(f"ours, tools take {latency} s ...")
        result["ours"][str(latency)], _ = ours(model, tokenizer, built, rows, args.group, latency, True, args.seed)
        log(f"  {result['ours'][str(latency)]}")
    if not args.no_trl:
        with tempfile.TemporaryDirectory(prefix="agentic-grpo-bench-rollout-") as output_dir:
            for latency in args.latencies:
                log(f"TRL's tool loop, tools take {latency} s ...")
                _, trl_tokenizer = load_policy(model_path)  # TRL's run gets its own template; ours stays as it was
                result["trl"][str(latency)] = trl_tool_loop(model, trl_tokenizer, built, rows, args.group, latency,
                                                            args.seed, output_dir)  # fmt: skip
                log(f"  {result['trl'][str(latency)]}")

    if args.engine == "vllm":
        log("starting a colocated vLLM engine ...")
        backend = vllm_backend(model, tokenizer, built, args.questions * args.group)
        result["vllm_dtype"] = str(backend.vllm.llm.llm_engine.model_config.dtype)
        log("vLLM: warm-up (the same rollout, not timed) ...")
        ours(model, tokenizer, built, rows, args.group, 0.0, True, args.seed, backend=backend)
        log("vLLM: generation-only bound (instant tools) ...")
        result["vllm_bound"], _ = ours(
            model, tokenizer, built, rows, args.group, 0.0, True, args.seed, backend=backend
        )
        log(f"  {result['vllm_bound']}")
        result["vllm"] = {}
        for latency in args.latencies:
            log(f"vLLM, tools take {latency} s ...")
            result["vllm"][str(latency)], _ = ours(model, tokenizer, built, rows, args.group, latency, True,
                                                   args.seed, backend=backend)  # fmt: skip
            log(f"  {result['vllm'][str(latency)]}")
    result["hf_dtype"] = str(next(model.parameters()).dtype)

    bound = result["bound"]
    ratios: dict[str, Any] = {
        "rollout_over_bound": {k: ratio(v["seconds"], bound["seconds"]) for k, v in result["ours"].items()},
    }
    if "vllm" in result:
        vllm_bound = result["vllm_bound"]
        ratios["vllm_rollout_over_vllm_bound"] = {k: ratio(v["seconds"], vllm_bound["seconds"])
                                                  for k, v in result["vllm"].items()}  # fmt: skip
        ratios["vllm_bound_tokens_per_s_over_hf_bound"] = ratio(vllm_bound["tokens_per_s"], bound["tokens_per_s"])
        ratios["vllm_tokens_per_s_over_hf"] = {k: ratio(v["tokens_per_s"], result["ours"][k]["tokens_per_s"])
                                               for k, v in result["vllm"].items()}  # fmt: skip
    if "bound_before" in result:
        ratios["bound_speedup_over_before"] = ratio(result["bound_before"]["seconds"], bound["seconds"])
        ratios["bound_tokens_per_s_over_before"] = ratio(bound["tokens_per_s"], result["bound_before"]["tokens_per_s"])
        ratios["bound_cpu_speedup_over_before"] = ratio(result["bound_before"]["cpu_seconds"], bound["cpu_seconds"])
        ratios["bound_speedup_over_full_batch"] = ratio(result["bound_full_batch"]["seconds"], bound["seconds"])
    if result["trl"]:
        ratios["ours_tokens_per_s_over_trl"] = {
            k: ratio(result["ours"][k]["tokens_per_s"], v["tokens_per_s"]) for k, v in result["trl"].items()
        }
        ratios["trl_seconds_over_ours"] = {k: ratio(v["seconds"], result["ours"][k]["seconds"])
                                           for k, v in result["trl"].items()}  # fmt: skip
    result["ratios"] = ratios
    result["command"] = " ".join(["agentic-grpo bench rollout", *argv])
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
