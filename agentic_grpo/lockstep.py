"""Processes that must decode in lockstep: a policy sharded by ZeRO-3 or FSDP over several processes.

Under those engines every forward pass is a collective (each layer's parameters are gathered from all
processes), so every process must run the same number of forward passes. `generate` keeps that true inside one
call (`synced_gpus`: a process whose rows have stopped keeps stepping until all have). Across the turns of a
multi-turn rollout nothing does, since each process's trajectories end at their own turns: the rollout asks
`live_on_any_process` every turn and a process with nothing left to generate runs an idle turn, so no process waits
in a collective that the others have left.
"""

from __future__ import annotations

from typing import Any

import torch


def needs_lockstep(model: Any) -> bool:
    """Whether every process must run the same decoding steps (`generate`'s `synced_gpus`: ZeRO-3 or FSDP shards
    over several processes)."""
    from transformers.integrations import is_deepspeed_zero3_enabled
    from transformers.integrations.fsdp import is_fsdp_managed_module

    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    world = torch.distributed.get_world_size() if distributed else 1
    return world > 1 and (is_deepspeed_zero3_enabled() or is_fsdp_managed_module(model))


def live_on_any_process(live_here: int) -> bool:
    """Whether any process still has a live trajectory (a collective: every process calls it once per turn)."""
    device = torch.device("cpu")
    if torch.distributed.get_backend() == "nccl":  # NCCL reduces CUDA tensors only
        device = torch.device("cuda", torch.cuda.current_device())
    flag = torch.tensor([1 if live_here else 0], device=device)
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
    return bool(flag.item())
