"""A curriculum that draws the next training prompts from the kinds the policy is doing worst on.

Rows carry a kind (a dataset column named by the recipe's `curriculum_column`). Every scored batch updates a
moving score per kind (the mean of one reward, `curriculum_reward`, over that kind's trajectories, taken as
a value in [0, 1]); the sampler then draws kinds in proportion to `1 - score` (plus a floor, so a kind that is
done still comes back and a drift away from it shows). On the toolbox the policy drifts: training one kind's
tool raises that tool on every other kind's questions. A fixed pattern cannot follow that; this one sends the
kinds whose right tool the policy is losing back into training.

TRL's `RepeatSampler` fixes the order of prompts before training starts, and the `datasets` curricula are
fixed orders too; no library we use draws by live scores, so this module does. The draw is deterministic
(smooth weighted round robin, as in nginx's upstream balancer): the same scores give the same kinds on every
process, so data-parallel processes shard one sequence of prompts as TRL's sampler does.

The sampler chooses a batch's kinds when the data loader asks for the batch, which Accelerate does one batch
ahead: scores steer the batch after next. A resumed run starts its scores afresh.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import Sampler

FLOOR = 0.15  # the least weight a kind keeps, against a most-wanted kind's 1 + FLOOR
MOMENTUM = 0.5  # a kind's score: this much of its old score, the rest from its newest batch


class AdaptiveCurriculum:
    """Scores per kind and the draw of the next kind.

    Args:
        kinds: each row's kind, in dataset order.
        reward_name: the reward whose mean per kind is its score (None: every reward's weighted sum).
        column: the dataset column the kinds came from (the trainer reads each scored row's kind from it).
    """

    def __init__(self, kinds: Sequence[str], reward_name: str | None = None, column: str = "kind") -> None:
        if not kinds:
            raise ValueError("an adaptive curriculum needs rows to draw from")
        self.reward_name = reward_name
        self.column = column
        self.rows: dict[str, list[int]] = {}
        for index, kind in enumerate(kinds):
            self.rows.setdefault(str(kind), []).append(index)
        self.kinds = list(self.rows)
        self.scores: dict[str, float | None] = dict.fromkeys(self.kinds)  # None: not scored yet
        self.credit = dict.fromkeys(self.kinds, 0.0)
        self.drawn = dict.fromkeys(self.kinds, 0)

    def weight(self, kind: str) -> float:
        """How much `kind` is wanted: 1 + FLOOR before its first score, then 1 - score + FLOOR."""
        score = self.scores[kind]
        return 1.0 + FLOOR if score is None else 1.0 - min(max(score, 0.0), 1.0) + FLOOR

    def next_kinds(self, count: int) -> list[str]:
        """The kinds of the next `count` prompts: each the most-credited kind not yet in this batch (while
        there are others), so one update weighs several kinds' tools against each other."""
        chosen: list[str] = []
        for _ in range(count):
            weights = {kind: self.weight(kind) for kind in self.kinds}
            for kind, weight in weights.items():
                self.credit[kind] += weight
            free = [kind for kind in self.kinds if kind not in chosen] or self.kinds
            kind = max(free, key=lambda k: self.credit[k])  # ties: dataset order (max keeps the first)
            self.credit[kind] -= sum(weights.values())
            chosen.append(kind)
        return chosen

    def next_row(self, kind: str) -> int:
        """The next row of `kind`, its rows in dataset order, cycling."""
        rows = self.rows[kind]
        index = rows[self.drawn[kind] % len(rows)]
        self.drawn[kind] += 1
        return index

    def observe(self, kinds: Sequence[Any], scores: Sequence[float]) -> None:
        """Fold one scored batch in: `kinds[i]` and `scores[i]` of every trajectory (NaN = not scored)."""
        batch: dict[str, list[float]] = {}
        for kind, score in zip(kinds, scores, strict=True):
            if score == score and str(kind) in self.scores:  # NaN: the reward did not score it
                batch.setdefault(str(kind), []).append(float(score))
        for kind, values in batch.items():
            mean = sum(values) / len(values)
            old = self.scores[kind]
            self.scores[kind] = mean if old is None else MOMENTUM * old + (1 - MOMENTUM) * mean

    def scores_of(self, rewards: torch.Tensor, totals: torch.Tensor, reward_names: Sequence[str]) -> list[float]:
        """Each trajectory's score: its `reward_name` column of `rewards` (trajectories x rewards), or its weighted
        total when the curriculum follows no one reward."""
        if self.reward_name is None:
            return totals.tolist()
        return rewards[:, list(reward_names).index(self.reward_name)].tolist()

    def sampler(self, num_generations: int, generation_batch_size: int, repeat_count: int) -> CurriculumSampler:
        """A sampler in TRL's layout: `generation_batch_size // num_generations` prompts a batch, each repeated
        `num_generations` times, each batch `repeat_count` times (TRL: num_iterations * steps_per_generation)."""
        return CurriculumSampler(self, num_generations, generation_batch_size // num_generations, repeat_count)

    def metrics(self) -> dict[str, float]:
        """`curriculum/<kind>/score` (scored kinds) and `curriculum/<kind>/drawn` (prompts drawn so far)."""
        out = {f"curriculum/{kind}/score": score for kind, score in self.scores.items() if score is not None}
        out.update({f"curriculum/{kind}/drawn": float(count) for kind, count in self.drawn.items()})
        return out


class CurriculumSampler(Sampler):
    """TRL's `RepeatSampler` layout (each prompt `mini_repeat_count` times in a row, each batch of `batch_size`
    prompts `repeat_count` times) with the prompts drawn by an `AdaptiveCurriculum` as each batch is asked for.
    Endless: the Trainer stops at `max_steps`, which an adaptive curriculum needs (it has no epochs)."""

    def __init__(self, curriculum: AdaptiveCurriculum, mini_repeat_count: int, batch_size: int, repeat_count: int):
        self.curriculum = curriculum
        self.mini_repeat_count = mini_repeat_count
        self.batch_size = batch_size
        self.repeat_count = repeat_count

    def __iter__(self) -> Iterator[int]:
        for _ in itertools.count():
            kinds = self.curriculum.next_kinds(self.batch_size)
            batch = [self.curriculum.next_row(kind) for kind in kinds]
            for _ in range(self.repeat_count):
                for index in batch:
                    yield from [index] * self.mini_repeat_count

    def __len__(self) -> int:
        # The Trainer sizes an epoch from this; `max_steps` ends the run first.
        rows = sum(len(rows) for rows in self.curriculum.rows.values())
        return rows * self.mini_repeat_count * self.repeat_count


def check_curriculum_column(column: str | None, train_dataset: Any) -> None:
    """Refuse a `curriculum_column` the training data does not have (called before the model loads)."""
    columns = getattr(train_dataset, "column_names", None)
    if column is not None and (columns is None or column not in columns):
        raise ValueError(f"`curriculum_column: {column}` names no column of the training data (columns: {columns})")


def curriculum_for(args: Any, train_dataset: Any, reward_names: Sequence[str]) -> AdaptiveCurriculum | None:
    """The curriculum a config asks for (`curriculum_column`, `curriculum_reward`), or None; refuses a reward that is
    not among `reward_names`. The column is `check_curriculum_column`'s to check."""
    if args.curriculum_column is None:
        return None
    if args.curriculum_reward is not None and args.curriculum_reward not in reward_names:
        raise ValueError(
            f"`curriculum_reward: {args.curriculum_reward}` is not one of the rewards {list(reward_names)}"
        )
    return AdaptiveCurriculum(train_dataset[args.curriculum_column], args.curriculum_reward, args.curriculum_column)
