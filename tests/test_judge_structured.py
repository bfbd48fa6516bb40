"""The judge asks for output constrained to the score's JSON schema, falls back to free text when the server
refuses, keeps every raw reply with its trajectory, and warns when it scores too little."""

# Fixtures come from tests/judge_fixtures.py (conftest.py is shared): importing them reads as a redefinition.
# ruff: noqa: F401, F811

import asyncio
import json
import logging
from pathlib import Path

from agentic_grpo.rewards.judge import LLMJudge
from agentic_grpo.rewards.judge_parsing import parse_score, score_schema
from agentic_grpo.train import summary
from tests.judge_fixtures import FaultProxy, proxy, reward_inputs


def judge_for(proxy: FaultProxy, **overrides) -> LLMJudge:
    fields = {"endpoint": proxy.url, "model": "judge", "timeout_s": 2.0, "max_retries": 2, "backoff_s": 0.01}
    return LLMJudge(**{**fields, **overrides})


def run(judge: LLMJudge, inputs: dict) -> tuple[list, dict]:
    metrics: dict[str, float] = {}
    return asyncio.run(judge(**inputs, log_metric=metrics.__setitem__)), metrics


def request_bodies(proxy: FaultProxy) -> list[dict]:
    return [json.loads(entry["body"]) for entry in proxy.log if entry["body"]]


def test_the_score_schema_is_requested_in_openai_shape(proxy):
    scores, metrics = run(judge_for(proxy), reward_inputs(["Q-1"], answers=["42"]))
    [body] = request_bodies(proxy)
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["schema"] == score_schema("trajectory", 1, 0.0, 10.0)
    assert scores == [0.5] and metrics["judge/structured_calls"] == 1


def test_a_server_that_refuses_a_shape_gets_the_next_then_free_text(proxy):
    proxy.script("Q-1", [("status", 422), ("status", 400)])  # refuses json_schema, then json_object + schema
    judge = judge_for(proxy)
    scores, metrics = run(judge, reward_inputs(["Q-1"]))
    formats = [body.get("response_format", {}).get("type") for body in request_bodies(proxy)]
    assert formats == ["json_schema", "json_object", None]
    assert scores == [0.5] and metrics["judge/retries"] == 0 and metrics["judge/structured_calls"] == 0
    run(judge, reward_inputs(["Q-2"]))
    assert "response_format" not in request_bodies(proxy)[-1]  # remembered: free text from then on


def test_structured_output_off_sends_plain_requests(proxy):
    run(judge_for(proxy, structured_output="off"), reward_inputs(["Q-1"]))
    assert "response_format" not in request_bodies(proxy)[0]


def test_group_mode_asks_for_exactly_n_scores(proxy):
    proxy.default_reply = '{"scores": [10, 0, 5]}'
    scores, _ = run(judge_for(proxy, mode="group"), reward_inputs(["Q-g"] * 3))
    schema = request_bodies(proxy)[0]["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["scores"]["minItems"] == schema["properties"]["scores"]["maxItems"] == 3
    assert scores == [1.0, 0.0, 0.5]


def test_a_verdict_cut_after_its_score_still_scores():
    assert parse_score('{"score": 7, "reason": "the tool was used but the ans', 0, 10) == 0.7


def test_every_raw_reply_is_saved_with_its_trajectory(proxy):
    proxy.script("Q-prose", [("reply", "I think it is fine.")])
    proxy.script("Q-down", [("status", 503)] * 3)
    inputs = reward_inputs(["Q-prose", "Q-json", "Q-down"])
    run(judge_for(proxy), inputs)
    notes = [t.to_dict()["notes"]["judge_reply"] for t in inputs["trajectory"]]
    assert notes[0] == "I think it is fine." and notes[1] == '{"score": 5}'
    assert notes[2].startswith("(failed: HTTP 503")


def test_a_judge_that_scores_too_little_warns_in_the_log_and_the_run_summary(proxy, caplog, tmp_path):
    proxy.default_reply = "This trajectory looks reasonable to me."  # never a score
    judge = judge_for(proxy, min_scored_fraction=0.5)
    with caplog.at_level(logging.WARNING):
        scores, metrics = run(judge, reward_inputs(["Q-1", "Q-2"]))
    assert scores == [None, None] and metrics["judge/scored_fraction"] == 0.0
    assert "scored 0 of the 2 trajectories it answered about this step" in caplog.text
    text = summary(Path(tmp_path), [judge])
    assert "judge `judge`: scored 0 of 2 trajectories (0%)" in text and "WARNING: below min_scored_fraction" in text


def test_a_judge_that_scores_enough_reports_without_warning(proxy, tmp_path):
    proxy.script("Q-1", [("reply", '{"score": 3}')])  # two different scores: the judge tells them apart
    judge = judge_for(proxy)
    run(judge, reward_inputs(["Q-1", "Q-2"]))
    line = judge.run_summary()
    assert line.startswith("judge `judge`: scored 2 of 2 trajectories (100%)") and "WARNING" not in line


def test_a_judge_that_gives_every_trajectory_the_same_score_is_called_out(proxy):
    judge = judge_for(proxy)  # the proxy's default reply: a score of 5 for everything
    run(judge, reward_inputs(["Q-1", "Q-2", "Q-3"]))
    line = judge.run_summary()
    assert "scored 3 of 3 trajectories (100%)" in line
    assert "WARNING: every scored trajectory got the same score (0.5)" in line


def test_a_judge_endpoint_that_is_down_is_named_as_the_cause_not_the_model(tmp_path):
    from tests.judge_fixtures import free_port

    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    judge = LLMJudge(endpoint=url, model="judge", timeout_s=1.0, max_retries=0, backoff_s=0.01, check_endpoint=False)
    scores, metrics = run(judge, reward_inputs(["Q-1", "Q-2"]))
    assert scores == [None, None] and metrics["judge/failures"] == 2
    text = summary(Path(tmp_path), [judge])
    assert "WARNING: 2 of 2 judge calls failed (first: " in text and f"check that {url} is up" in text
    assert "follows the rubric" not in text  # the model's format is not what went wrong
