"""The token round-trip canary at start-up: the rollout's tokens of a scripted trajectory (a call, its observation,
an answer) must be the chat template's rendering of the same conversation.

Real tokenizers (the tiny model's ChatML one, edited per test), the real rollout manager's prompt and observation
code, each shipped format; each planted bug is a template or a wrapper that would train the policy on tokens it
never meets outside training, and must stop the trainer before it starts, naming the turn.
"""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from agentic_grpo.canaries import CanaryError
from agentic_grpo.formats import load_format
from agentic_grpo.models import CHATML_TEMPLATE
from agentic_grpo.rollout import RolloutLimits, RolloutManager
from agentic_grpo.token_round_trip import check_token_round_trip
from agentic_grpo.tools.calculator import Calculator
from tests.helpers import build_trainer

FORMATS = [("react", {}), ("react", {"response_prefix": "Thought:"}), ("tool_call", {}),
           ("artist", {"tool": "calculator", "response_prefix": "<think>"})]  # fmt: skip


def manager_for(tokenizer, fmt_name="tool_call", **kwargs) -> RolloutManager:
    return RolloutManager(Calculator, load_format(fmt_name, Calculator.tool_schemas(), **kwargs), tokenizer,
                          RolloutLimits())  # fmt: skip


@pytest.fixture
def chatml(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.mark.parametrize(("fmt_name", "kwargs"), FORMATS)
def test_every_shipped_format_round_trips_on_a_chatml_template(chatml, fmt_name, kwargs):
    check_token_round_trip(manager_for(chatml, fmt_name, **kwargs), chatml, [chatml.eos_token_id])


def test_a_template_whose_turns_end_without_eos_is_refused(chatml):
    chatml.chat_template = CHATML_TEMPLATE.replace("'<|im_end|>'", "'<|endoftext|>'")
    with pytest.raises(CanaryError, match=r"ends an assistant turn with '<\|endoftext\|>'.*does not stop generation"):
        check_token_round_trip(manager_for(chatml), chatml, [chatml.eos_token_id])


def test_an_observation_not_wrapped_as_the_template_wraps_it_is_named(chatml):
    manager = manager_for(chatml)
    manager.user_turn = ("\n", "\n")  # as if the wrapper had been read wrong from the template
    with pytest.raises(CanaryError, match=r"from token \d+, in turn 1 \(the observation\)"):
        check_token_round_trip(manager, chatml, [chatml.eos_token_id])


def test_a_template_that_rewrites_assistant_turns_is_named(chatml):
    # A changed template: assistant turns rendered with a label the model never writes.
    chatml.chat_template = CHATML_TEMPLATE.replace(
        "message['content']",
        "(('Assistant: ' + message['content']) if message['role'] == 'assistant' else message['content'])",
    )
    with pytest.raises(CanaryError, match=r"in turn 1 \(the model's tool call\).*the template 'Assistant:"):
        check_token_round_trip(manager_for(chatml, "react"), chatml, [chatml.eos_token_id])


def test_the_trainer_refuses_to_start(tiny_model_dir, tmp_path, monkeypatch):
    import agentic_grpo.rollout as rollout

    monkeypatch.setattr(rollout, "user_turn_wrapper", lambda tokenizer: ("\n", "\n"))
    rows = [{"prompt": "x", "question": "x", "answer": "1"}]
    with pytest.raises(CanaryError, match="turn 1 \\(the observation\\)"):
        build_trainer(tiny_model_dir, tmp_path, [lambda trajectory, **_: [0.0] * len(trajectory)], rows,
                      environment="agentic_grpo.tools.calculator:Calculator", format="tool_call")  # fmt: skip
