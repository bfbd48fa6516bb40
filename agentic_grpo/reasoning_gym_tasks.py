"""reasoning-gym tasks as a recipe's data: train and test rows that never share a question.

reasoning-gym (`pip install reasoning-gym`) generates 100+ procedural tasks offline, each
with its own verifier (`score_answer`). A recipe names one:

    dataset: {reasoning_gym: products, config: {min_digits: 3, max_digits: 3}, num_train: 2000, num_test: 100, seed: 0}

and `agentic-grpo eval --data reasoning_gym:products` evaluates on the same test split
(`reasoning_gym:products?min_digits=3&max_digits=3&seed=0` to set the config).

The test split is drawn first (seed `seed`, public and fixed, so held-out figures stay
comparable across runs); the training split comes from another seed (`train_seed`, a
per-run secret in a recipe unless it sets one: `agentic_grpo.data.with_training_seed`)
and skips every question the test split holds, so no size or seed can leak a test
question into training. Each row keeps the task's entry (`rg_entry`, JSON) so the task's
own verifier can score it (`agentic_grpo.rewards.reasoning_gym:TaskScore`).
"""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

import yaml

# reasoning-gym's seed of the training split is `train_seed + this`: another stream than the test split's even
# when train_seed == seed (which draws the training rows of versions that had no train_seed).
TRAIN_SEED_OFFSET = 1_000_003
DATASET_KEYS = ("reasoning_gym", "config", "num_train", "num_test", "seed", "train_seed")


def _create(name: str, seed: int, size: int, config: dict[str, Any]) -> Any:
    try:
        import reasoning_gym
    except ImportError as exc:
        raise ValueError("recipe `dataset` names a reasoning-gym task: pip install reasoning-gym") from exc
    try:
        return reasoning_gym.create_dataset(name, seed=seed, size=size, **config)
    except (ValueError, TypeError, AssertionError) as exc:
        raise ValueError(
            f"reasoning-gym task `{name}` with config {config}: {exc} (the task's config fields are those of "
            f"its *Config class in reasoning_gym; names: reasoning_gym.factory.DATASETS)"
        ) from exc


def to_row(name: str, config: dict[str, Any], entry: dict[str, Any]) -> dict[str, Any]:
    """A dataset row: question, answer, and the entry and config the task's verifier needs (as JSON text)."""
    answer = entry.get("answer")
    return {
        "question": str(entry["question"]),
        "answer": "" if answer is None else str(answer),
        "rg_task": name,
        "rg_config": json.dumps(config, sort_keys=True, default=list),
        "rg_entry": json.dumps(entry, default=list),
    }


def reasoning_gym_splits(
    reasoning_gym: str,
    config: dict[str, Any] | None = None,
    num_train: int = 1000,
    num_test: int = 100,
    seed: int = 0,
    train_seed: int | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Train and test rows of the task `reasoning_gym`, disjoint by question text.

    `seed` draws the test split, `train_seed` (default: `seed`) the training split.
    """
    config = dict(config or {})
    if num_train < 0 or num_test < 0:
        raise ValueError("recipe `dataset`: num_train and num_test must be >= 0")
    test_set = _create(reasoning_gym, seed, max(num_test, 1), config)
    test, seen = [], set()
    for index in range(num_test):
        entry = test_set[index]
        if entry["question"] not in seen:
            seen.add(entry["question"])
            test.append(to_row(reasoning_gym, config, entry))
    budget = 2 * num_train + 100  # room for the questions skipped as duplicates or test questions
    train_base = seed if train_seed is None else train_seed
    train_set = _create(reasoning_gym, train_base + TRAIN_SEED_OFFSET, max(budget, 1), config)
    train = []
    for index in range(budget):
        if len(train) == num_train:
            break
        entry = train_set[index]
        if entry["question"] not in seen:
            seen.add(entry["question"])
            train.append(to_row(reasoning_gym, config, entry))
    if len(train) < num_train:
        raise ValueError(
            f"reasoning-gym task `{reasoning_gym}` yields only {len(train)} distinct training questions apart from "
            f"the test split; lower num_train or widen the task's config"
        )
    return {"train": train, "test": test}


def parse_data_argument(text: str) -> tuple[str, dict[str, Any], int]:
    """`reasoning_gym:NAME[?key=value&...]` -> (name, config, seed); values are read as YAML (numbers, lists)."""
    name, _, query = text.removeprefix("reasoning_gym:").partition("?")
    if not name:
        raise ValueError("--data reasoning_gym:NAME needs a task name, e.g. reasoning_gym:products")
    config = {key: yaml.safe_load(value) for key, value in urllib.parse.parse_qsl(query, keep_blank_values=True)}
    seed = int(config.pop("seed", 0))
    return name, config, seed


def held_out_rows(text: str, size: int) -> list[dict[str, Any]]:
    """The test rows `--data reasoning_gym:NAME[?config]` names: the test split a recipe with that task and seed uses."""
    name, config, seed = parse_data_argument(text)
    return reasoning_gym_splits(name, config, num_train=0, num_test=size, seed=seed)["test"]
