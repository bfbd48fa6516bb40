"""`VLLMBackend` wiring, up to TRL's `VLLMGeneration.generate` call.

vLLM cannot run on this machine (no CUDA; the CPU build needs its own venv and an older
transformers), and `VLLMGeneration.__init__` starts an engine or connects to a server.
So the engine stands in: an object with the attributes TRL's `generate` reads
(`max_completion_length`, `generation_kwargs`) that records what it is called with and
answers in TRL's return shape. What is checked is ours: token ids in, one sample per
live trajectory, the turn's budget and stop strings in force during the call and
restored after, outputs cut at EOS or stop string, the sampled log-probs kept.
"""

from __future__ import annotations

from types import SimpleNamespace

from agentic_grpo.vllm_backend import VLLMBackend


class RecordingVLLMGeneration:
    """Answers like `trl.generation.VLLMGeneration.generate`: (prompt_ids, completion_ids, logprobs, token_ids)."""

    def __init__(self, completions: list[list[int]]) -> None:
        self.max_completion_length = 512
        self.generation_kwargs = {"repetition_penalty": 1.0}
        self.completions = completions
        self.calls: list[dict] = []

    def generate(self, prompts, images, num_generations, profiler=None):
        self.calls.append(
            {"prompts": prompts, "images": images, "n": num_generations, "max": self.max_completion_length,
             "kwargs": dict(self.generation_kwargs)}
        )  # fmt: skip
        logprobs = [[[-0.5 - i] for i in range(len(ids))] for ids in self.completions]
        return prompts, self.completions, logprobs, None


def test_vllm_backend_generates_one_turn_from_token_ids_with_the_turn_settings(tokenizer):
    eos = tokenizer.eos_token_id
    stopped = tokenizer.encode("Thought: multiply\nObservation: made up", add_special_tokens=False)
    ended = tokenizer.encode("Final Answer: 42", add_special_tokens=False) + [eos]
    capped = tokenizer.encode("and so on", add_special_tokens=False)
    engine = RecordingVLLMGeneration([stopped, ended + [7, 7], capped])
    trainer = SimpleNamespace(vllm_generation=engine, processing_class=tokenizer, eos_token_ids=[eos])
    batch = [[1, 2, 3], [1, 2, 3, 4], [5]]

    generations = VLLMBackend(trainer).generate(batch, stop=["Observation:"], max_new_tokens=24)

    (call,) = engine.calls
    assert call["prompts"] == batch and call["images"] is None
    assert call["n"] == 1  # each live trajectory is its own sequence: one sample each
    assert call["max"] == 24
    assert call["kwargs"]["stop"] == ["Observation:"] and call["kwargs"]["include_stop_str_in_output"]
    assert call["kwargs"]["repetition_penalty"] == 1.0  # the recipe's generation kwargs survive
    assert engine.max_completion_length == 512 and "stop" not in engine.generation_kwargs  # restored

    assert [g.stop_reason for g in generations] == ["stop", "eos", "length"]
    assert tokenizer.decode(generations[0].token_ids).endswith("Observation:")
    assert generations[1].token_ids == ended
    assert generations[1].logprobs == [-0.5 - i for i in range(len(ended))]
