"""The parts of the GPU check (`benchmarks/gpu.py`) that need no plan: models from a config, the tests' tokenizer,
calculator questions, and GRPO written out, since trl is not installed where the check runs.

The GRPO step is what TRL's `GRPOTrainer` computes for one optimizer step, reduced to its core: group-normalized
advantages of a rule reward, and the clipped policy-gradient loss on the model's own tokens (tool output is
context, never trained), with the log-probs the sampler recorded as the old log-probs. No KL term and no
reference model: the check measures the policy's own forward, backward and step. The same forward gives the
sampler-trainer gap.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


@dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int  # 0: the tokenizer's
    tied: bool


QWEN_1P5B = Shape("qwen2.5-1.5b", 1536, 28, 12, 2, 8960, 151936, True)
QWEN_7B = Shape("qwen2.5-7b", 3584, 28, 28, 4, 18944, 152064, False)
TINY_SHAPE = Shape("tiny-qwen2", 64, 2, 4, 2, 128, 0, True)


def calculator_class() -> type:
    try:
        from agentic_grpo.tools.calculator import Calculator  # the installed package
    except ImportError:
        from tools.calculator import Calculator  # the checkout on the path (the GPU machine: nothing installed)
    return Calculator


def tests_tokenizer(directory: Path) -> Any:
    from transformers import AutoTokenizer

    from agentic_grpo.models import build_tiny_model

    return AutoTokenizer.from_pretrained(build_tiny_model(directory / "tests-model"))


def build_model(shape: Shape, tokenizer: Any, dtype: torch.dtype, device: torch.device) -> Any:
    """A Qwen2 causal LM of `shape` with random weights, initialized on `device` in `dtype` (no fp32 copy)."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=shape.vocab or len(tokenizer), hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
        max_position_embeddings=32768, tie_word_embeddings=shape.tied, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model


def end_of_turn_ids(tokenizer: Any, vocab: int, every: int) -> list[int]:
    """The tokenizer's EOS and the top 1/`every` of the vocabulary, so that a random model ends turns at varied
    lengths."""
    return sorted({tokenizer.eos_token_id, *range(vocab - vocab // every, vocab)})


def questions(seed: int, count: int) -> list[dict[str, str]]:
    rng = random.Random(seed)
    pairs = [(rng.randint(100, 999), rng.randint(10, 99)) for _ in range(count)]
    return [{"question": f"What is {a} * {b}?", "answer": str(a * b)} for a, b in pairs]


def model_tokens(trajectory: Any) -> int:
    return sum(len(s.token_ids) for s in trajectory.segments if s.role == "model")


def rule_reward(trajectory: Any, row: dict[str, str], budget: int) -> float:
    """1 for the right final answer; else a small cost per model token, so that a group of wrong answers still ranks
    (with random weights every answer is wrong, and equal rewards would leave no advantage to train on)."""
    if trajectory.final_answer is not None and trajectory.final_answer.strip() == row["answer"]:
        return 1.0
    return -0.1 * model_tokens(trajectory) / budget


def group_advantages(rewards: list[float], group: int) -> torch.Tensor:
    grouped = torch.tensor(rewards, dtype=torch.float32).view(-1, group)
    return ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).flatten()


def grpo_update(model: Any, optimizer: Any, trajectories: list[Any], advantages: torch.Tensor, micro_batch: int,
                temperature: float, clip: float, pad_id: int) -> tuple[float, torch.Tensor]:  # fmt: skip
    """One optimizer step of the clipped GRPO loss over the trajectories (micro-batches of right-padded rows,
    summed over model tokens and divided by their count); the loss and the sampler-trainer gaps before the step."""
    device = next(model.parameters()).device
    model.train()
    total = sum(map(model_tokens, trajectories))
    loss_sum, gaps = 0.0, []
    for start in range(0, len(trajectories), micro_batch):
        chunk = trajectories[start : start + micro_batch]
        width = max(len(t.prompt_ids) + len(t.completion_ids) for t in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        attention = torch.zeros((len(chunk), width), dtype=torch.long)
        trained = torch.zeros((len(chunk), width), dtype=torch.bool)
        old = torch.zeros((len(chunk), width), dtype=torch.float32)
        for row, trajectory in enumerate(chunk):
            sequence = trajectory.prompt_ids + trajectory.completion_ids
            ids[row, : len(sequence)] = torch.tensor(sequence)
            attention[row, : len(sequence)] = 1
            at = len(trajectory.prompt_ids)
            for segment in trajectory.completion_segments:
                if segment.role == "model":
                    trained[row, at : at + len(segment.token_ids)] = True
                    old[row, at : at + len(segment.token_ids)] = torch.tensor(segment.logprobs)
                at += len(segment.token_ids)
        ids, attention, trained, old = ids.to(device), attention.to(device), trained.to(device), old.to(device)
        logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].float() / temperature
        logprobs = logits.log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        mask, old = trained[:, 1:], old[:, 1:]  # the logits at position i score the token at i + 1
        ratio = (logprobs - old).exp()
        advantage = advantages[start : start + len(chunk), None].to(device)
        surrogate = torch.minimum(ratio * advantage, ratio.clamp(1 - clip, 1 + clip) * advantage)
        loss = -(surrogate * mask).sum() / total
        loss.backward()
        loss_sum += loss.item()
        gaps.append((logprobs.detach() - old)[mask].abs().cpu())
        del logits, logprobs, ratio, surrogate, loss
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss_sum, torch.cat(gaps)


def gap_summary(gaps: torch.Tensor) -> dict[str, Any]:
    gaps = gaps.double()
    return {"tokens": len(gaps), "mean": float(gaps.mean()), "p50": float(gaps.quantile(0.5)),
            "p99": float(gaps.quantile(0.99)), "max": float(gaps.max()),
            "share_over_0.5": float((gaps > 0.5).double().mean())}  # fmt: skip
