"""Starting training processes: `--accelerate_config` runs a recipe under `accelerate launch`, and the refusals of a
launch this machine cannot run (GPU configs and DeepSpeed without CUDA), before any process starts or anything is
written.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def launch_with_accelerate(argv: list[str]) -> int:
    """`--accelerate_config NAME_OR_PATH` (a shipped config such as `cpu_2proc` or `deepspeed_zero3`, or a file):
    run this training under `accelerate launch` with that config, the rest of `argv` as the recipe's arguments."""
    from agentic_grpo.resources import find_shipped

    position = argv.index("--accelerate_config")
    if position + 1 == len(argv):
        raise ValueError("--accelerate_config needs a config: a YAML file or a shipped one's name (e.g. `cpu_2proc`)")
    if "LOCAL_RANK" in os.environ:  # already one process of a launch: a second launch would nest
        raise ValueError("--accelerate_config starts `accelerate launch` itself: drop it under `accelerate launch`")
    config = find_shipped(argv[position + 1], "accelerate_configs", ".yaml")
    check_launch_has_its_gpus(config, argv[position + 1])
    rest = argv[:position] + argv[position + 2 :]
    quietly = "import sys; from agentic_grpo.launch import launch_quietly; sys.exit(launch_quietly(sys.argv[1:]))"
    command = [sys.executable, "-c", quietly, "--config_file", str(config), "-m", "agentic_grpo.train", *rest]
    print(f"Launching: accelerate launch --config_file {config} -m agentic_grpo.train {' '.join(rest)}", flush=True)
    return subprocess.run(command).returncode


def launch_quietly(args: list[str]) -> int:
    """`accelerate launch ARGS` in this process. When the first process to stop refused the run (exit 2, after its
    one-line `error:`; the launcher then stops the others), the launch exits 2 too, without torch's
    `ChildFailedError` traceback after that line."""
    from accelerate.commands.launch import launch_command, launch_command_parser
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    try:
        launch_command(launch_command_parser().parse_args(args))
    except ChildFailedError as exc:
        if exc.failures and exc.get_first_failure()[1].exitcode == 2:
            return 2
        raise
    return 0


def check_launch_has_its_gpus(config: Path, name: str) -> None:
    """Refuse an accelerate config made for GPUs (`use_cpu: false`, several processes or a sharding engine) on a
    machine without CUDA: accelerate would start its processes on the CPU instead."""
    import torch
    import yaml

    settings = yaml.safe_load(config.read_text()) or {}
    if settings.get("use_cpu") or torch.cuda.is_available():
        return
    kind = str(settings.get("distributed_type", "NO"))
    if kind == "NO":
        return
    raise ValueError(
        f"accelerate config `{name}` runs on GPUs (distributed_type {kind}, {settings.get('num_processes', 1)} "
        "processes) and this machine has no CUDA GPU: use `--accelerate_config cpu_2proc` for two CPU processes, "
        "or leave `--accelerate_config` out for one"
    )


def use_cpu_when_distributed_without_gpu() -> None:
    """Under `accelerate launch`/torchrun with several processes and no CUDA, run every process on CPU over gloo.

    Without this each process sees no GPU and no `ACCELERATE_USE_CPU`, decides it is not
    distributed, and N independent copies of the run write over each other's files.
    """
    import torch

    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not torch.cuda.is_available():
        os.environ.setdefault("ACCELERATE_USE_CPU", "true")


def check_no_deepspeed_without_cuda(deepspeed: bool) -> None:
    import torch

    if deepspeed and not torch.cuda.is_available():
        raise ValueError(
            "DeepSpeed needs CUDA GPUs and this machine has none: drop `--deepspeed` / the DeepSpeed accelerate "
            "config, or use accelerate_configs/cpu_2proc.yaml for several CPU processes"
        )
