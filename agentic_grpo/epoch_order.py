"""The order of the training rows, a function of the epoch, so that a resumed run draws what the interrupted one did.

TRL's `RepeatSampler` shuffles with one generator that each pass over the data advances: the second epoch's order
is the second permutation it draws. A run resumed in its second epoch builds a fresh sampler, whose first pass is
the first permutation, so it trains on the first epoch's order again. `EpochOrder` draws, for epoch `e`, the
permutation the stock sampler draws on its `e`-th pass (the generator is re-seeded and advanced `e` times), so an
uninterrupted run sees exactly TRL's order and a resumed one the same. The Trainer tells the sampler its epoch
(`set_epoch`) before each pass, through Accelerate's data loader.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from trl.trainer.utils import RepeatSampler


class EpochOrder(RepeatSampler):
    """TRL's `RepeatSampler` whose pass over the data depends on the epoch it is told, not on earlier passes."""

    epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        if self.shuffle and self.seed is not None:
            self.generator.manual_seed(self.seed)
            for _ in range(self.epoch):  # the permutations of the earlier epochs
                torch.randperm(self.num_samples, generator=self.generator)
        return super().__iter__()


class ResumableOrder:
    """Mix-in for the trainer (listed before `GRPOTrainer`): its training sampler is an `EpochOrder`."""

    def _get_train_sampler(self, dataset: Any = None) -> Any:
        stock = super()._get_train_sampler(dataset)
        if type(stock) is not RepeatSampler:  # a sampler of TRL's we do not know: left as it is
            return stock
        return EpochOrder(
            stock.data_source, stock.mini_repeat_count, batch_size=stock.batch_size, repeat_count=stock.repeat_count,
            shuffle=stock.shuffle, seed=stock.seed,
        )  # fmt: skip
