"""Fine-tuning batches: the task's examples in length buckets, reshuffled every epoch."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import IterableDataset

from components.core.seeds import mix
from components.model.inputs import Encoded, collate, length_batches


class Batches(IterableDataset):
    """Length-bucketed batches, reshuffled every epoch from (seed, epoch); `index` holds each
    example's position in the split."""

    def __init__(self, examples: list[Encoded], kind: str, batch_size: int, seed: int | None):
        self.examples, self.kind, self.batch_size, self.seed = examples, kind, batch_size, seed
        self.lengths = [len(e.ids) for e in examples]
        self.epoch = 0

    def __len__(self) -> int:
        return math.ceil(len(self.examples) / self.batch_size)

    def order(self) -> list[list[int]]:
        """This epoch's batches, as example indices (in one sorted pass without a seed)."""
        rng = None if self.seed is None else np.random.default_rng(mix(self.seed, self.epoch))
        return length_batches(self.lengths, self.batch_size, rng)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        order = self.order()
        self.epoch += 1
        for b in order:
            yield {**collate([self.examples[i] for i in b], self.kind), "index": torch.tensor(b)}
