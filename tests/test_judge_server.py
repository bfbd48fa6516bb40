"""LLMJudge end to end: HTTP to a real llama.cpp server (SmolLM2-135M), and the local HF backend.

llama-cpp-python's server runs one request at a time, and a request queued behind another
sometimes waits for its lock until the client gives up, so these judges send one call at a
time (`max_concurrency=1`), as a recipe pointing at llama.cpp should.

A 135M judge rarely writes a clean score, so these tests assert what holds for any answer:
a score in [0, 1] or None, and None counted as a parse failure, never as a failed call.
Exact parsing and fault handling are specified in `test_judge.py` through the proxy.
"""

# Fixtures come from tests/judge_fixtures.py (conftest.py is shared): importing them reads as a redefinition.
# ruff: noqa: F401, F811

import asyncio
import subprocess
import sys

import pytest

from agentic_grpo.rewards.judge import LLMJudge
from tests.judge_fixtures import (
    FaultProxy,
    LlamaServer,
    llama_server,
    llama_server_process,
    reward_inputs,
    tiny_model_dir,
)


# A generous per-call timeout: on a busy 2-core host one prompt can take a minute, and a call the client
# abandons keeps the one-request server busy, so the retry meets HTTP 503 (seen with a training job beside it).
def run(judge: LLMJudge, inputs: dict) -> tuple[list, dict]:
    metrics: dict[str, float] = {}
    return asyncio.run(judge(**inputs, log_metric=metrics.__setitem__)), metrics


def assert_scores_or_counted_none(scores: list, metrics: dict) -> None:
    assert all(s is None or 0.0 <= s <= 1.0 for s in scores)
    assert metrics["judge/failures"] == 0 and metrics["judge/retries"] == 0


@pytest.mark.integration
def test_real_server_scores_each_trajectory(llama_server):
    judge = LLMJudge(endpoint=llama_server, model="judge", max_tokens=24, timeout_s=300, max_concurrency=1)
    scores, metrics = run(judge, reward_inputs(["What is 6 * 7?", "What is 7 * 6?"], answers=["42", "42"]))
    assert len(scores) == 2 and metrics["judge/calls"] == 2
    assert_scores_or_counted_none(scores, metrics)
    assert metrics["judge/parse_failures"] == scores.count(None)


@pytest.mark.integration
def test_real_server_group_mode_makes_one_call_per_query(llama_server):
    judge = LLMJudge(
        endpoint=llama_server, model="judge", mode="group", max_tokens=24, timeout_s=300, max_concurrency=1
    )
    scores, metrics = run(judge, reward_inputs(["What is 6 * 7?"] * 3, answers=["42"] * 3))
    assert len(scores) == 3 and metrics["judge/calls"] == 1
    assert_scores_or_counted_none(scores, metrics)
    assert metrics["judge/parse_failures"] == int(None in scores)


@pytest.mark.integration
def test_faults_between_judge_and_real_server_are_retried_or_counted(llama_server):
    proxy = FaultProxy(upstream=llama_server.removeprefix("http://").removesuffix("/v1"))
    try:
        proxy.script("Q-recovers", [("status", 500), ("refuse",)])  # then forwarded to the real server
        proxy.script("Q-rewritten", [("reply", "I cannot grade this.")])
        proxy.script("Q-down", [("status", 503)] * 3)
        judge = LLMJudge(
            endpoint=proxy.url,
            model="judge",
            max_tokens=16,
            timeout_s=300,
            max_retries=2,
            backoff_s=0.01,
            max_concurrency=1,
        )
        scores, metrics = run(judge, reward_inputs(["Q-recovers", "Q-rewritten", "Q-down"]))
    finally:
        proxy.close()
    recovered, rewritten, down = scores
    assert recovered is None or 0.0 <= recovered <= 1.0
    assert rewritten is None and down is None
    assert metrics["judge/calls"] == 3 and metrics["judge/failures"] == 1 and metrics["judge/retries"] == 2 + 0 + 2
    assert metrics["judge/parse_failures"] == 1 + int(recovered is None)
    assert ("forward",) in [entry["action"] for entry in proxy.log if entry["marker"] == "Q-recovers"]


def test_local_backend_judges_in_batches_on_its_device(tiny_model_dir):
    judge = LLMJudge(backend="local", model=tiny_model_dir, device="cpu", batch_size=2, max_tokens=8)
    scores, metrics = run(judge, reward_inputs(["q1", "q2", "q3"], answers=["1", "2", "3"]))
    assert len(scores) == 3 and metrics["judge/calls"] == 3
    assert judge.backend.generate_calls == 2  # 3 prompts in batches of 2
    assert all(s is None or 0.0 <= s <= 1.0 for s in scores)
    assert metrics["judge/parse_failures"] == scores.count(None) and metrics["judge/failures"] == 0


def test_the_local_judge_takes_the_model_aliases_and_refuses_a_bad_id_in_one_line():
    judge = LLMJudge(backend="local", model="tiny-random-llama", max_tokens=4)
    assert judge.backend.model_path.endswith("tiny-random-llama")
    with pytest.raises(ValueError, match=r"^LLMJudge field `model`: cannot load local judge model 'no-such-model': "
                                         r"model `no-such-model` does not exist"):  # fmt: skip
        LLMJudge(backend="local", model="no-such-model", max_tokens=4)


def test_local_backend_scores_what_the_model_writes(tiny_model_dir, monkeypatch):
    judge = LLMJudge(backend="local", model=tiny_model_dir, mode="group", max_tokens=4)
    monkeypatch.setattr(judge.backend, "_generate", lambda prompts: ['{"scores": [10, 0]}'] * len(prompts))
    scores, _ = run(judge, reward_inputs(["q", "q"]))
    assert scores == [pytest.approx(1.0), pytest.approx(0.0)]


@pytest.mark.integration
def test_a_server_that_dies_is_reported_with_its_signal_and_log(tmp_path):
    """The fixture's check, on a real process killed by SIGILL (what a non-portable llama.cpp build does)."""
    log = tmp_path / "server.log"
    log.write_text("loading model\nserver ready\n")
    process = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGILL)"])
    process.wait(60)
    server = LlamaServer(process, "http://127.0.0.1:1/v1", log)
    with pytest.raises(pytest.fail.Exception, match=r"(?s)died during this test: killed by signal SIGILL.*"
                       r"GGML_NATIVE=OFF.*server ready"):  # fmt: skip
        server.check_alive("during this test")


@pytest.mark.integration
def test_real_server_constrained_to_the_score_schema_scores_every_trajectory(llama_server):
    """SmolLM2-135M in free text almost never writes a parsable score; held to the JSON schema, it always does."""
    judge = LLMJudge(endpoint=llama_server, model="judge", max_tokens=24, timeout_s=300, max_concurrency=1)
    inputs = reward_inputs(["What is 6 * 7?", "What is 7 * 6?"], answers=["42", "42"])
    scores, metrics = run(judge, inputs)
    assert metrics["judge/structured_calls"] == 2 and metrics["judge/parse_failures"] == 0
    assert all(s is not None and 0.0 <= s <= 1.0 for s in scores)
    assert all(t.notes["judge_reply"].lstrip().startswith("{") for t in inputs["trajectory"])
