"""A deterministic generation backend for turn-loop tests.

A fake, on purpose: the turn loop's behaviour (stops, tool errors, timeouts, budgets)
must be checked on exact model text, which no sampled model produces on demand. The
tokens still go through the real tokenizer and the real `cut_generation`.
"""

from __future__ import annotations

from agentic_grpo.backends import Generation, cut_generation


class ScriptedBackend:
    """Plays a script per case: the user question holds a tag `[case:NAME]`, and turn n of
    that trajectory (n = `turn_marker`s, "Observation:" for ReAct, seen after the tag) returns `scripts[NAME][n]`.
    """

    def __init__(self, tokenizer, scripts: dict[str, list[str]], turn_marker: str = "Observation:", eos_ids=None):
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids or [tokenizer.eos_token_id]
        self.turn_marker = turn_marker
        self.scripts = scripts
        self.batches: list[int] = []  # live trajectories per call
        self.returned: list[list[int]] = []

    def generate(self, batch, stop, max_new_tokens, choices=None, assigned=None) -> list[Generation]:
        """The script's next turn for each context; a constrained action slot (`choices`) is the script's to obey."""
        self.batches.append(len(batch))
        out = []
        for ids in batch:
            context = self.tokenizer.decode(ids)
            tag_at = context.rfind("[case:")
            name = context[tag_at + 6 : context.index("]", tag_at)]
            turn = context[tag_at:].count(self.turn_marker)
            script = self.scripts[name]
            text = script[turn] if turn < len(script) else "Final Answer: out of script<|im_end|>"
            new_ids = self.tokenizer(text, add_special_tokens=False)["input_ids"][:max_new_tokens]
            generation = cut_generation(new_ids, self.eos_ids, stop, self.tokenizer)
            self.returned.append(generation.token_ids)
            out.append(generation)
        return out


def case_prompt(name: str, system: str = "You use tools.") -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": f"[case:{name}] What is 12 * 34?"}]
