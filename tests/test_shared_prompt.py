"""Reading each distinct prompt once gives TRL's log-probs, entropies and gradients (tiny Llama, LoRA)."""

from __future__ import annotations

import pytest
import torch

from agentic_grpo.shared_prompt import shared_prompt_logps, shared_prompt_rows


@pytest.fixture()
def policy(tiny_model_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    add_fused_lm_head(model, temperature=0.7, outputs=("log_probs", "entropy"))
    model = get_peft_model(
        model, LoraConfig(r=4, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
    )
    return model.train()


def batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Six rows: two prompts (one left-padded) x three completions of different lengths (right-padded)."""
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(5, vocab, (9,), generator=generator), torch.randint(5, vocab, (6,), generator=generator)]
    ids, mask = [], []
    for index in range(6):
        prompt = prompts[index % 2]
        completion = torch.randint(5, vocab, (3 + index,), generator=generator)
        ids.append(torch.cat([torch.zeros(9 - len(prompt), dtype=torch.long), prompt, completion,
                              torch.zeros(8 - len(completion), dtype=torch.long)]))  # fmt: skip
        mask.append(torch.cat([torch.zeros(9 - len(prompt)), torch.ones(len(prompt) + len(completion)),
                               torch.zeros(8 - len(completion))]).long())  # fmt: skip
    return torch.stack(ids), torch.stack(mask), 8


def whole_rows(model, ids, mask, keep):
    """TRL 1.16's `_get_per_token_logps_and_entropies` on one chunk: every row read whole."""
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-keep] = -100
    out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    return out.log_probs[:, -keep:], out.entropy[:, -keep:]


def loss_and_grads(model, logps, mask, keep):
    completion_mask = mask[:, -keep:].float()
    loss = -(logps * completion_mask * torch.arange(1.0, 7.0)[:, None]).sum() / completion_mask.sum()
    model.zero_grad()
    loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}


def test_logps_entropies_and_gradients_equal_whole_row_reads(policy):
    ids, mask, keep = batch(policy.config.vocab_size)
    whole_logps, whole_entropy = whole_rows(policy, ids, mask, keep)
    whole_grads = loss_and_grads(policy, whole_logps, mask, keep)

    logps, entropy = shared_prompt_logps(policy, policy.config, ids, mask, keep, compute_entropy=True)
    grads = loss_and_grads(policy, logps, mask, keep)

    completion = mask[:, -keep:].bool()
    assert torch.allclose(logps[completion], whole_logps[completion], atol=1e-5)
    assert torch.allclose(entropy[completion], whole_entropy[completion], atol=1e-5)
    assert (logps[~completion] == 0).all()
    assert grads.keys() == whole_grads.keys()
    for name, grad in grads.items():
        assert grad.abs().max() > 0, name
        assert torch.allclose(grad, whole_grads[name], rtol=1e-4, atol=1e-6), name


def test_rows_with_distinct_prompts_are_left_to_whole_reads(policy):
    ids, mask, keep = batch(policy.config.vocab_size)
    first, inverse = shared_prompt_rows(ids, mask, ids.size(1) - keep - 1)
    assert sorted(first.tolist()) == [0, 1]
    assert (inverse[0::2] == inverse[0]).all() and (inverse[1::2] == inverse[1]).all() and inverse[0] != inverse[1]
    two = ids[:2], mask[:2]
    assert shared_prompt_rows(*two, ids.size(1) - keep - 1) is None
    assert shared_prompt_logps(policy, policy.config, *two, keep) is None


def test_trainer_loss_and_gradients_match_with_and_without_read_prompt_once(tiny_model_dir, tmp_path, monkeypatch):
    """Through the trainer's real loss (TRL's clipped GRPO loss, KL against the reference): the same loss and
    gradients whether each prompt is read per row or once per group; and the shared path is the one taken."""
    from agentic_grpo import chunked_logps
    from tests.helpers import scored_two_groups, trainer_loss_and_grads

    trainer, inputs = scored_two_groups(tiny_model_dir, tmp_path)
    whole_loss, whole_grads = trainer_loss_and_grads(trainer, inputs)
    reads = []
    real = chunked_logps.shared_prompt_logps
    monkeypatch.setattr(chunked_logps, "shared_prompt_logps", lambda *a, **k: reads.append(real(*a, **k)) or reads[-1])
    trainer.args.read_prompt_once = True
    loss, grads = trainer_loss_and_grads(trainer, inputs)

    assert len(reads) == 1 and reads[0] is not None
    assert torch.allclose(loss, whole_loss, atol=1e-6)
    assert grads.keys() == whole_grads.keys()
    for name, grad in grads.items():
        assert torch.allclose(grad, whole_grads[name], rtol=1e-3, atol=1e-6), name
