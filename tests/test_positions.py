"""Every read of a trajectory numbers positions from the attention mask, as the sampler does.

On a model with absolute position embeddings (a tiny random GPT-2 built from a config), TRL's own read scores a
left-padded row at shifted positions; the trainer's read scores it exactly as the same row alone, through the
whole-row read and the read-prompt-once read, and as HF `generate` sampled it.
"""

from __future__ import annotations

import pytest
import torch
from trl import GRPOTrainer

from tests.helpers import build_trainer
from tests.scripted import case_prompt


@pytest.fixture(scope="module")
def trainer(gpt2_dir, tmp_path_factory):
    rows = [{"prompt": case_prompt("a"), "question": "a", "answer": "1"}] * 4
    built = build_trainer(gpt2_dir, tmp_path_factory.mktemp("out"), [lambda trajectory, **_: [0.0] * len(trajectory)],
                          rows, environment="agentic_grpo.tools.calculator:Calculator")  # fmt: skip
    built.model.eval()
    return built


def left_padded(rows: list[list[int]], pad: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for r, row in enumerate(rows):
        ids[r, width - len(row) :] = torch.tensor(row)
        mask[r, width - len(row) :] = 1
    return ids.to(device), mask.to(device)


PROMPT_SHORT, PROMPT_LONG = list(range(10, 18)), list(range(30, 50))
COMPLETIONS = [list(range(60, 66)), list(range(70, 76)), list(range(80, 86))]
ROWS = [PROMPT_SHORT + COMPLETIONS[0], PROMPT_SHORT + COMPLETIONS[1], PROMPT_LONG + COMPLETIONS[2]]
KEEP = len(COMPLETIONS[0])


def alone(trainer, row: list[int]) -> torch.Tensor:
    ids = torch.tensor([row], device=trainer.model.device)
    return trainer._get_per_token_logps_and_entropies(trainer.model, ids, torch.ones_like(ids), KEEP)[0][0]


@pytest.mark.parametrize("read_prompt_once", [False, True])
@torch.no_grad()
def test_a_left_padded_row_is_scored_as_the_same_row_alone(trainer, read_prompt_once):
    trainer.args.read_prompt_once = read_prompt_once
    ids, mask = left_padded(ROWS, trainer.processing_class.pad_token_id, trainer.model.device)
    batch = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, KEEP)[0]
    for r, row in enumerate(ROWS):
        assert torch.allclose(batch[r], alone(trainer, row), atol=1e-5), r
    # The bug this guards against: TRL's own read, without positions, shifts the padded rows.
    shifted = GRPOTrainer._get_per_token_logps_and_entropies(trainer, trainer.model, ids, mask, KEEP)[0]
    assert (shifted[0] - alone(trainer, ROWS[0])).abs().max() > 1e-2


@torch.no_grad()
def test_the_trainer_scores_what_generate_sampled_with_the_sampler_s_log_probs(trainer):
    model = trainer.model
    ids, mask = left_padded([PROMPT_SHORT, PROMPT_LONG], trainer.processing_class.pad_token_id, model.device)
    torch.manual_seed(0)
    out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, max_new_tokens=KEEP, min_new_tokens=KEEP,
                         output_logits=True, return_dict_in_generate=True, pad_token_id=trainer.processing_class.pad_token_id)  # fmt: skip
    new = out.sequences[:, ids.shape[1] :]
    raw = torch.stack(out.logits, dim=1)  # before top-k: the distribution the trainer's log-probs are over
    sampled = raw.log_softmax(-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
    full_mask = torch.cat([mask, torch.ones_like(new)], dim=1)
    trainer.args.read_prompt_once = False
    scored = trainer._get_per_token_logps_and_entropies(model, out.sequences, full_mask, KEEP)[0]
    assert torch.allclose(scored, sampled, atol=1e-4)
