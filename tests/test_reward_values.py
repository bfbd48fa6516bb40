"""What a reward may return: one finite number or None per completion. Anything else stops the run naming the
reward and the value, before TRL turns it into a tensor (or, under `on_reward_error: none`, that batch gets None);
a reward that never scores is reported; a row without the gold value a reward needs is refused at start-up."""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest
import torch
from datasets import Dataset

from agentic_grpo.advantages import RewardValueError, checking_values
from agentic_grpo.reward_setup import check_reward_values_present, guard_rewards
from agentic_grpo.trainer import AgenticGRPOTrainer
from tests.scripted import ScriptedBackend, case_prompt
from tests.trainer_support import SCRIPTS, config, exact


def returning(*values):
    def reward(prompts, completions, **_):
        return list(values)

    return reward


@pytest.mark.parametrize("value", ["0.5", float("nan"), float("inf"), [1.0], {"score": 1}, object()])
def test_a_value_that_is_not_a_finite_number_or_none_is_refused_naming_the_reward(value):
    reward = checking_values(returning(1.0, value))
    with pytest.raises(RewardValueError, match=r"reward `reward` returned .* for completion 1: a reward returns"):
        reward(prompts=["p", "q"], completions=["a", "b"])


def test_numbers_of_every_kind_and_none_pass_unchanged():
    values = [1, 0.5, True, np.float32(0.25), torch.tensor(2.0), None]
    assert checking_values(returning(*values))(prompts=["p"] * 6, completions=["c"] * 6) == values


def test_a_list_of_the_wrong_length_or_no_list_is_refused():
    with pytest.raises(RewardValueError, match=r"returned a list of 1: .* one value per completion \(2\)"):
        checking_values(returning(1.0))(prompts=["p", "q"], completions=["a", "b"])

    def scalar(prompts, completions, **_):
        return 1.0

    with pytest.raises(RewardValueError, match="returned a float"):
        checking_values(scalar)(prompts=["p"], completions=["a"])


def test_an_async_reward_is_checked_too():
    async def judge(prompts, completions, **_):
        return ["good"] * len(completions)

    with pytest.raises(RewardValueError, match="`judge` returned 'good'"):
        asyncio.run(checking_values(judge)(prompts=["p"], completions=["a"]))


def test_a_reward_that_never_scores_is_logged_once_and_reported_at_the_end(caplog):
    silent = guard_rewards([returning(None, None)], "raise")[0]
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            silent(prompts=["p", "q"], completions=["a", "b"])
    assert sum("scored none of the 2 completions" in r.message for r in caplog.records) == 1
    assert silent.scoring_summary() == "reward `reward` never scored: it returned None for all 6 completions"
    partly = guard_rewards([returning(None, 1.0)], "none")[0]  # the summary goes through the error guard
    partly(prompts=["p", "q"], completions=["a", "b"])
    assert partly.scoring_summary() is None


def test_a_bad_value_stops_a_real_step_naming_the_reward_or_gives_none_under_on_reward_error_none(
    tiny_model_dir, tmp_path
):
    def verdict(prompts, completions, **_):
        return ["correct"] * len(completions)

    rows = [{"prompt": case_prompt(name), "question": name, "answer": "42"} for name in SCRIPTS]
    for mode in ("raise", "none"):
        trainer = AgenticGRPOTrainer(model=tiny_model_dir, reward_funcs=[exact, verdict],
                                     args=config(tmp_path / mode, on_reward_error=mode),
                                     train_dataset=Dataset.from_list(rows))  # fmt: skip
        trainer.generation_backend = ScriptedBackend(trainer.processing_class, SCRIPTS)
        if mode == "raise":
            with pytest.raises(RewardValueError, match="reward `verdict` returned 'correct' for completion 0"):
                trainer.generate_and_score(rows * 2)
        else:
            trainer.generate_and_score(rows * 2)  # the batch scored by `exact` alone, `verdict` None


def test_rows_without_the_gold_value_a_reward_needs_are_refused_at_start_up():
    def correctness(prompts, completions, answer, **_):
        return [1.0] * len(completions)

    rows = Dataset.from_list([{"question": "a", "answer": "1"}, {"question": "b", "answer": None}])
    with pytest.raises(ValueError, match=r"`correctness` needs column `answer`, which is empty in 1 row\(s\) of the "
                                         r"training data \(the first: \{'question': 'b', 'answer': None\}\)"):  # fmt: skip
        check_reward_values_present([correctness], rows, "training data")

    def lenient(prompts, completions, answer=None, **_):  # a parameter with a default is not required
        return [1.0] * len(completions)

    check_reward_values_present([lenient], rows, "training data")
