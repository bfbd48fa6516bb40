"""GPU memory of one training process, estimated from a model built on the meta device and a recipe.

`model_facts` builds the recipe's model on the meta device (no weights allocated) from its config: a local
directory, the Hugging Face cache, or a shape shipped here (`MODEL_SHAPES`, for a machine with no hub), and
applies the recipe's LoRA with PEFT to count what trains. `estimate` turns those counts, the recipe's lengths
and the launch (processes, ZeRO/FSDP sharding) into the parts of the peak, each part with the phase that holds it:
`always` (weights, optimizer state), `rollout` (vLLM's share or the KV cache) or `training` (gradients,
activations, logits). The peak is what is always held plus the larger phase. docs/dry_run.md states the
assumptions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GIB = 2**30

# Architecture fields of the hub's config.json of the models the GPU recipes name (the Instruct and base models
# share them), so a machine without the hub can still build them on the meta device.
_QWEN2 = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu", "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "use_sliding_window": False, "attention_dropout": 0.0,
    "dtype": "bfloat16",
}  # fmt: skip
MODEL_SHAPES: dict[str, dict[str, Any]] = {
    "Qwen/Qwen2.5-1.5B-Instruct": {
        **_QWEN2, "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
        "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True,
    },
    "Qwen/Qwen2.5-7B-Instruct": {
        **_QWEN2, "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
        "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False,
    },
}  # fmt: skip
for _size in ("1.5B", "7B"):
    MODEL_SHAPES[f"Qwen/Qwen2.5-{_size}"] = MODEL_SHAPES[f"Qwen/Qwen2.5-{_size}-Instruct"]

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
CUDA_CONTEXT_GIB = 1.0  # CUDA context, cuBLAS/NCCL workspaces and allocator slack: typically 0.5-1 GiB
LOGIT_TILE = (4096, 32768)  # TRL's fused LM head: tokens x vocabulary columns per fp32 tile (trl.kernels)


def model_config(name_or_path: str) -> tuple[Any, str]:
    """The model's `PretrainedConfig` and where it came from: a local directory, the Hugging Face cache, or a
    shipped shape. Raises ValueError naming the shipped shapes when none of them has it."""
    from transformers import AutoConfig

    from agentic_grpo.models import SMOLLM2_ALIAS, TINY_ALIAS, resolve_model

    if name_or_path in (SMOLLM2_ALIAS, TINY_ALIAS) or (Path(name_or_path).expanduser() / "config.json").is_file():
        return AutoConfig.from_pretrained(resolve_model(name_or_path)), "local"
    if name_or_path.count("/") == 1:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(name_or_path, "config.json")
        if isinstance(cached, str):
            return AutoConfig.from_pretrained(str(Path(cached).parent)), "Hugging Face cache"
    if name_or_path in MODEL_SHAPES:
        shape = dict(MODEL_SHAPES[name_or_path])
        config_class = type(AutoConfig.for_model(shape.pop("model_type")))
        return config_class(**shape), "shape shipped with agentic-grpo"
    raise ValueError(
        f"model `{name_or_path}` has no config here (not a local directory with config.json, not in the Hugging "
        f"Face cache) and no shipped shape: shipped shapes are {', '.join(MODEL_SHAPES)}; or point "
        "--model_name_or_path at a directory holding the model's config.json"
    )


@dataclass
class ModelFacts:
    """What the estimate needs of a model, counted on its meta-device build."""

    name: str
    source: str
    dtype: str
    parameters: int  # every parameter of the base model, tied ones once
    trainable: int  # the LoRA adapter's parameters, or `parameters` without LoRA
    trainable_dtype: str
    linear_parameters: int  # of the decoder's Linear layers: what 4/8-bit loading quantizes
    layer_parameters: int  # one decoder layer's
    head_parameters: int  # the LM head's (the embedding's when tied)
    hidden: int
    layers: int
    kv_dim: int  # key/value heads x head dimension
    intermediate: int
    vocab: int
    lora_dropout_features: int = 0  # input features of one layer's adapted modules, each a dropout copy


def model_facts(name_or_path: str, dtype: str | None, peft_config: Any = None, zero3: bool = False) -> ModelFacts:
    """Build the model on the meta device in `dtype` (None: the config's), apply `peft_config` (a PEFT config or
    None) as TRL does, and count its parameters. Nothing is allocated: a 7B model takes seconds."""
    import torch
    from transformers import AutoModelForCausalLM

    config, source = model_config(name_or_path)
    if dtype is None:
        dtype = str(getattr(config, "dtype", None) or "float32").removeprefix("torch.")
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype `{dtype}` is not one of {', '.join(DTYPE_BYTES)}")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    text = config.get_text_config()
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    layer = next(m for n, m in model.named_modules() if n.endswith("layers.0"))
    head = model.get_output_embeddings()
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head)
    facts = ModelFacts(
        name=name_or_path, source=source, dtype=dtype, parameters=sum(p.numel() for p in model.parameters()),
        trainable=0, trainable_dtype=dtype, linear_parameters=linear,
        layer_parameters=sum(p.numel() for p in layer.parameters()), head_parameters=head.weight.numel(),
        hidden=text.hidden_size, layers=text.num_hidden_layers, kv_dim=kv_heads * head_dim,
        intermediate=text.intermediate_size, vocab=text.vocab_size,
    )  # fmt: skip
    if peft_config is None:
        facts.trainable = facts.parameters
        return facts
    from peft import get_peft_model
    from peft.tuners.lora import LoraLayer

    # TRL keeps the adapter in the base dtype under ZeRO-3 and lets PEFT upcast it to fp32 otherwise.
    model = get_peft_model(model, peft_config, autocast_adapter_dtype=not zero3)
    trained = [p for p in model.parameters() if p.requires_grad]
    facts.trainable = sum(p.numel() for p in trained)
    facts.trainable_dtype = str(trained[0].dtype).removeprefix("torch.") if trained else dtype
    if getattr(peft_config, "lora_dropout", 0.0) > 0:
        layer = next(m for n, m in model.named_modules() if n.endswith("layers.0"))
        facts.lora_dropout_features = sum(m.in_features for m in layer.modules() if isinstance(m, LoraLayer))
    return facts


@dataclass
class Launch:
    """How many processes train and what they shard: `single`, `ddp`, `zero1`-`zero3` or `fsdp`."""

    processes: int = 1
    strategy: str = "single"
    offload_optimizer: bool = False
    offload_params: bool = False
    source: str = "no accelerate config"

    @property
    def shards_optimizer(self) -> bool:
        return self.strategy in ("zero1", "zero2", "zero3", "fsdp")

    @property
    def shards_gradients(self) -> bool:
        return self.strategy in ("zero2", "zero3", "fsdp")

    @property
    def shards_parameters(self) -> bool:
        return self.strategy in ("zero3", "fsdp")


def launch_from_accelerate_config(path: Path, processes: int | None = None) -> Launch:
    """The `Launch` an accelerate config file describes; `processes` overrides its `num_processes`."""
    import yaml

    config = yaml.safe_load(path.read_text()) or {}
    kind = str(config.get("distributed_type", "NO")).upper()
    deepspeed, fsdp = config.get("deepspeed_config") or {}, config.get("fsdp_config") or {}
    count = processes or int(config.get("num_processes", 1))
    stage = int(deepspeed.get("zero_stage", 0))
    if kind == "DEEPSPEED" and stage > 0:
        strategy = f"zero{stage}"
    elif kind == "FSDP":
        strategy = "fsdp"
    else:  # ZeRO-0 is DDP
        strategy = "ddp" if count > 1 else "single"
    # FSDP's offload moves the sharded parameters and, with them, their optimizer states.
    fsdp_offload = bool(fsdp.get("fsdp_offload_params"))
    return Launch(
        processes=count, strategy=strategy,
        offload_optimizer=str(deepspeed.get("offload_optimizer_device", "none")) != "none" or fsdp_offload,
        offload_params=str(deepspeed.get("offload_param_device", "none")) != "none" or fsdp_offload,
        source=path.name,
    )  # fmt: skip


@dataclass
class Part:
    """One part of the memory of a process: its size, when it is held, and how it was counted."""

    name: str
    bytes: float
    phase: str  # "always", "rollout" or "training"
    how: str


@dataclass
class MemoryEstimate:
    """The parts of one process's GPU memory and the card they must fit on."""

    parts: list[Part]
    card_gb: float
    notes: list[str] = field(default_factory=list)
    blockers: list[str] = field(default_factory=list)  # what stops the run whatever the total

    def add(self, name: str, size: float, phase: str, how: str) -> None:
        self.parts.append(Part(name, size, phase, how))

    def part(self, name: str) -> Part:
        return next(p for p in self.parts if p.name == name)

    def phase_bytes(self, phase: str) -> float:
        """What is held at the height of `phase` (`rollout` or `training`): that phase's parts and the lasting ones."""
        return sum(p.bytes for p in self.parts if p.phase in ("always", phase))

    @property
    def peak_phase(self) -> str:
        return max(("rollout", "training"), key=self.phase_bytes)

    @property
    def peak(self) -> float:
        return self.phase_bytes(self.peak_phase)

    @property
    def fits(self) -> bool:
        return self.peak <= self.card_gb * GIB and not self.blockers

    def biggest(self) -> Part:
        """The largest part held at the peak."""
        return max((p for p in self.parts if p.phase in ("always", self.peak_phase)), key=lambda p: p.bytes)


def activation_bytes_per_token(facts: ModelFacts, checkpointing: bool) -> float:
    """Bytes the backward pass keeps per token of a microbatch (SDPA/flash attention: no sequence^2 term)."""
    h, kv, inter = facts.hidden, facts.kv_dim, facts.intermediate
    # One decoder layer: two RMSNorm inputs upcast to fp32 (8h); in bf16 the two norm outputs, q/k/v, the attention
    # output and its contiguous copy (2 x 5h + 4kv); gate, up, silu(gate) and their product (2 x 4I).
    layer = 18 * h + 4 * kv + 8 * inter
    layer += 3 * facts.lora_dropout_features  # each adapter's dropout copy of its input (bf16) and its mask (bool)
    gradient_buffers = 2 * 2 * h  # the hidden-state gradients flowing back through the residual stream
    if checkpointing:  # every layer keeps only its input; one layer at a time is recomputed in full
        return facts.layers * 2 * h + layer + gradient_buffers
    return facts.layers * layer + gradient_buffers


def estimate(
    config: Any, facts: ModelFacts, launch: Launch, card_gb: float, prompt_tokens: int, quantized_bits: int | None
) -> MemoryEstimate:
    """The parts of one process's peak for a parsed recipe (`AgenticGRPOConfig`) on `launch`."""
    result = MemoryEstimate([], card_gb)
    context = prompt_tokens + config.max_completion_length
    trainable_bytes = _lasting_parts(result, config, facts, launch, quantized_bits)
    _rollout_parts(result, config, facts, launch, context)
    _training_parts(result, config, facts, launch, context, trainable_bytes)
    return result


def _lasting_parts(
    result: MemoryEstimate, config: Any, facts: ModelFacts, launch: Launch, quantized_bits: int | None
) -> int:
    """Weights, adapter, optimizer state, reference model and CUDA context; returns bytes per trainable parameter."""
    per_param, lora = DTYPE_BYTES[facts.dtype], facts.trainable != facts.parameters
    params = launch.processes if launch.shards_parameters else 1
    weights = facts.parameters * per_param
    how = f"{facts.parameters / 1e9:.2f}e9 x {per_param} bytes ({facts.dtype})"
    if quantized_bits:
        weights -= facts.linear_parameters * (per_param - quantized_bits / 8)
        how += f", decoder Linear layers in {quantized_bits}-bit"
    trainable_bytes = DTYPE_BYTES[facts.trainable_dtype]
    if launch.strategy == "fsdp" and not lora:  # accelerate upcasts trainable parameters to fp32 under FSDP
        weights, trainable_bytes, how = facts.parameters * 4, 4, how + " upcast to fp32 by accelerate's FSDP"
    if launch.offload_params:
        weights, how = 0, how + ", offloaded to CPU"
    result.add("weights", weights / params, "always", how + _split(params))
    if lora:
        size = facts.trainable * trainable_bytes / params
        how = f"{facts.trainable / 1e6:.1f}M x {trainable_bytes} bytes ({facts.trainable_dtype})"
        result.add("LoRA adapter", size, "always", how + _split(params))

    shards = launch.processes if launch.shards_optimizer else 1
    if launch.offload_optimizer:
        optimizer, how = 0.0, "offloaded to CPU"
    elif launch.strategy.startswith("zero"):  # DeepSpeed keeps an fp32 master copy beside AdamW's two fp32 states
        optimizer, how = facts.trainable * 12.0, "fp32 master + 2 fp32 AdamW states per trainable parameter"
    else:  # torch's AdamW keeps its two states in the parameter's dtype
        optimizer, how = facts.trainable * 2.0 * trainable_bytes, f"2 AdamW states x {trainable_bytes} bytes"
    result.add("optimizer state", optimizer / shards, "always", how + _split(shards))
    if config.beta != 0 and not lora:
        how = f"a frozen copy for the KL (beta {config.beta})"
        result.add("reference model", facts.parameters * per_param / params, "always", how + _split(params))
    result.add("CUDA context", CUDA_CONTEXT_GIB * GIB, "always", "context, library workspaces, allocator slack")
    if launch.shards_parameters:  # FSDP2 and ZeRO-3 unshard a layer at a time (and prefetch the next) per forward
        gathered = (2 * facts.layer_parameters + facts.head_parameters) * per_param
        result.add("gathered layers", gathered, "always", "two decoder layers and the LM head, unsharded")
    return trainable_bytes


def _rollout_parts(result: MemoryEstimate, config: Any, facts: ModelFacts, launch: Launch, context: int) -> None:
    """vLLM's share (colocate) or the KV cache of HF generate, for every row a process rolls out."""
    per_param = DTYPE_BYTES[facts.dtype]
    rows = config.per_device_train_batch_size * config.steps_per_generation
    kv_bytes = rows * context * facts.layers * 2 * facts.kv_dim * per_param
    full_weights = facts.parameters * per_param
    if config.use_vllm and config.vllm_mode == "colocate":
        share = config.vllm_gpu_memory_utilization * result.card_gb * GIB
        sleeps = bool(config.vllm_enable_sleep_mode)
        how = f"vllm_gpu_memory_utilization {config.vllm_gpu_memory_utilization} x {result.card_gb:g} GB; "
        how += "asleep while training" if sleeps else "held while training too (no sleep mode)"
        result.add("vLLM (colocate)", share, "rollout" if sleeps else "always", how)
        # With tensor parallelism 1, every process's engine holds the whole model, whatever the trainer shards.
        cache = share - full_weights - CUDA_CONTEXT_GIB * GIB
        if cache <= 0:
            result.blockers.append(
                f"vLLM's share ({share / GIB:.1f} GiB) cannot hold the model's {full_weights / GIB:.1f} GiB of "
                "weights and its context: raise vllm_gpu_memory_utilization"
            )
        elif cache < kv_bytes:
            result.notes.append(
                f"vLLM's share leaves {cache / GIB:.1f} GiB for the KV cache, less than the {kv_bytes / GIB:.1f} GiB "
                f"of all {rows} rollout rows at {context} tokens: vLLM queues the rest (slower, not a failure)"
            )
        return
    if config.use_vllm:
        result.notes.append("vLLM in server mode runs on other GPUs: nothing of it is counted here")
    how = f"{rows} rows x {context} tokens x {facts.layers} layers x 2 x {facts.kv_dim} x {per_param} bytes"
    result.add("KV cache (generate)", kv_bytes, "rollout", how)
    if launch.strategy == "zero3" and config.ds3_gather_for_generation:
        how = "ZeRO-3 gathers the whole model for generate (ds3_gather_for_generation)"
        result.add("gathered weights (generate)", full_weights * (1 - 1 / launch.processes), "rollout", how)


def _training_parts(
    result: MemoryEstimate, config: Any, facts: ModelFacts, launch: Launch, context: int, trainable_bytes: int
) -> None:
    """Gradients, activations and logits of one microbatch's forward and backward."""
    shards = launch.processes if launch.shards_gradients else 1
    how = f"one per trainable parameter, {trainable_bytes} bytes" + _split(shards)
    result.add("gradients", facts.trainable * trainable_bytes / shards, "training", how)
    if launch.strategy == "ddp":  # without `gradient_as_bucket_view` (off by default) DDP's buckets are a second copy
        how = "DDP's all-reduce buckets, a copy of the gradients"
        result.add("DDP gradient buckets", facts.trainable * trainable_bytes, "always", how)
    batch = config.per_device_train_batch_size
    per_token = activation_bytes_per_token(facts, bool(config.gradient_checkpointing))
    how = f"{batch} x {context} tokens x {per_token / 1024:.0f} KiB"
    how += " (checkpointed)" if config.gradient_checkpointing else " (no gradient checkpointing)"
    result.add("activations", batch * context * per_token, "training", how)
    scored = batch * config.max_completion_length
    tile = min(scored, LOGIT_TILE[0]) * min(facts.vocab, LOGIT_TILE[1]) * 4
    how = "TRL's fused LM head, chunked: 2 fp32 tiles of <=4096 tokens x 32768 vocabulary columns, and the scored "
    result.add("logits", 2 * tile + scored * facts.hidden * 2 * 2, "training", how + "hidden states")


def _split(ways: int) -> str:
    return f", / {ways} processes" if ways > 1 else ""
