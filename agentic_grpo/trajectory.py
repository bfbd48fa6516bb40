"""What one rollout is: a prompt, then alternating model and tool segments.

The prompt a rollout starts from carries its dataset row (`with_row`): TRL hands `rollout_func` the prompts alone.

Token ids are stored once, per segment; the completion ids and the loss mask that
TRL trains on are derived from the segments, so they can never disagree.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

SegmentRole = Literal["prompt", "model", "tool"]


@dataclass
class ToolCall:
    """A tool call as the model wrote it: the parsed name and arguments, and the raw text."""

    name: str
    arguments: dict[str, Any]
    raw_text: str = ""


@dataclass
class ToolResult:
    """What running a tool produced.

    `output` is what the model sees (already including any error text); `error` is set
    when the call failed (unknown tool, bad arguments, exception, non-zero exit),
    `timed_out` when the wall timeout killed it, `truncated` when output was cut.
    """

    output: str
    error: str | None = None
    timed_out: bool = False
    truncated: bool = False
    seconds: float = 0.0
    exit_code: int | None = None
    printed: str = ""  # what a pure tool's own code printed, bounded (`agentic_grpo.environment`); not shown

    @property
    def ok(self) -> bool:
        return self.error is None and not self.timed_out


@dataclass
class Segment:
    """A run of tokens with one author. Only `model` segments are trained on."""

    role: SegmentRole
    token_ids: list[int]
    text: str
    logprobs: list[float] | None = None
    """The sampling log-prob of each token of a `model` segment, when the backend reports them (vLLM):
    what TRL's importance-sampling correction compares the trainer's own log-probs with."""
    policy_version: int | None = None
    """For a `model` segment of an asynchronous run, the optimizer steps taken by the weights that sampled its
    tokens (`agentic_grpo.async_rollouts`); None when the trainer's own weights sampled it."""

    @property
    def trainable(self) -> bool:
        return self.role == "model"


FinishReason = Literal["final_answer", "max_turns", "length", "eos", "error", "running"]
"""Why a trajectory ended: `final_answer` (a complete turn gave one), `max_turns` (out of turns),
`length` (a turn was cut by `max_tokens_per_turn` or the trajectory's token budget: whatever that
turn wrote, answer or tool call, is not acted on), `error` (a sub-agent's generation failed, e.g. its
endpoint did not answer; the reason is in `notes["error"]`). Only `length` counts as truncated."""


@dataclass
class Delegation:
    """Where a sub-agent's trajectory came from: which agent, which policy, which call of which parent turn."""

    agent: str
    """The sub-agent's name: the tool the parent called (its role)."""
    policy: str
    """What generated its tokens: `policy` (the parent's weights), `adapter:NAME` (a LoRA adapter on the
    policy's base model), `model:PATH` (a frozen model of its own) or `endpoint:URL#MODEL`."""
    row: dict[str, Any]
    """The sub-task row the child was prompted from and its environment was reset with (`question` = the task)."""
    parent_turn: int
    """The parent's model turn (0-based) whose tool call started it."""
    call_index: int
    """Its call's index in the parent's `tool_calls`."""
    adapter: str | None = None
    """The LoRA adapter that generated its tokens, when it ran on the policy's base model."""


@dataclass
class Trajectory:
    """One sampled rollout of a query.

    `segments[0]` is the prompt; everything after it is the completion. `tool_calls`
    pairs each parsed call with its result, in order. `final_answer` is the text after
    the format's answer marker, or None when the model never gave one.
    """

    prompt: Any
    segments: list[Segment]
    tool_calls: list[tuple[ToolCall, ToolResult]] = field(default_factory=list)
    final_answer: str | None = None
    finish_reason: FinishReason = "running"
    turns: int = 0
    malformed_turns: int = 0
    rewards: dict[str, float | None] = field(default_factory=dict)
    """Each reward function's score, by name, once the trajectory is scored (None: that reward gave none)."""
    turn_rewards: list[float] = field(default_factory=list)
    """Reward paid for each model turn (index k = the k-th model turn), by the environment or a reward plug-in."""
    turn_states: list[str | None] = field(default_factory=list)
    """The environment's state hash before each model turn (None: the environment defines none)."""
    paid_facts: dict[str, int] = field(default_factory=dict)
    """Each fact already paid for, with the turn that earned it: a fact is paid at most once."""
    turn_advantages: list[float] | None = None
    """The advantage each model turn's tokens were trained with, when a turn-level estimator set them."""

    def pay(self, turn: int, fact: Any, amount: float) -> bool:
        """Add `amount` to turn `turn`'s reward unless `fact` was already paid for; True when paid.

        Paying once per fact is what keeps per-turn rewards from being farmed: repeating a
        correct tool call earns nothing the second time.
        """
        if not 0 <= turn < self.turns:
            raise ValueError(f"turn {turn} does not exist: the trajectory has {self.turns} model turn(s)")
        key = str(fact)
        if key in self.paid_facts:
            return False
        if len(self.turn_rewards) < self.turns:
            self.turn_rewards.extend([0.0] * (self.turns - len(self.turn_rewards)))
        self.paid_facts[key] = turn
        self.turn_rewards[turn] += float(amount)
        return True

    reward: float | None = None
    """The weighted reward the advantage was computed from (a missing reward counted as its group's mean)."""
    environment_reward: float | None = None
    """What the environment paid for the trajectory from its own state (a TRL environment's `get_reward()`)."""
    notes: dict[str, Any] = field(default_factory=dict)
    """What rewards recorded about this trajectory (e.g. a judge's raw reply), saved with it."""
    children: list[Trajectory] = field(default_factory=list)
    """Trajectories of the sub-agents this one called, in call order. Their tokens are not in this trajectory's
    completion: only each child's answer is, as the observation of the call (a tool segment, never trained)."""
    delegation: Delegation | None = None
    """Set on a sub-agent's trajectory: who called it and with what (None for a trajectory of the policy itself)."""

    @property
    def prompt_ids(self) -> list[int]:
        return [t for s in self.segments if s.role == "prompt" for t in s.token_ids]

    @property
    def completion_segments(self) -> list[Segment]:
        return [s for s in self.segments if s.role != "prompt"]

    @property
    def completion_ids(self) -> list[int]:
        return [t for s in self.completion_segments for t in s.token_ids]

    @property
    def completion_logprobs(self) -> list[float] | None:
        """Sampling log-probs aligned with `completion_ids` (0.0 on tool tokens, which the loss masks), or
        None when a model segment has none."""
        segments = self.completion_segments
        if any(s.trainable and s.logprobs is None for s in segments):
            return None
        return [lp for s in segments for lp in (s.logprobs if s.trainable else [0.0] * len(s.token_ids))]

    @property
    def loss_mask(self) -> list[int]:
        """1 for every completion token the model sampled, 0 for tool output tokens."""
        return [int(s.trainable) for s in self.completion_segments for _ in s.token_ids]

    @property
    def completion_text(self) -> str:
        return "".join(s.text for s in self.completion_segments)

    @property
    def invalid(self) -> bool:
        """No final answer, or at least one turn the format could not parse."""
        return self.final_answer is None or self.malformed_turns > 0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready record (token ids included) for trajectory files and `agentic-grpo show`."""
        return {
            "prompt": self.prompt,
            "segments": [{k: v for k, v in asdict(s).items() if v is not None} for s in self.segments],
            "tool_calls": [{"call": asdict(c), "result": asdict(r)} for c, r in self.tool_calls],
            "final_answer": self.final_answer,
            "finish_reason": self.finish_reason,
            "turns": self.turns,
            "malformed_turns": self.malformed_turns,
            **({"rewards": dict(self.rewards)} if self.rewards else {}),
            **({"turn_rewards": list(self.turn_rewards)} if any(self.turn_rewards) else {}),
            **({"paid_facts": dict(self.paid_facts)} if self.paid_facts else {}),
            **({"turn_states": list(self.turn_states)} if any(s is not None for s in self.turn_states) else {}),
            **({"turn_advantages": list(self.turn_advantages)} if self.turn_advantages is not None else {}),
            **({"notes": dict(self.notes)} if self.notes else {}),
            **({"delegation": asdict(self.delegation)} if self.delegation is not None else {}),
            **({"children": [child.to_dict() for child in self.children]} if self.children else {}),
        }


def plain_columns(row: dict[str, Any]) -> dict[str, Any]:
    """The row's scalar columns and flat lists of scalars (a task's intermediate `values`, its `expected_tools`):
    what a trajectory record keeps of its dataset row. Nested columns (the chat `prompt`, which the trajectory
    already holds as it was read; a task's metadata) and objects are left out."""
    return {k: v for k, v in row.items() if _scalar(v) or (isinstance(v, list) and all(_scalar(x) for x in v))}


def _scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool, type(None)))


# Which trajectories a token budget cut, from the rollout's finish reason rather than the last token. TRL calls a
# completion truncated when its last token is not EOS; a multi-turn trajectory often ends on a stop string
# (`Observation:`, `</python>`) or runs out of turns without being cut at all, so that test mislabels them. Here a
# trajectory is truncated exactly when its finish reason is `length`: a turn or the whole trajectory hit its token
# budget. This drives `completions/clipped_ratio` (`agentic_grpo.rollout_metrics.clipped_metrics`) and
# `mask_truncated_completions`, applied through the loss mask.


def is_truncated(trajectory: Trajectory) -> bool:
    """True when a token budget cut the trajectory (finish reason `length`)."""
    return trajectory.finish_reason == "length"


def masked_loss_mask(trajectory: Trajectory, mask_truncated: bool) -> list[int]:
    """The trajectory's loss mask; all zeros when `mask_truncated` and a budget cut it."""
    mask = trajectory.loss_mask
    return [0] * len(mask) if mask_truncated and is_truncated(trajectory) else mask


class MessagesOfRow(list):
    """A conversational prompt that carries its dataset row (`with_row`)."""

    row: dict[str, Any]


class TextOfRow(str):
    """A plain-text prompt that carries its dataset row (`with_row`)."""

    row: dict[str, Any]


def with_rows(inputs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Copies of a generation's rows, each `prompt` carrying the row's other columns (`with_row`), and those
    columns."""
    inputs = [dict(row) for row in inputs]
    rows = [{k: v for k, v in row.items() if k != "prompt"} for row in inputs]
    for row, columns in zip(inputs, rows, strict=True):
        row["prompt"] = with_row(row["prompt"], columns)
    return inputs, rows


def with_row(prompt: list | str, row: dict[str, Any]) -> MessagesOfRow | TextOfRow:
    """`prompt` carrying its dataset row's other columns as `.row`: TRL hands `rollout_func` the prompts alone,
    and the environments and rewards need the row. It survives TRL's deep copy and is an ordinary list of
    messages (or string) everywhere else."""
    carrier = TextOfRow(prompt) if isinstance(prompt, str) else MessagesOfRow(prompt)
    carrier.row = row
    return carrier
