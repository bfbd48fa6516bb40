"""Shared fixtures: a tiny random Llama with a real BPE tokenizer, and a scripted generation backend."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long runs on a real model (pytest -m slow)")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    from agentic_grpo.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)
