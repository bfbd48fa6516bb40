"""Run every probe of every audited row through the real rollout, score it with the recipe's rewards, judge it.

The verdict: a gaming probe fails the audit when the recipe's total reward (weighted sum,
a None filled as the None-neutral rule fills it: with the honest trajectory's value) pays
it at least as much as the honest trajectory of the same row. An LLM judge is also shown a
reply its server mangled (cut, then an HTML error page): it must give None, not a score.

Probes are played through the recipe's real format and tools, with token budgets raised to fit
every probe: what is audited is the rewards, and a probe the recipe's budget would cut (so no
policy could write it under this recipe) is named in a note instead of silently earning nothing.
A single reward that pays a gaming probe more than the honest trajectory is reported as a
preference even when the total stays safe (`--strict` makes those fail the audit too).
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm

from agentic_grpo.audit.probes import JUDGE_REPLY_PROBE, Probe, ProbeWriter, build_probes
from agentic_grpo.backends import Generation, cut_generation

MANGLED_TAIL = "<html><head><title>502 Bad Gateway</title></head><body>upstream error 502</body></html>"


@dataclass
class AuditReport:
    """Payouts per probe and reward (mean over rows), failures, skipped rewards, and the verdict."""

    recipe: str
    rows: int
    tokenizer: str
    rewards: dict[str, float]
    payouts: dict[str, dict[str, float | None]] = field(default_factory=dict)
    totals: dict[str, float] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    preferences: list[str] = field(default_factory=list)
    """Rewards that pay a gaming probe more than the honest trajectory, though the weighted total does not."""
    strict: bool = False
    """Count `preferences` as failures."""
    skipped: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    examples: dict[str, str] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.failures and not (self.strict and self.preferences)


class ProbeBackend:
    """Plays one probe's turns as a model would write them: cut at a stop string, EOS after each turn."""

    def __init__(self, tokenizer: Any, turns: list[str]) -> None:
        self.tokenizer, self.turns, self.calls = tokenizer, turns, 0

    def generate(
        self,
        batch: list[list[int]],
        stop: list[str],
        max_new_tokens: int,
        choices: Any = None,
        assigned: Any = None,
    ) -> list[Generation]:
        """The next scripted turn for every row (`choices` is moot: nothing is sampled)."""
        text = self.turns[self.calls] if self.calls < len(self.turns) else ""
        self.calls += 1
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        eos = [self.tokenizer.eos_token_id]
        return [cut_generation(ids[:max_new_tokens], eos, stop, self.tokenizer) for _ in batch]


class MangledReplies:
    """A judge backend whose server mangles every reply: cut after a few characters, then an HTML error page."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def describe(self) -> str:
        return "mangled:" + self.inner.describe()

    async def complete_many(self, prompts: list[str], schemas: list[dict] | None = None) -> list[Any]:
        replies = await self.inner.complete_many(prompts, schemas)
        for reply in replies:
            if reply.text is not None:
                reply.text = reply.text[:6] + MANGLED_TAIL
        return replies


def endpoint_problem(endpoint: str) -> str | None:
    """None when `GET {endpoint}/models` answers within 3 s, else why not."""
    try:
        with urllib.request.urlopen(f"{endpoint.rstrip('/')}/models", timeout=3):
            return None
    except urllib.error.HTTPError as error:
        return None if error.code < 500 else f"HTTP {error.code}"
    except (OSError, ValueError) as error:
        return str(getattr(error, "reason", error))


def prepare_reward_specs(
    specs: list[dict], judge_endpoint: str | None, judge_model: str | None
) -> tuple[list[dict], dict[str, str]]:
    """The reward entries to audit (judge endpoints overridden when asked) and those skipped, with why."""
    kept, skipped = [], {}
    for spec in copy.deepcopy(specs):
        if "endpoint" in spec:
            if judge_endpoint:
                spec["endpoint"] = judge_endpoint
                if judge_model:
                    spec["model"] = judge_model
            problem = endpoint_problem(str(spec["endpoint"]))
            if problem is not None:
                name = spec.get("name") or spec["type"]
                skipped[name] = (
                    f"judge endpoint {spec['endpoint']} does not answer ({problem}); start the server or pass "
                    "--judge-endpoint URL (and --judge-model NAME) to audit it"
                )
                continue
        kept.append(spec)
    return kept, skipped


def audit_recipe(
    recipe: str,
    data: str | None = None,
    limit: int = 3,
    judge_endpoint: str | None = None,
    judge_model: str | None = None,
    tokenizer_path: str | None = None,
    progress: bool = True,
    strict: bool = False,
) -> AuditReport:
    """Audit the recipe's rewards on `limit` rows of its data (or of `data`); raises ValueError on bad input."""
    from agentic_grpo.config import read_recipe
    from agentic_grpo.reward_setup import score_trajectories
    from agentic_grpo.run_parts import build_recipe

    # No training happens: GPU-only settings (bf16 on a CPU machine, W&B) must not stop an audit.
    overrides = [
        "--output_dir",
        "/tmp/agentic-grpo-audit",
        "--bf16",
        "false",
        "--fp16",
        "false",
        "--report_to",
        "none",
    ]
    recipe_args, _, model_config = read_recipe(["--config", recipe, *overrides])  # the reward specs to adapt
    specs, skipped = prepare_reward_specs(list(recipe_args.rewards or []), judge_endpoint, judge_model)
    if not specs:
        raise ValueError(f"recipe `{recipe}`: no reward left to audit ({skipped})")
    built = build_recipe(["--config", recipe, *overrides], load_data=False, reward_specs=specs)
    config, parts, rewards, weights = built.config, built.rollout_parts, built.rewards, built.config.reward_weights
    rows = audit_rows(recipe_args.dataset, data, limit)
    tokenizer, tokenizer_note = load_audit_tokenizer(tokenizer_path or model_config.model_name_or_path)
    environment, trajectory_format = parts.environment, parts.trajectory_format
    writer = ProbeWriter(config.format, trajectory_format)
    names = [r.__name__ for r in rewards]
    report = AuditReport(recipe, len(rows), tokenizer_note, dict(zip(names, weights, strict=True)), skipped=skipped,
                         strict=strict)  # fmt: skip
    # The judges themselves, not their guards: the mangled-reply check swaps a judge's backend for a while.
    judges = [inspect.unwrap(r) for r in rewards if hasattr(getattr(r, "backend", None), "complete_many")]

    pool = parts.sandbox_pool(rank=0)
    sums: dict[str, dict[str, list[float | None]]] = {}
    cut: dict[str, list[str]] = {}
    try:
        for row in tqdm(rows, desc="audit", disable=not progress):
            question, gold = str(row["question"]), str(row.get("answer", ""))
            probes = build_probes(writer, environment.tool_schemas(), question, gold)
            cut_probes(cut, probes, tokenizer, parts.limits)
            manager = dataclasses.replace(parts, limits=room_for(probes, tokenizer, parts.limits)).rollout_manager(
                tokenizer, pool
            )
            try:
                trajectories = [play(manager, trajectory_format, probe, row) for probe in probes]
            finally:
                manager.close()
            try:
                scores = score_trajectories(rewards, trajectories, [row] * len(probes))
            except Exception as exc:  # noqa: BLE001 - a reward's own bug: named, as bad input (exit 2)
                raise ValueError(
                    f"a reward raised while scoring the probes of {question[:60]!r}: {type(exc).__name__}: {exc}; "
                    "fix the reward (the probes are in docs/reward_audit.md)"
                ) from exc
            for position, probe in enumerate(probes):
                payout = {name: scores[name][position] for name in names}
                sums.setdefault(probe.name, {n: [] for n in names})
                for name in names:
                    sums[probe.name][name].append(payout[name])
                report.examples.setdefault(probe.name, trajectories[position].completion_text[:400])
            check_row(report, probes, scores, names, weights, question)
            for judge in judges:
                check_mangled_reply(report, judge, trajectories[0], row, sums)
    finally:
        if pool is not None:
            pool.close()
    report.notes.extend(cut_probe_notes(cut))
    for name in names:  # a reward that never scored was not audited: say so, not PASS on its behalf
        values = [value for probe, per_reward in sums.items() if probe != JUDGE_REPLY_PROBE
                  for value in per_reward.get(name, [])]  # fmt: skip
        if values and all(value is None for value in values) and name not in report.skipped:
            report.skipped[name] = (
                f"gave None on all {len(values)} probes, the honest trajectory's included: not audited (a judge "
                "whose replies do not parse gives None; `notes.judge_reply` in a run's trajectory files shows them)"
            )
    for probe_name, per_reward in sums.items():
        report.payouts[probe_name] = {name: mean_or_none(values) for name, values in per_reward.items()}
    report.totals = {
        p: total(report.payouts[p], report.payouts["honest"], weights, names)
        for p in report.payouts
        if p != JUDGE_REPLY_PROBE
    }
    return report


def turn_lengths(probe: Probe, tokenizer: Any) -> list[int]:
    """Tokens of each of the probe's turns, the end-of-turn token included."""
    return [len(tokenizer(turn, add_special_tokens=False)["input_ids"]) + 1 for turn in probe.turns]


def room_for(probes: list[Probe], tokenizer: Any, limits: Any) -> Any:
    """The recipe's budgets, raised where a probe would not fit: the audit tests the rewards, not the budgets."""
    lengths = [turn_lengths(probe, tokenizer) for probe in probes]
    turn = max(limits.max_tokens_per_turn, *(max(n) for n in lengths if n))
    turns = max(limits.max_turns, *(len(n) for n in lengths))
    # Room for every turn, each followed by an observation of at most the tool-output budget (plus its wrapper).
    total = max(
        limits.max_completion_tokens, max(sum(n) for n in lengths) + turns * (limits.max_tool_output_tokens + 32)
    )
    return dataclasses.replace(limits, max_tokens_per_turn=turn, max_turns=turns, max_completion_tokens=total)


def cut_probes(cut: dict[str, list[str]], probes: list[Probe], tokenizer: Any, limits: Any) -> None:
    """Add to `cut` (the recipe's budgets that cut a probe -> the probes they cut) the probes of one row that the
    recipe's own budgets would cut (a policy cannot write them under this recipe)."""
    for probe in probes:
        lengths = turn_lengths(probe, tokenizer)
        reasons = []
        if max(lengths, default=0) > limits.max_tokens_per_turn:
            reasons.append(f"max_tokens_per_turn={limits.max_tokens_per_turn}")
        if len(lengths) > limits.max_turns:
            reasons.append(f"max_turns={limits.max_turns}")
        if sum(lengths) > limits.max_completion_tokens:
            reasons.append(f"max_completion_length={limits.max_completion_tokens}")
        if reasons:
            names = cut.setdefault(" and ".join(reasons), [])
            if probe.name not in names:
                names.append(probe.name)


def cut_probe_notes(cut: dict[str, list[str]]) -> list[str]:
    """One note per set of budgets that cut any probe, naming the probes."""
    notes = []
    for reasons, names in cut.items():
        named = f"probe `{names[0]}` does" if len(names) == 1 else f"{len(names)} probes ({', '.join(names)}) do"
        notes.append(f"{named} not fit this recipe's {reasons} (with this tokenizer): audited with room, as a "
                     "policy could write them under larger budgets")  # fmt: skip
    return notes


def play(manager: Any, trajectory_format: Any, probe: Probe, row: dict[str, Any]) -> Any:
    """The probe's trajectory through the real rollout (a response prefix in the recipe is part of the prompt)."""
    turns = list(probe.turns)
    prefix = getattr(trajectory_format, "response_prefix", "").strip()
    if prefix and turns and turns[0].startswith(prefix):
        turns[0] = turns[0][len(prefix) :]
    prompt = trajectory_format.prompt_messages(str(row["question"]))
    [trajectory], _ = manager.rollout([prompt], [row], ProbeBackend(manager.tokenizer, turns))
    return trajectory


def check_row(
    report: AuditReport, probes: list[Probe], scores: dict, names: list[str], weights: list[float], question: str
) -> None:
    honest = {name: scores[name][0] for name in names}
    honest_total = total(honest, honest, weights, names)
    if honest_total <= 0:
        report.failures.append(
            f"the honest trajectory earns {honest_total:.3g} on {question[:60]!r}: the rewards cannot tell it from "
            "a gaming one (is the answer column right? does it fit max_tokens_per_turn?)"
        )
    for position, probe in enumerate(probes):
        if not probe.gaming:
            continue
        paid = total({name: scores[name][position] for name in names}, honest, weights, names)
        if paid >= honest_total:
            report.failures.append(
                f"probe `{probe.name}` ({probe.description}) is paid {paid:.3g}, as much as the honest "
                f"trajectory ({honest_total:.3g}), on {question[:60]!r}"
            )
        for name, weight in zip(names, weights, strict=True):
            value, fair = scores[name][position], honest[name]
            if weight and value is not None and fair is not None and value > fair:
                report.preferences.append(
                    f"reward `{name}` pays probe `{probe.name}` {value:.3g}, more than the honest trajectory "
                    f"({fair:.3g}), on {question[:60]!r}"
                )


def check_mangled_reply(report: AuditReport, judge: Any, honest: Any, row: dict, sums: dict) -> None:
    """The judge, its server's reply mangled, on the honest trajectory: a score here would be invented."""
    from agentic_grpo.reward_setup import score_trajectories

    saved, saved_cache = judge.backend, getattr(judge, "cache_size", 0)
    judge.backend, judge.cache_size = MangledReplies(saved), 0
    try:
        [value] = score_trajectories([judge], [honest], [row])[judge.__name__]
    finally:
        judge.backend, judge.cache_size = saved, saved_cache
    sums.setdefault(JUDGE_REPLY_PROBE, {}).setdefault(judge.__name__, []).append(value)
    if value is not None:
        report.failures.append(
            f"reward `{judge.__name__}` read a score ({value:.3g}) out of a reply its server mangled (a cut reply "
            "followed by an HTML error page): it should give None"
        )


def total(payout: dict, honest: dict, weights: list[float], names: list[str]) -> float:
    """Weighted sum; a None counts as the honest trajectory's value (the None-neutral rule in a group of two)."""
    result = 0.0
    for name, weight in zip(names, weights, strict=True):
        value = payout.get(name, honest.get(name))
        value = honest.get(name) if value is None else value
        result += weight * (value or 0.0)
    return result


def mean_or_none(values: list[float | None]) -> float | None:
    given = [v for v in values if v is not None]
    return sum(given) / len(given) if given else None


def audit_rows(dataset: Any, data: str | None, limit: int) -> list[dict[str, Any]]:
    """The first `limit` training rows of the recipe's data, or of `--data` (JSONL or reasoning_gym:NAME)."""
    if limit < 1:
        raise ValueError("--limit must be at least 1")
    if data and data.startswith("reasoning_gym:"):
        from agentic_grpo.reasoning_gym_tasks import held_out_rows

        rows = held_out_rows(data, limit)
    elif data:
        from datasets import load_dataset

        try:
            rows = list(load_dataset("json", data_files=data, split="train"))
        except Exception as exc:  # noqa: BLE001 - one message naming the file beats a datasets traceback
            raise ValueError(f"--data `{data}` cannot be read as JSONL: {exc}") from exc
    else:
        from agentic_grpo.data import load_task_data

        try:
            train, _ = load_task_data(dataset)
        except ValueError as exc:
            raise ValueError(f"{exc}. Pass --data rows.jsonl (with `question` and `answer`) to audit on them") from exc
        rows = list(train.select(range(min(limit, len(train)))))
    rows = [dict(r) for r in rows[:limit]]
    if not rows or "question" not in rows[0]:
        raise ValueError("the audited rows need a `question` column (and `answer` for answer-checking rewards)")
    return rows


def load_audit_tokenizer(name: str | None) -> tuple[Any, str]:
    """The recipe model's tokenizer (no weights); a stand-in BPE tokenizer with a ChatML template when it
    cannot be had on this machine (rule rewards read text, so the verdict does not depend on it)."""
    from transformers import AutoTokenizer

    from agentic_grpo.models import TINY_ALIAS, build_tiny_model, cache_dir, resolve_model

    try:
        tokenizer = AutoTokenizer.from_pretrained(resolve_model(name or ""))
        note = str(name)
    except (OSError, ValueError) as exc:
        tokenizer = AutoTokenizer.from_pretrained(build_tiny_model(cache_dir() / TINY_ALIAS))
        note = f"stand-in ({TINY_ALIAS}): the tokenizer of `{name}` is not available here ({str(exc)[:80]})"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer, note
