"""Shared fixtures: a tiny random Llama with a real BPE tokenizer. The markers (`slow`, `integration`) are
registered in pyproject.toml; what test modules share besides fixtures is in tests/helpers.py."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    from agentic_grpo.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def gpt2_dir(tiny_model_dir, tmp_path_factory) -> str:
    """A tiny random GPT-2 (absolute positions) with the tiny Llama's tokenizer."""
    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=len(tokenizer), n_positions=512, n_embd=32, n_layer=2, n_head=2,
        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    target = tmp_path_factory.mktemp("gpt2")
    GPT2LMHeadModel(config).save_pretrained(target)
    tokenizer.save_pretrained(target)
    return str(target)
