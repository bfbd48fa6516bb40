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
