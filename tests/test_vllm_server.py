"""vLLM server mode with two training processes, run for real: a vLLM server (its CPU build) serving the tiny model
with runtime LoRA loading, and two CPU training processes (`tests/vllm_server_run.py`) whose trajectories end at
different turns, each sending its own live trajectories every turn; the LoRA adapter reaches the server by file
under a new name each step, and a planted "adapter never loaded" bug must stop the run.

Lane `vllm` (`pytest -m vllm`); under CI a missing vLLM fails instead of skipping.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import environment, launch_two_processes, require_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

require_vllm()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Any:
    """A vLLM OpenAI-compatible server on the tiny model (32-wide heads), LoRA adapters loadable at run time, log-probs
    of the processed distribution, as the docs tell users to start it."""
    from agentic_grpo.models import build_tiny_model

    root = tmp_path_factory.mktemp("vllm-server")
    model = build_tiny_model(root / "tiny", head_dim=32)
    port = free_port()
    log = open(root / "server.log", "w")  # noqa: SIM115 (closed below)
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host", "127.0.0.1",
               "--port", str(port), "--enable-lora", "--max-lora-rank", "8", "--max-loras", "2",
               "--logprobs-mode", "processed_logprobs", "--max-model-len", "512"]  # fmt: skip
    env = environment(VLLM_ALLOW_RUNTIME_LORA_UPDATING="1", VLLM_CPU_KVCACHE_SPACE="1")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)  # a live server, killed below
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            assert process.poll() is None, (root / "server.log").read_text()[-5000:]
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the vLLM server did not come up in 600 s"
            time.sleep(2)
        yield {"url": url, "model": model}
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


def two_processes(server: dict[str, str], out: Path, *plant: str) -> list[dict[str, Any]]:
    result = launch_two_processes("vllm_server_run.py", server["model"], str(out), server["url"], *plant)
    files = [out / f"rank{rank}.json" for rank in (0, 1)]
    assert all(f.is_file() for f in files), result.stdout[-3000:] + result.stderr[-6000:]
    return [json.loads(f.read_text()) for f in files]


def test_two_processes_send_their_own_trajectories_and_sample_the_adapter_they_trained(server, tmp_path):
    ranks = two_processes(server, tmp_path / "out")
    for record in ranks:
        assert record["error"] is None, record.get("traceback")
        assert record["syncs"] == [0, 1]  # one adapter sync per optimizer step
    # Every request of a step names that step's adapter, the same name on both processes, a new one each step.
    names = [{step: {r["model"] for r in record["requests"] if r["step"] == step} for step in (0, 1)}
             for record in ranks]  # fmt: skip
    assert names[0] == names[1]
    step0, step1 = names[0][0], names[0][1]
    assert len(step0) == len(step1) == 1 and step0 != step1 and next(iter(step1)).endswith("-step1")
    assert ranks[0]["adapters_left"] == list(step1)  # the older version unloaded and removed
    # The processes' live trajectories differ at some turn: TRL's sliced call would have crossed them.
    live = [[r["live"] for r in record["requests"]] for record in ranks]
    assert live[0] != live[1], live
    for record in ranks:
        for rollout in record["rollouts"]:
            for mask, roles, logprobs in zip(rollout["env_mask"], rollout["roles"], rollout["logprobs"], strict=True):
                assert mask == [int(role == "model") for role in roles]
                assert all(lp == 0.0 for lp, role in zip(logprobs, roles, strict=True) if role == "tool")
                assert all(lp < 0.0 for lp, role in zip(logprobs, roles, strict=True) if role == "model")
    means = [m["canary/logprob_diff/mean"] for m in ranks[0]["metrics"] if "canary/logprob_diff/mean" in m]
    assert len(means) == 2 and max(means) < 0.005, means  # the served adapter is the trained one


def test_an_adapter_never_loaded_stops_the_run(server, tmp_path):
    for record in two_processes(server, tmp_path / "out", "never_loaded"):
        assert record["error"] is not None and record["error"].startswith("CanaryError"), record["error"]
        assert "at step 2 the sampler and the trainer score the same sampled tokens differently" in record["error"]
