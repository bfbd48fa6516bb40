"""The loss read in recomputed pieces of rows gives the whole read's log-probs, entropies and gradients, row for row,
and keeps only one piece's activations (tiny Llama, LoRA)."""

from __future__ import annotations

import pytest
import torch

from agentic_grpo import chunked_logps
from agentic_grpo.chunked_logps import row_pieces, row_tokens

ROWS = 7  # pieces of 3 rows end on a piece of 1: a boundary that drops or repeats a row changes the row count
KEEP = 8


def constant_reward(prompts, completions, **_):
    return [0.0] * len(prompts)


@pytest.fixture()
def trainer(tiny_model_dir, tmp_path):
    from peft import LoraConfig

    from tests.helpers import build_trainer

    rows = [{"prompt": [{"role": "user", "content": "What is 12 * 34?"}], "answer": "408"}] * ROWS
    torch.manual_seed(0)
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
    return build_trainer(tiny_model_dir, tmp_path, [constant_reward], rows, peft_config=lora, num_generations=ROWS,
                         per_device_train_batch_size=ROWS, save_trajectories_steps=0)  # fmt: skip


def batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`ROWS` rows: two prompts (one left-padded) in turn, each row with its own completion, of its own length
    (right-padded), so no two rows have the same log-probs."""
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(5, vocab, (9,), generator=generator), torch.randint(5, vocab, (6,), generator=generator)]
    ids, mask = [], []
    for index in range(ROWS):
        prompt = prompts[index % 2]
        completion = torch.randint(5, vocab, (2 + index,), generator=generator)
        ids.append(torch.cat([torch.zeros(9 - len(prompt), dtype=torch.long), prompt, completion,
                              torch.zeros(KEEP - len(completion), dtype=torch.long)]))  # fmt: skip
        mask.append(torch.cat([torch.zeros(9 - len(prompt)), torch.ones(len(prompt) + len(completion)),
                               torch.zeros(KEEP - len(completion))]).long())  # fmt: skip
    return torch.stack(ids), torch.stack(mask)


def loss_read(trainer, ids, mask, budget, shared):
    """The trainer's loss read of the rows with `loss_chunk_tokens=budget`, and the LoRA gradients of a loss that
    weighs each row differently (a row read in another's place changes them)."""
    trainer.loss_chunk_tokens, trainer.args.read_prompt_once = budget, shared
    trainer.model.zero_grad()
    with trainer.loss_read():
        logps, entropies, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, mask, KEEP, compute_entropy=True
        )
    weights = torch.arange(1.0, ids.size(0) + 1.0, device=ids.device)[:, None]
    ((logps + 0.1 * entropies) * mask[:, -KEEP:] * weights).sum().backward()
    grads = {name: p.grad.clone() for name, p in trainer.model.named_parameters() if p.grad is not None}
    return logps.detach(), entropies.detach(), grads


def counting_pieces(monkeypatch) -> list[int]:
    """Counts the pieces read with their activations dropped (recomputed in backward)."""
    count = [0]
    real = chunked_logps.recomputed

    def counted(*args, **kwargs):
        count[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(chunked_logps, "recomputed", counted)
    return count


def budgets(ids: torch.Tensor, shared: bool) -> list[int]:
    """One row (and one prompt) per piece, and three rows per piece (3, 3, 1)."""
    width = ids.size(1)
    per_row = row_tokens(KEEP + 1, width) if shared else row_tokens(width, width)
    return [1, 3 * per_row]


@pytest.mark.parametrize("shared", [False, True], ids=["rows-whole", "prompt-once"])
def test_pieces_give_the_whole_reads_logps_entropies_and_gradients(trainer, monkeypatch, shared):
    ids, mask = (t.to(trainer.model.device) for t in batch(trainer.model.config.vocab_size))
    whole_logps, whole_entropies, whole_grads = loss_read(trainer, ids, mask, None, shared)
    completion = mask[:, -KEEP:].bool()
    for budget in budgets(ids, shared):
        pieces = counting_pieces(monkeypatch)
        logps, entropies, grads = loss_read(trainer, ids, mask, budget, shared)
        assert pieces[0] >= 2, budget  # the microbatch was read in recomputed pieces
        assert logps.shape == whole_logps.shape
        torch.testing.assert_close(logps[completion], whole_logps[completion], atol=1e-6, rtol=0)
        torch.testing.assert_close(entropies[completion], whole_entropies[completion], atol=1e-6, rtol=0)
        assert (logps[~completion] == 0).all()
        assert grads.keys() == whole_grads.keys() and grads
        for name, grad in grads.items():
            assert grad.abs().max() > 0, name
            torch.testing.assert_close(grad, whole_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def read_logps(trainer, ids, mask, budget, shared):
    trainer.loss_chunk_tokens, trainer.args.read_prompt_once = budget, shared
    with trainer.loss_read():
        return trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, KEEP)[0].detach()


def rows_match_their_own_reads(trainer, ids, mask, budget, shared) -> bool:
    """Whether each row of the pieced read is that row's log-probs, read alone: a piece boundary that dropped,
    repeated or reordered a row fails this."""
    logps = read_logps(trainer, ids, mask, budget, shared)
    if logps.size(0) != ids.size(0):
        return False
    completion = mask[:, -KEEP:].bool()
    for row in range(ids.size(0)):
        alone = read_logps(trainer, ids[row : row + 1], mask[row : row + 1], None, False)
        if not torch.allclose(logps[row][completion[row]], alone[0][completion[row]], atol=1e-6, rtol=0):
            return False
    return True


@pytest.mark.parametrize("shared", [False, True], ids=["rows-whole", "prompt-once"])
def test_each_row_is_read_once_in_order(trainer, monkeypatch, shared):
    ids, mask = (t.to(trainer.model.device) for t in batch(trainer.model.config.vocab_size))
    budget = budgets(ids, shared)[1]
    assert rows_match_their_own_reads(trainer, ids, mask, budget, shared)
    # The check fails on a boundary that repeats a row, one that drops one, and one that swaps pieces.
    repeats, drops, swaps = (
        [slice(0, 3), slice(2, 5), slice(5, 7)], [slice(0, 3), slice(4, 7)], [slice(3, 6), slice(0, 3), slice(6, 7)],
    )  # fmt: skip
    for cuts in (repeats, drops, swaps):
        monkeypatch.setattr(chunked_logps, "row_pieces", lambda rows, per_row, budget, cuts=cuts: cuts if rows == ROWS
                            else [slice(0, rows)])  # fmt: skip
        assert not rows_match_their_own_reads(trainer, ids, mask, budget, shared), cuts


@pytest.mark.parametrize("rows", [1, 2, 7, 16])
@pytest.mark.parametrize("per_row", [1, 5, 40])
@pytest.mark.parametrize("budget", [None, 0, 1, 39, 40, 41, 100, 10_000])
def test_row_pieces_cover_every_row_once_in_order(rows, per_row, budget):
    pieces = row_pieces(rows, per_row, budget)
    assert [row for piece in pieces for row in range(rows)[piece]] == list(range(rows))
    most = rows if not budget else max(1, budget // per_row)
    assert all(1 <= piece.stop - piece.start <= most for piece in pieces)


def saved_bytes(trainer, ids, mask, budget, shared) -> int:
    """Bytes autograd keeps for the backward of the loss read (what a recomputed piece keeps is its inputs alone)."""
    trainer.loss_chunk_tokens, trainer.args.read_prompt_once = budget, shared
    storages: dict[int, int] = {}

    def pack(tensor):
        storages[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor), trainer.loss_read():
        trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, KEEP, compute_entropy=True)
    parameters = {p.untyped_storage().data_ptr() for p in trainer.model.parameters()}
    return sum(size for pointer, size in storages.items() if pointer not in parameters)


@pytest.mark.parametrize("shared", [False, True], ids=["rows-whole", "prompt-once"])
def test_pieces_keep_one_pieces_activations(trainer, shared):
    ids, mask = (t.to(trainer.model.device) for t in batch(trainer.model.config.vocab_size))
    ids, mask = ids.repeat(4, 1), mask.repeat(4, 1)  # 28 rows: the activations dwarf the tiny model's weights
    whole = saved_bytes(trainer, ids, mask, None, shared)
    pieces = saved_bytes(trainer, ids, mask, 1, shared)  # one row per piece: the last row's activations are kept
    assert pieces < whole / 8, (pieces, whole)


def test_a_backward_under_another_adapter_refuses_to_recompute(trainer):
    ids, mask = (t.to(trainer.model.device) for t in batch(trainer.model.config.vocab_size))
    trainer.loss_chunk_tokens = 1
    with trainer.loss_read():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, KEEP)
    with trainer.model.disable_adapter(), pytest.raises(RuntimeError, match="another adapter"):
        logps.sum().backward()


def test_trainer_loss_and_gradients_equal_with_and_without_pieces(tiny_model_dir, tmp_path, monkeypatch):
    """Through TRL's loss (clipped GRPO, the entropy quantile taken over the whole microbatch, KL against the
    reference): the same loss and gradients whether the microbatch is read whole or in recomputed pieces."""
    from tests.helpers import scored_two_groups, trainer_loss_and_grads

    trainer, inputs = scored_two_groups(tiny_model_dir, tmp_path, top_entropy_quantile=0.5, read_prompt_once=True)

    def read_with(budget):
        trainer.loss_chunk_tokens = budget
        return trainer_loss_and_grads(trainer, inputs)

    whole_loss, whole_grads = read_with(None)
    width, tail = inputs["prompt_ids"].size(1) + inputs["completion_ids"].size(1), inputs["completion_ids"].size(1) + 1
    for budget in (1, 3 * row_tokens(tail, width)):  # one row per piece; three rows per piece (3, 3, 2)
        pieces = counting_pieces(monkeypatch)
        loss, grads = read_with(budget)
        assert pieces[0] >= 3, budget
        torch.testing.assert_close(loss, whole_loss, atol=1e-6, rtol=0)
        assert grads.keys() == whole_grads.keys()
        for name, grad in grads.items():
            torch.testing.assert_close(grad, whole_grads[name], rtol=1e-3, atol=1e-6, msg=name)


@pytest.mark.parametrize("shared", [False, True], ids=["rows-whole", "prompt-once"])
def test_a_row_longer_than_a_piece_reads_its_prompt_in_pieces_of_columns(trainer, monkeypatch, shared):
    """One row per piece is still more than the budget: the prompts are read a few columns at a time, each piece on
    the keys and values of the columns before it (the left-padded prompt's first pieces are all padding)."""
    from agentic_grpo import shared_prompt

    ids, mask = (t.to(trainer.model.device) for t in batch(trainer.model.config.vocab_size))
    whole_logps, whole_entropies, whole_grads = loss_read(trainer, ids, mask, None, shared)
    pieces = []
    real = shared_prompt.read_prompts
    monkeypatch.setattr(chunked_logps, "read_prompts", lambda *a, **k: pieces.append(len(a[4])) or real(*a, **k))
    head = ids.size(1) - KEEP - 1
    budget = head // 2  # a prompt is more than a piece: three pieces of columns or so
    logps, entropies, grads = loss_read(trainer, ids, mask, budget, shared)
    assert max(pieces) >= 2, pieces  # a piece read on the two before it
    completion = mask[:, -KEEP:].bool()
    torch.testing.assert_close(logps[completion], whole_logps[completion], atol=1e-6, rtol=0)
    torch.testing.assert_close(entropies[completion], whole_entropies[completion], atol=1e-6, rtol=0)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, whole_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_an_engine_wrapped_model_is_read_whole(trainer, monkeypatch):
    """Under DDP, DeepSpeed or FSDP a replay would run the engine's forward inside the backward: no pieces there."""
    from accelerate.utils import DistributedType

    ids, mask = (t.to(trainer.model.device) for t in batch(trainer.model.config.vocab_size))
    whole_logps, _, _ = loss_read(trainer, ids, mask, None, True)
    monkeypatch.setattr(trainer.accelerator.state, "distributed_type", DistributedType.MULTI_GPU)
    pieces = counting_pieces(monkeypatch)
    logps, _, _ = loss_read(trainer, ids, mask, 1, True)
    assert pieces[0] == 0
    torch.testing.assert_close(logps, whole_logps, atol=1e-6, rtol=0)
