"""Run by tests/test_lockstep.py under torchrun (2 CPU processes, gloo): the tiny model sharded with FSDP2, a greedy
rollout whose trajectories end at different turns on each process, then the loss of each process's trajectories
(forward and backward through the sharded model). Writes OUT/rank{N}.json.

    python -m torch.distributed.run --nproc_per_node 2 tests/lockstep_two_processes.py MODEL OUT [planted]

`planted`: each process leaves the turn loop when its own trajectories have ended (what the rollout did before it
asked the other processes), which must not finish cleanly.
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from agentic_grpo.backends import TransformersBackend
from tests.lockstep_support import manager, uneven_rows


def completion_loss(model, trajectories) -> torch.Tensor:
    """Minus the mean log-prob of the model's own tokens (tool tokens masked), over right-padded rows."""
    rows = [t.prompt_ids + t.completion_ids for t in trajectories]
    width = max(map(len, rows))
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    trained = torch.zeros((len(rows), width))
    for i, (row, t) in enumerate(zip(rows, trajectories, strict=True)):
        ids[i, : len(row)], mask[i, : len(row)] = torch.tensor(row), 1
        trained[i, len(t.prompt_ids) : len(row)] = torch.tensor(t.loss_mask, dtype=torch.float)
    logprobs = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits[:, :-1].float(), dim=-1)
    chosen = logprobs.gather(-1, ids[:, 1:, None]).squeeze(-1)
    return -(chosen * trained[:, 1:]).sum() / trained[:, 1:].sum()


def main(model_dir: str, out: str, planted: bool = False) -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    config = GenerationConfig(
        do_sample=False, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id
    )
    backend = TransformersBackend(model, tokenizer, config, [tokenizer.eos_token_id])
    if planted:
        backend.any_process_live = lambda live_here: live_here > 0
    rollout = manager(tokenizer)
    prompts, rows = uneven_rows(rank)
    try:
        trajectories, _ = rollout.rollout(prompts, rows, backend)
    finally:
        rollout.close()
    loss = completion_loss(model, trajectories)
    loss.backward()  # FSDP reduce-scatters the gradients: one more collective every process must reach
    record = {
        "lockstep": backend.lockstep,
        "turns": [t.turns for t in trajectories],
        "completions": [t.completion_ids for t in trajectories],
        "loss": loss.item(),
    }
    Path(out, f"rank{rank}.json").write_text(json.dumps(record))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], planted=sys.argv[3:] == ["planted"])
