"""An LLM judge as a TRL reward function: whole trajectories in, a score in [0, 1] (or None) out.

What no library gives us: a judge that sees the agent's *whole* multi-turn trajectory
(thoughts, every tool call with the output the tool really returned, the final answer)
next to the dataset's reference answer; that can grade the G samples of one query in one
relative call (as ART's RULER does) as well as one at a time; that survives a flaky or
absent server (None rewards that TRL leaves out, never a crashed run or a fake 0); and
that reports what it cost (`judge/*` metrics) through TRL's `log_metric`.

A recipe names it like any reward:

    rewards:
      - {name: judge, type: agentic_grpo.rewards.judge:LLMJudge, weight: 0.5,
         endpoint: http://127.0.0.1:8000/v1, model: judge, rubric: rubrics/tool_use.md}

Every key except name/type/weight is a keyword argument of `LLMJudge`.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from agentic_grpo.rewards.judge_backends import JudgeBackend, JudgeReply, LocalBackend, OpenAIBackend
from agentic_grpo.rewards.judge_parsing import parse_group_scores, parse_score, score_schema
from agentic_grpo.rewards.judge_prompt import (
    DEFAULT_RUBRICS,
    NO_REFERENCE,
    completion_text,
    consecutive_groups,
    fence_code,
    fence_note,
    fill_rubric,
    load_rubric,
    question_text,
    raw_completion,
    render_trajectory,
)
from agentic_grpo.trajectory import Trajectory

logger = logging.getLogger(__name__)

METRICS = ("calls", "failures", "retries", "parse_failures", "cache_hits", "structured_calls")
LOW_SCORED_WARN_EVERY = 25  # after the first warning, every N-th step below `min_scored_fraction` warns again


class LLMJudge:
    """Scores each completion's trajectory with an LLM, following a replaceable rubric.

    Args:
        model: Model name the server serves (`backend: openai`), or a local Hugging Face model
            directory / hub id (`backend: local`).
        endpoint: Base URL of an OpenAI-compatible API (OpenAI, vLLM, llama.cpp, ...), e.g.
            `http://127.0.0.1:8000/v1`. Required for `backend: openai`.
        backend: `openai` (default when `endpoint` is set) or `local` (the model is loaded in this process).
        rubric: Path of the rubric template, or the name of a shipped one (`tool_use`, `tool_use_group`; an
            existing file wins). Default: `tool_use`, or `tool_use_group` in group mode.
            Placeholders: `{trajectory}` (required, trajectory mode) or `{trajectories}` and `{n}` (group mode,
            `{trajectories}` required), and `{question}`, `{reference}` in both. Other braces are left as written.
        mode: `trajectory` (one call per trajectory) or `group` (one call per query showing all of its consecutive
            completions, scored relative to each other).
        api_key_env: Name of the environment variable holding the API key (never the key itself). Unset: no key.
        max_concurrency: Judge calls in flight at once (openai backend).
        timeout_s: Wall-clock limit of one attempt of one call, in seconds.
        max_retries: Retries of a call after a connection error, timeout, HTTP 429 or 5xx (then: None reward).
        backoff_s: First retry delay; doubles each retry, with jitter. A server's Retry-After takes precedence.
        max_backoff_s: Longest wait between two attempts, Retry-After included.
        max_tokens: Longest judge answer, in tokens.
        temperature: Judge sampling temperature (0: greedy).
        score_min: Lowest score of the rubric's scale (normalised to 0).
        score_max: Highest score of the rubric's scale (normalised to 1).
        question_column: Dataset column with the question shown to the judge (falls back to the prompt).
        reference_column: Dataset column with the reference answer, shown when present.
        max_tool_output_chars: Longer tool outputs are shown to the judge cut in the middle.
        cache_size: Judged prompts remembered by content hash, so a repeated trajectory is not judged twice (0: off).
        device: Device of the local judge model (`backend: local`), e.g. `cpu`, `cuda:1`.
        batch_size: Prompts per `generate` call of the local judge model.
        check_endpoint: Probe `endpoint` at start-up and warn (once) when it does not answer.
        structured_output: `auto` asks the server for output constrained to the score's JSON schema (OpenAI
            `json_schema`, else llama-cpp-python's `json_object` + schema) and falls back to free text when it
            refuses both; `off` always asks for free text. Free text is parsed the same way in both cases.
        min_scored_fraction: Warn (log, and the end-of-run summary) when fewer than this share of a step's
            trajectories got a score. Every raw reply is kept in the trajectory files (`notes.<name>_reply`).
    """

    def __init__(
        self,
        model: str | None = None,
        endpoint: str | None = None,
        backend: str | None = None,
        rubric: str | os.PathLike | None = None,
        mode: str = "trajectory",
        api_key_env: str | None = None,
        max_concurrency: int = 8,
        timeout_s: float = 60.0,
        max_retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        max_tokens: int = 256,
        temperature: float = 0.0,
        score_min: float = 0.0,
        score_max: float = 10.0,
        question_column: str = "question",
        reference_column: str = "answer",
        max_tool_output_chars: int = 2000,
        cache_size: int = 10_000,
        device: str = "cpu",
        batch_size: int = 8,
        check_endpoint: bool = True,
        structured_output: str = "auto",
        min_scored_fraction: float = 0.5,
    ) -> None:
        self.__name__ = "judge"  # TRL names the reward (`rewards/<name>/mean`) after this; the recipe overrides it
        if mode not in DEFAULT_RUBRICS:
            raise ValueError(f"LLMJudge field `mode` is {mode!r}; use one of: {', '.join(DEFAULT_RUBRICS)}")
        self.mode = mode
        self.rubric_path, self.rubric = load_rubric(rubric, mode)
        backend = backend or ("openai" if endpoint else None)
        if backend not in ("openai", "local"):
            raise ValueError(
                f"LLMJudge field `backend` is {backend!r}: set `endpoint` (an OpenAI-compatible server, e.g. "
                "http://127.0.0.1:8000/v1) or `backend: local` with `model: /path/to/hf_model`"
            )
        if not model:
            raise ValueError("LLMJudge field `model` is required: the served model name, or a local model directory")
        for field, value, least in (
            ("max_concurrency", max_concurrency, 1),
            ("max_retries", max_retries, 0),
            ("max_tokens", max_tokens, 1),
            ("batch_size", batch_size, 1),
            ("cache_size", cache_size, 0),
            ("max_tool_output_chars", max_tool_output_chars, 1),
        ):
            if not isinstance(value, int) or value < least:
                raise ValueError(f"LLMJudge field `{field}` must be an integer >= {least}, got {value!r}")
        if timeout_s <= 0:
            raise ValueError(f"LLMJudge field `timeout_s` must be > 0, got {timeout_s!r}")
        if score_max <= score_min:
            raise ValueError(
                f"LLMJudge fields `score_min` ({score_min}) and `score_max` ({score_max}): need min < max"
            )
        if structured_output not in ("auto", "off"):
            raise ValueError(f"LLMJudge field `structured_output` is {structured_output!r}; use `auto` or `off`")
        if not 0.0 <= min_scored_fraction <= 1.0:
            raise ValueError(f"LLMJudge field `min_scored_fraction` must be in [0, 1], got {min_scored_fraction!r}")
        self.min_scored_fraction = float(min_scored_fraction)
        self.structured_output = structured_output
        self.score_min, self.score_max = float(score_min), float(score_max)
        self.question_column, self.reference_column = question_column, reference_column
        self.max_tool_output_chars = max_tool_output_chars
        self.cache_size = cache_size
        self._cache: OrderedDict[str, Any] = OrderedDict()
        self._fence_key = secrets.token_bytes(32)  # the model's text never learns its markers' codes
        self.totals = dict.fromkeys(METRICS, 0)  # since construction; the per-step numbers go to log_metric
        self.totals.update(judged=0, scored=0, steps=0, low_steps=0)
        self._warned_failure = False
        self._first_error: str | None = None  # the first failed call's error, for the end-of-run summary
        self._score_range: tuple[float, float] | None = None  # the lowest and highest score given, ditto
        self.endpoint, self.model = endpoint, model

        self.backend: JudgeBackend
        if backend == "openai":
            if not endpoint:
                raise ValueError("LLMJudge field `endpoint` is required for `backend: openai`")
            api_key = None
            if api_key_env:
                api_key = os.environ.get(api_key_env)
                if not api_key:
                    raise ValueError(
                        f"LLMJudge field `api_key_env`: environment variable {api_key_env} is not set or empty"
                    )
            self.backend = OpenAIBackend(
                endpoint, model, api_key, max_concurrency=max_concurrency, timeout_s=timeout_s,
                max_retries=max_retries, backoff_s=backoff_s, max_backoff_s=max_backoff_s, max_tokens=max_tokens,
                temperature=temperature, structured_output=structured_output,
            )  # fmt: skip
            problem = self.backend.check() if check_endpoint else None
            if problem is not None:
                self._warned_failure = True  # this was the one warning; failures are counted from here on
                logger.warning(
                    "LLM judge endpoint %s does not answer (%s): training goes on, its calls will fail and be "
                    "counted in judge/failures, and those trajectories get no judge reward",
                    endpoint, problem,
                )  # fmt: skip
        else:
            try:
                self.backend = LocalBackend(model, device, batch_size, max_tokens, temperature)
            except (OSError, ValueError) as error:
                raise ValueError(
                    f"LLMJudge field `model`: cannot load local judge model {model!r}: {error}"
                ) from error

    @property
    def needs_whole_groups(self) -> bool:
        """Group mode scores a query's samples together: they must all be on one process."""
        return self.mode == "group"

    def __repr__(self) -> str:
        name, rubric = self.__name__, self.rubric_path
        return f"LLMJudge(name={name!r}, mode={self.mode!r}, backend={self.backend!r}, rubric={rubric})"

    async def __call__(
        self,
        prompts: list[Any],
        completions: list[Any],
        trajectory: list[Trajectory] | None = None,
        log_metric: Callable[[str, float], None] | None = None,
        **columns: Any,
    ) -> list[float | None]:
        """One score in [0, 1] per completion, None where the judge call failed or its answer had no score."""
        n = len(completions)
        questions = [self._question(i, prompts, trajectory, columns) for i in range(n)]
        references = columns.get(self.reference_column)
        reference_texts = [NO_REFERENCE if references is None else str(references[i]) for i in range(n)]
        raws = [self._raw_completion(i, completions, trajectory) for i in range(n)]
        step = dict.fromkeys(METRICS, 0)
        latencies: list[float] = []

        requests = []
        if self.mode == "trajectory":
            for i in range(n):
                code = fence_code(self._fence_key, questions[i], raws[i])
                body = self._render_completion(i, completions, trajectory, code)
                text = fill_rubric(
                    self.rubric, question=questions[i], reference=reference_texts[i],
                    trajectory=f"{fence_note(code)}\n\n{body}",
                )  # fmt: skip
                requests.append((text, [i]))
        else:
            for members in consecutive_groups(questions, prompts):
                first = members[0]
                code = fence_code(self._fence_key, questions[first], *(raws[i] for i in members))
                attempts = "\n\n".join(
                    f"### Attempt {k} #{code}\n{self._render_completion(i, completions, trajectory, code)}"
                    for k, i in enumerate(members, start=1)
                )
                text = fill_rubric(
                    self.rubric,
                    question=questions[first],
                    reference=reference_texts[first],
                    trajectories=f"{fence_note(code)}\n\n{attempts}",
                    n=str(len(members)),
                )
                requests.append((text, members))

        scores: list[float | None] = [None] * n
        pending: dict[str, list[list[int]]] = {}  # prompt -> the member lists waiting on it (duplicates judged once)
        for text, members in requests:
            cached = self._cache_get(text)
            if cached is not None:
                step["cache_hits"] += len(members)
                for i, score in zip(members, cached, strict=True):
                    scores[i] = score
            else:
                pending.setdefault(text, []).append(members)

        answered = step["cache_hits"]  # trajectories the judge had something to say about
        texts = list(pending)
        schemas = [score_schema(self.mode, len(pending[t][0]), self.score_min, self.score_max) for t in texts]
        replies: list[JudgeReply] = await self.backend.complete_many(texts, schemas) if texts else []
        for text, reply in zip(texts, replies, strict=True):
            step["calls"] += 1
            step["retries"] += reply.retries
            step["structured_calls"] += int(reply.structured)
            latencies.append(reply.seconds)
            for members in pending[text]:  # the raw reply goes with each trajectory it judged
                self._note(trajectory, members, reply.text if reply.text is not None else f"(failed: {reply.error})")
            if reply.text is None:
                step["failures"] += 1
                self._first_error = self._first_error or str(reply.error)
                self._warn_failure_once(reply.error)
                continue
            answered += sum(len(members) for members in pending[text])
            size = len(pending[text][0])
            parsed = (
                [parse_score(reply.text, self.score_min, self.score_max)]
                if self.mode == "trajectory"
                else parse_group_scores(reply.text, size, self.score_min, self.score_max)
            )
            if any(s is None for s in parsed):
                step["parse_failures"] += 1
                logger.debug("judge answer without a (complete) score: %r", reply.text[:500])
            else:
                self._cache_put(text, parsed)
            for members in pending[text]:
                for i, score in zip(members, parsed, strict=True):
                    scores[i] = score

        for key, value in step.items():
            self.totals[key] += value
        scored = sum(s is not None for s in scores)
        given = [s for s in scores if s is not None]
        if given:
            low, high = self._score_range or (min(given), max(given))
            self._score_range = (min(low, *given), max(high, *given))
        self._count_scored(n, scored, answered)
        if log_metric is not None:
            # TRL averages what each process logs; every process logs each step, so a count logged times the
            # number of processes reads as the total over all of them.
            processes = int(os.environ.get("WORLD_SIZE", "1"))
            for key, value in step.items():
                log_metric(f"judge/{key}", float(value) * processes)
            if latencies:
                log_metric("judge/latency_s", sum(latencies) / len(latencies))
            log_metric("judge/scored_fraction", scored / max(n, 1))
        return scores

    def run_summary(self) -> str | None:
        """One line for the end-of-run summary: how much the judge scored, and a warning when too little."""
        judged, scored = self.totals["judged"], self.totals["scored"]
        if not judged:
            return None
        line = (
            f"judge `{self.__name__}`: scored {scored} of {judged} trajectories ({scored / judged:.0%}); "
            f"{self.totals['failures']} failed calls, {self.totals['parse_failures']} replies without a score"
        )
        calls, failures = self.totals["calls"], self.totals["failures"]
        if calls and failures >= calls / 2:  # the endpoint, not the model's replies, is what failed
            line += (
                f". WARNING: {failures} of {calls} judge calls failed (first: {self._first_error}): check that "
                f"{self.endpoint or 'the judge'} is up and serves model `{self.model}`; those trajectories got no "
                "judge reward"
            )
        elif scored / judged < self.min_scored_fraction:
            line += (
                f". WARNING: below min_scored_fraction {self.min_scored_fraction:.0%} ({self.totals['low_steps']} "
                f"of {self.totals['steps']} steps had answers without a score): the raw replies are in the trajectory files "
                f"(`notes.{self.__name__}_reply`); use a judge model that follows the rubric's score format, "
                "or a server that accepts a JSON schema (structured_output)"
            )
        elif scored > 1 and self._score_range is not None and self._score_range[0] == self._score_range[1]:
            line += (
                f". WARNING: every scored trajectory got the same score ({self._score_range[0]:g}), so the judge "
                f"told none apart and added no signal: read its replies (`notes.{self.__name__}_reply`; a copied "
                "example score is a common cause) and try another judge model or rubric"
            )
        return line

    def _count_scored(self, n: int, scored: int, answered: int) -> None:
        """Totals for the summary; a warning when the judge answered but too few answers held a score.

        (Failed calls have a warning of their own; this one is for a judge that talks but never scores.)
        """
        self.totals["judged"] += n
        self.totals["scored"] += scored
        self.totals["steps"] += 1
        if answered and scored / answered < self.min_scored_fraction:
            self.totals["low_steps"] += 1
            if self.totals["low_steps"] % LOW_SCORED_WARN_EVERY == 1:
                logger.warning(
                    "LLM judge `%s` scored %d of the %d trajectories it answered about this step (below "
                    "min_scored_fraction %.0f%%, %d such steps so far): raw replies are in the trajectory files "
                    "(notes.%s_reply)",
                    self.__name__, scored, answered, 100 * self.min_scored_fraction, self.totals["low_steps"],
                    self.__name__,
                )  # fmt: skip

    def _note(self, trajectory: list[Trajectory] | None, members: list[int], reply: str) -> None:
        if trajectory is None:
            return
        for i in members:
            if trajectory[i] is not None:
                trajectory[i].notes[f"{self.__name__}_reply"] = reply

    # -- rendering ---------------------------------------------------------------------------------------------

    def _question(self, i: int, prompts: list[Any], trajectory: list[Trajectory] | None, columns: dict) -> str:
        if self.question_column in columns and columns[self.question_column] is not None:
            return str(columns[self.question_column][i])
        return question_text(trajectory[i].prompt if trajectory is not None else prompts[i])

    def _render_completion(
        self, i: int, completions: list[Any], trajectory: list[Trajectory] | None, code: str
    ) -> str:
        if trajectory is not None and trajectory[i] is not None:
            return render_trajectory(trajectory[i], code, self.max_tool_output_chars)
        return completion_text(completions[i], code)

    @staticmethod
    def _raw_completion(i: int, completions: list[Any], trajectory: list[Trajectory] | None) -> str:
        if trajectory is not None and trajectory[i] is not None:
            return trajectory[i].completion_text
        return raw_completion(completions[i])

    # -- cache and warnings ------------------------------------------------------------------------------------

    def _key(self, text: str) -> str:
        return hashlib.sha256(f"{self.backend.describe()}\0{self.mode}\0{text}".encode()).hexdigest()

    def _cache_get(self, text: str) -> list[float | None] | None:
        if not self.cache_size:
            return None
        key = self._key(text)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        return None

    def _cache_put(self, text: str, scores: list[float | None]) -> None:
        if not self.cache_size:
            return
        self._cache[self._key(text)] = scores
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    def _warn_failure_once(self, error: str | None) -> None:
        if not self._warned_failure:
            self._warned_failure = True
            logger.warning(
                "LLM judge call failed after retries (%s): that trajectory gets no judge reward; further failures "
                "are only counted in judge/failures",
                error,
            )
