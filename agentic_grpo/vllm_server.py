"""vLLM server mode with any number of training processes: each process sends its own live trajectories.

TRL's server mode gathers every process's prompts into one call and hands each process the slice at its rank,
which is right only when all processes have the same number of live trajectories at every turn; a multi-turn
rollout does not. `ServerGeneration` stands where TRL's `VLLMGeneration` stands (`trainer.vllm_generation`, under
`VLLMBackend`), with the same `generate` and `sync_weights`, but every process holds its own client of the
server and sends only its own trajectories, every turn, however many are live there.

Weights reach the server in one of two ways:

- **A LoRA policy: its adapter, by file, under a new name each optimizer step** (`policy-<run>-step<N>`, `<run>`
  drawn once per trainer, so that runs sharing a server never meet each other's versions). The main
  process saves the adapter under `output_dir/vllm_adapters/`, asks the server to load it
  (`/v1/load_lora_adapter`; the server runs with `--enable-lora` and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`) and
  unloads the one before; every request names the version it samples with. No NCCL, so it works on any machine
  the server can read the file from, CPUs included. A version that did not reach the server (or reached it
  unapplied) makes the sampler's log-probs differ from the trainer's, which the sampler-trainer canary stops.
- **Full weights: TRL's own sync** (NCCL from the main process into a `trl vllm-serve` server, CUDA only); the
  requests name the served model, whose weights the sync replaces in place.
"""

from __future__ import annotations

import contextlib
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def trl_without_weight_transfer(args: Any, lora: bool) -> Iterator[None]:
    """Around TRL's `GRPOTrainer.__init__`: for a LoRA policy in server mode, TRL is built as if without vLLM, so
    that it opens no NCCL weight transfer (the adapter reaches the server by file); `args` is left as it was."""
    by_file = args.use_vllm and args.vllm_mode == "server" and lora
    if by_file:
        args.use_vllm = False
    try:
        yield
    finally:
        if by_file:
            args.use_vllm = True


def install_server_generation(trainer: Any, lora: bool) -> None:
    """In server mode, `trainer.vllm_generation` becomes a `ServerGeneration` (every process its own requests),
    and TRL syncs before each rollout of a new optimizer step; in colocate mode, or without vLLM, nothing changes."""
    if not (trainer.args.use_vllm and trainer.args.vllm_mode == "server"):
        return
    trainer.use_vllm, trainer._last_loaded_step = True, -1
    trainer.vllm_generation = ServerGeneration(trainer, weights=None if lora else trainer.vllm_generation)


class ServerGeneration:
    """What `VLLMBackend` needs of TRL's `VLLMGeneration`, in server mode, per process (see the module)."""

    mode = "server"
    enable_sleep_mode = False

    def __init__(self, trainer: Any, weights: Any = None) -> None:
        from accelerate.utils import broadcast_object_list
        from trl.generation.vllm_client import VLLMClient

        args = trainer.args
        self.trainer = trainer
        self.weights = weights  # TRL's `VLLMGeneration` for a full-weight sync; None for a LoRA policy
        base_url = args.vllm_server_base_url or f"http://{args.vllm_server_host}:{args.vllm_server_port}"
        self.client = VLLMClient(base_url=base_url, connection_timeout=args.vllm_server_timeout)
        self.base_model = self.client.model  # the name the server gives its own weights
        self.served = self.base_model
        self.adapters = Path(args.output_dir) / "vllm_adapters"
        run = [uuid.uuid4().hex[:8]]
        broadcast_object_list(run, from_process=0)  # one name per version on every process
        self.prefix = f"policy-{run[0]}-step"
        # The attributes TRL's `VLLMGeneration` builds each request from (`VLLMBackend` sets the two last per turn).
        self.temperature, self.top_p, self.top_k = trainer.temperature, trainer.top_p, trainer.top_k
        self.min_p, self.repetition_penalty = trainer.min_p, trainer.repetition_penalty
        self.max_completion_length = trainer.max_completion_length
        self.generation_kwargs = dict(args.generation_kwargs or {})

    def generate(self, prompts: list[list[int]], images: Any, num_generations: int) -> tuple:
        """One sample of each of this process's `prompts` (token ids), from the version last synced: (prompt ids,
        completion ids, per-token log-probs with one entry per token, their token ids)."""
        if images is not None or num_generations != 1:
            raise ValueError("server generation takes token ids alone, one sample each")
        output = self.client.generate(
            prompts=prompts, n=1, repetition_penalty=self.repetition_penalty, temperature=self.temperature,
            top_p=self.top_p, top_k=self.top_k or 0, min_p=self.min_p or 0.0, max_tokens=self.max_completion_length,
            logprobs=0, generation_kwargs={**self.generation_kwargs, "model": self.served},
        )  # fmt: skip
        return output["prompt_ids"], output["completion_ids"], output["logprobs"], output["logprob_token_ids"]

    def sync_weights(self) -> None:
        """The policy as it is now, onto the server (every process calls it: TRL does, before each rollout whose
        optimizer step is new)."""
        if self.weights is not None:
            self.weights.sync_weights()
            return
        trainer = self.trainer
        name = f"{self.prefix}{trainer.state.global_step}"
        if trainer.accelerator.is_main_process:
            self._load_adapter(name)
        trainer.accelerator.wait_for_everyone()
        self.served = name

    def _load_adapter(self, name: str) -> None:
        path = self.adapters / name
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        model.save_pretrained(str(path), selected_adapters=["default"])
        self._post("load_lora_adapter", {"lora_name": name, "lora_path": str(path.resolve())})
        previous = self.served
        if previous != self.base_model and previous != name:
            self._post("unload_lora_adapter", {"lora_name": previous})
            shutil.rmtree(self.adapters / previous, ignore_errors=True)

    def _post(self, endpoint: str, body: dict[str, Any]) -> None:
        response = self.client.session.post(f"{self.client.base_url}/v1/{endpoint}", json=body)
        if response.status_code != 200:
            hint = (
                " (start the server with `--enable-lora --max-lora-rank R` and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1)"
                if response.status_code in (404, 405) or "lora" in response.text.lower()
                else ""
            )
            raise RuntimeError(
                f"the vLLM server refused /v1/{endpoint} for adapter `{body['lora_name']}`: "
                f"{response.status_code} {response.text.strip()[:500]}{hint}"
            )
