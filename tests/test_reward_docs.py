"""docs/rewards.md's worked example, run as written: the page's Python becomes a plug-in module, its YAML the
recipe's rewards; the column the reward needs is found and checked, and it scores trajectories as the page says."""

from __future__ import annotations

import re
import sys

import pytest
import yaml

from agentic_grpo.reward_setup import build_rewards, check_reward_columns, required_columns
from agentic_grpo.trajectory import Segment, ToolCall, ToolResult, Trajectory
from tests.helpers import ROOT

PAGE = (ROOT / "docs" / "rewards.md").read_text()


def block(language: str) -> str:
    return re.search(rf"```{language}\n(.*?)```", PAGE, re.S).group(1)


@pytest.fixture
def rewards(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(block("python"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_rewards", raising=False)
    return build_rewards(yaml.safe_load(block("yaml"))["rewards"])


def trajectory(answer: str | None, calls: int) -> Trajectory:
    t = Trajectory(prompt=[{"role": "user", "content": "q"}], segments=[Segment("prompt", [1], "q")])
    t.tool_calls = [(ToolCall("calculator", {"expression": "2 * 3"}), ToolResult(output="6"))] * calls
    t.final_answer = answer
    return t


def test_the_pages_example_builds_needs_its_column_and_scores_as_the_page_says(rewards):
    funcs, weights = rewards
    efficiency = funcs[1]
    assert weights == [1.0, 0.5] and efficiency.__name__ == "ToolEfficiency" and efficiency.cost == 0.2
    assert required_columns(efficiency) == ["answer"]
    with pytest.raises(ValueError, match=r"reward `ToolEfficiency` needs column\(s\) \['answer'\]"):
        check_reward_columns([efficiency], ["question"], "training data")
    batch = [trajectory("6", 1), trajectory("6", 3), trajectory("7", 1), trajectory("6", 0)]
    scores = efficiency(completions=[[{"role": "assistant", "content": ""}]] * 4, trajectory=batch,
                        answer=["6"] * 4, prompts=["q"] * 4)  # fmt: skip
    assert scores == [1.0, pytest.approx(0.6), 0.0, None]
