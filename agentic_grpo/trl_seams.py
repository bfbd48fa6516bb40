"""The private TRL, transformers and PEFT names the trainer relies on, in one table a test checks.

`tests/test_trl_seams.py` compares each entry with the installed packages, so an upgrade that changes one fails
naming it instead of training wrong.
"""

from __future__ import annotations

# Every private TRL/transformers/PEFT name the trainer (with its mixins and layers, and the vLLM backend) overrides,
# calls, reads or writes: a method with its whole parameter list, or an attribute (no parameters) that the owner's
# class sets. `tests/test_trl_seams.py` compares them with the installed packages, so an upgrade that changes one
# fails naming it instead of training wrong; `SEAM_RETURNS` gives the tuple length a method's returns must have.
PRIVATE_SEAMS: dict[str, tuple[str, ...]] = {
    "GRPOTrainer._generate_and_score_completions": ("self", "inputs"),
    "GRPOTrainer._calculate_rewards": ("self", "inputs", "prompts", "completions", "completion_ids_list"),
    "GRPOTrainer._get_per_token_logps_and_entropies": (
        "self",
        "model",
        "input_ids",
        "attention_mask",
        "logits_to_keep",
        "batch_size",
        "compute_entropy",
        "compute_aux_loss",
        "pixel_values",
        "image_grid_thw",
        "num_images",
        "pixel_attention_mask",
        "spatial_shapes",
        "num_tiles",
        "image_sizes",
        "token_type_ids",
        "mm_token_type_ids",
        "image_position_ids",
    ),  # fmt: skip
    # TRL's loss of a batch, which co-trained roles call on their children (`agentic_grpo.experimental.role_loss`),
    # reading `tool_mask`, `num_items_in_batch` and the log-prob keys TRL's own batch has.
    "GRPOTrainer._compute_loss": ("self", "model", "inputs"),
    # {"train"|"eval": {name: [values]}}, written only by `log_metrics` and `metrics_under`; the engine helper whose
    # `summon_full_params` generation runs under with FSDP (`TrainerBackend`).
    "GRPOTrainer._metrics": (),
    "GRPOTrainer._dist": (),
    "Trainer._load_from_checkpoint": ("self", "resume_from_checkpoint", "model"),
    "Trainer._load_callback_state": ("self",),
    "Trainer._get_output_dir": ("self", "trial"),
    "GRPOTrainer._save_checkpoint": ("self", "model", "trial"),
    "GRPOTrainer._get_train_sampler": ("self", "dataset"),
    # Public, but the asynchronous layer relies on its contract: called once per optimizer step with the epoch's
    # iterator, it takes that step's batches (`agentic_grpo.async_rollouts` reads the next steps' ahead).
    "Trainer.get_batch_samples": ("self", "epoch_iterator", "num_batches", "device"),
    # TRL's colocated vLLM engine object (`vllm_backend`): the weights its sync sends (replaced for one sync), its
    # sleep flag (one sync per rollout), its ZeRO-3 gather helper, and its parameter-name mapping.
    "VLLMGeneration._iter_named_params": ("self",),
    "VLLMGeneration._llm_weights_sleeping": (),
    "VLLMGeneration._dist": (),
    "VLLMGeneration._fix_param_name_to_vllm": ("self", "name", "extra_prefixes"),
    # PEFT: whether the adapters are off (`chunked_logps` keys its cached reads on it).
    "PeftModel._adapters_disabled": (),
}
SEAM_RETURNS: dict[str, int] = {"GRPOTrainer._get_per_token_logps_and_entropies": 3}
