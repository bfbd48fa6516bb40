"""Weight syncs to a colocated vLLM engine: one per rollout however many turns, and the policy's base weights never
written by them.

The real engine runs in `tests/test_vllm_colocate.py` (the vllm lane, a minute or more per engine start); here, so
that these checks run in the default lane, a stand-in for its `LLM` and `SamplingParams`: `SleepingEngine` sleeps, wakes,
loads weights and answers `generate` as the engine does for TRL. Everything above it is TRL's own
`VLLMGeneration` (its `generate`, `sync_weights`, its sleep-mode bookkeeping), built without `__init__` (which
would start the engine), with our backend on top.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
from types import SimpleNamespace

import pytest
import torch

from agentic_grpo.vllm_backend import VLLMBackend
from tests.lockstep_support import manager, uneven_rows


class SleepingEngine:
    """vLLM's `LLM` in colocate mode with sleep mode on: each turn writes `text`; weights loaded are recorded."""

    def __init__(self, tokenizer, text: str = "go\n") -> None:
        self.completion = tokenizer.encode(text, add_special_tokens=False)
        self.awake: set[str] = set()
        self.loaded: dict[str, torch.Tensor] = {}
        self.events: list[tuple] = []
        runner = SimpleNamespace(model=SimpleNamespace(load_weights=self.load_weights))
        self.llm_engine = SimpleNamespace(
            model_executor=SimpleNamespace(driver_worker=SimpleNamespace(model_runner=runner)),
            vllm_config=SimpleNamespace(device_config=SimpleNamespace(device_type="cuda")),  # sleep mode: CUDA's
        )

    def sleep(self, level: int) -> None:
        self.events.append(("sleep", level))
        self.awake.clear()

    def wake_up(self, tags: list[str]) -> None:
        self.events.append(("wake", *tags))
        self.awake.update(tags)

    def load_weights(self, weights) -> None:
        assert "weights" in self.awake, "weights loaded into a sleeping engine"
        for name, tensor in weights:
            self.loaded[name] = tensor.clone()

    def reset_prefix_cache(self) -> None:
        self.events.append(("reset",))

    def generate(self, prompts, sampling_params, use_tqdm=False):
        assert {"weights", "kv_cache"} <= self.awake, f"generate on an engine asleep ({self.awake})"
        self.events.append(("generate", len(prompts)))
        logprobs = [{token: SimpleNamespace(logprob=-0.25, rank=1)} for token in self.completion]
        return [
            SimpleNamespace(prompt_token_ids=p["prompt_token_ids"],
                            outputs=[SimpleNamespace(token_ids=list(self.completion), logprobs=logprobs)])
            for p in prompts
        ]  # fmt: skip


@pytest.fixture
def vllm_generation(monkeypatch):
    """TRL's `VLLMGeneration` in colocate mode with sleep mode, its engine asleep as `_init_vllm` leaves it."""
    from trl.distributed import DistributedBackend
    from trl.generation import vllm_generation as module

    monkeypatch.setattr(module, "SamplingParams", lambda **kwargs: kwargs, raising=False)

    def build(model, tokenizer):
        generation = object.__new__(module.VLLMGeneration)
        no_sharding = SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=None, fsdp_plugin=None))
        generation.__dict__.update(
            model=model, accelerator=no_sharding, _dist=DistributedBackend(no_sharding), processing_class=tokenizer,
            mode="colocate", enable_sleep_mode=True, _llm_weights_sleeping=True, llm=SleepingEngine(tokenizer),
            tensor_parallel_size=1, structured_outputs_regex=None, repetition_penalty=1.0, temperature=1.0,
            top_p=1.0, top_k=0, min_p=0.0, max_completion_length=16, logprobs=0, generation_kwargs={},
            _weight_metadata=None,
        )  # fmt: skip
        generation.llm.sleep(level=2)
        syncs = []
        sync = generation.sync_weights
        generation.sync_weights = lambda: (syncs.append(1), sync())[1]
        return generation, syncs

    return build


def backend_on(generation, tokenizer, cls=VLLMBackend):
    trainer = SimpleNamespace(
        vllm_generation=generation, processing_class=tokenizer, eos_token_ids=[tokenizer.eos_token_id]
    )
    return cls(trainer)


def roll(backend, tokenizer):
    rollout = manager(tokenizer)
    try:
        return rollout.rollout(*uneven_rows(1), backend)
    finally:
        rollout.close()


def test_a_multi_turn_rollout_syncs_the_weights_once_and_leaves_the_engine_asleep(vllm_generation, tiny_model_dir,
                                                                                   tokenizer):  # fmt: skip
    from transformers import AutoModelForCausalLM

    generation, syncs = vllm_generation(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tokenizer)
    backend = backend_on(generation, tokenizer)
    for rollouts in (1, 2):  # the engine sleeps between rollouts: each rollout syncs once
        _, stats = roll(backend, tokenizer)
        assert stats.turns == 4
        assert len(syncs) == rollouts
        assert generation.llm.events[-1] == ("sleep", 2) and generation._llm_weights_sleeping
    assert sum(event[0] == "generate" for event in generation.llm.events) == 8
    assert generation.enable_sleep_mode  # restored after each rollout

    class TurnByTurn(VLLMBackend):  # the backend without its session: TRL's sleep after every call
        session = staticmethod(contextlib.nullcontext)

    generation, syncs = vllm_generation(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tokenizer)
    roll(backend_on(generation, tokenizer, TurnByTurn), tokenizer)
    assert len(syncs) == 4  # one per turn: what the session removes


def trl_step(generation, backend, tokenizer):
    """One optimizer step's generation in a real run's order: TRL syncs the weights (the step is new), then calls
    `rollout_func`, whose rollout runs in the backend's session."""
    generation.sync_weights()
    return roll(backend, tokenizer)


def test_in_a_real_runs_order_each_step_syncs_once_and_a_double_sync_is_counted(vllm_generation, tiny_model_dir,
                                                                                 tokenizer):  # fmt: skip
    from transformers import AutoModelForCausalLM

    generation, syncs = vllm_generation(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tokenizer)
    backend = backend_on(generation, tokenizer)
    for step in (1, 2, 3):
        _, stats = trl_step(generation, backend, tokenizer)
        assert stats.turns == 4
        assert len(syncs) == step  # TRL's sync, and none of the session's: the weights were awake and current
        assert generation.llm.events[-1] == ("sleep", 2)

    class SyncsAlways(VLLMBackend):  # planted: a session that syncs whether or not TRL just did
        @contextlib.contextmanager
        def session(self):
            self.vllm.sync_weights()
            with VLLMBackend.session(self):
                yield

    generation, syncs = vllm_generation(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tokenizer)
    trl_step(generation, backend_on(generation, tokenizer, SyncsAlways), tokenizer)
    assert len(syncs) == 2


def base_checksum(model) -> str:
    digest = hashlib.sha256()
    for name, param in model.named_parameters():
        if "lora_" not in name:
            digest.update(param.detach().view(torch.uint8).numpy().tobytes() if param.dtype != torch.bfloat16
                          else param.detach().view(torch.int16).numpy().tobytes())  # fmt: skip
    return digest.hexdigest()


def lora_policy(tiny_model_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    return get_peft_model(model, config)


def test_300_syncs_of_a_lora_policy_in_bf16_leave_its_base_weights_bit_identical(vllm_generation, tiny_model_dir,
                                                                                 tokenizer):  # fmt: skip
    from trl.generation.vllm_generation import VLLMGeneration

    policy = lora_policy(tiny_model_dir)
    generation, _ = vllm_generation(policy, tokenizer)
    trl_names = {name for name, _ in VLLMGeneration._iter_named_params(generation)}  # TRL's own walk, once
    policy = lora_policy(tiny_model_dir)  # that walk merged and unmerged in place: start again from a fresh copy
    generation, _ = vllm_generation(policy, tokenizer)
    backend_on(generation, tokenizer)  # installs the sync that merges into new tensors
    before = base_checksum(policy)
    for _ in range(300):
        generation.sync_weights()
    assert base_checksum(policy) == before
    assert set(generation.llm.loaded) == trl_names  # the names vLLM receives are TRL's

    reference = copy.deepcopy(policy).to(torch.float32).merge_and_unload()  # merged once, in fp32
    for name, merged in reference.named_parameters():
        assert torch.equal(generation.llm.loaded[name], merged.to(torch.bfloat16)), name
    assert not torch.equal(
        generation.llm.loaded["model.layers.0.self_attn.q_proj.weight"],
        policy.base_model.model.model.layers[0].self_attn.q_proj.base_layer.weight,
    )  # the adapter's update did reach vLLM


def test_trls_in_place_merge_moves_the_bf16_base(vllm_generation, tiny_model_dir, tokenizer):
    """What the sync above replaces: merging into the base and unmerging, 300 times, leaves rounding behind."""
    from trl.generation.vllm_generation import VLLMGeneration

    policy = lora_policy(tiny_model_dir)
    generation, _ = vllm_generation(policy, tokenizer)
    before = base_checksum(policy)
    for _ in range(300):
        for _ in VLLMGeneration._iter_named_params(generation):
            pass
    assert base_checksum(policy) != before
