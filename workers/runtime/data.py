"""Which samples each rank sees: training micro-batches grouped per optimizer step, and validation shards.

Training uses a ``DistributedSampler`` with ``drop_last=True`` (per epoch the ranks' shards are
disjoint and equally long: no padding duplicates) and only whole optimizer steps: every step is
``per_worker x accumulation_steps`` samples on every rank, so every rank makes the same number of
steps and each step's gradient is a true mean over the global batch. Each epoch drops the remainder
(fewer than one global batch); the shuffle changes with ``set_epoch``, so different samples each time.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

Batch = tuple[torch.Tensor, torch.Tensor]


def _loader(dataset: Dataset, indices: list[int], batch_size: int) -> DataLoader:
    # Its own generator: creating an iterator draws a seed from it, and from the global RNG
    # otherwise, which would shift dropout masks between a resumed run and an uninterrupted one.
    return DataLoader(dataset, batch_size=batch_size, sampler=indices, generator=torch.Generator())


class TrainBatches:
    """This rank's micro-batches, one list of ``accumulation_steps`` of them per optimizer step."""

    def __init__(
        self, dataset: Dataset, *, rank: int, world_size: int, per_worker: int, accumulation_steps: int, seed: int
    ) -> None:
        self.dataset = dataset
        self.per_worker = per_worker
        self.accumulation_steps = accumulation_steps
        self.sampler = DistributedSampler(
            dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed, drop_last=True
        )
        self.samples_per_step = per_worker * accumulation_steps
        self.steps_per_epoch = len(self.sampler) // self.samples_per_step
        if self.steps_per_epoch == 0:
            raise ValueError(
                f"the training set ({len(dataset)} samples, {len(self.sampler)} per worker) is smaller than "
                f"one step's batch per worker ({per_worker} x {accumulation_steps} micro-batches)"
            )

    def epoch_indices(self, epoch: int) -> list[int]:
        """This rank's sample indices for ``epoch``, in order (the same on every run with the same seed)."""
        self.sampler.set_epoch(epoch)
        return list(self.sampler)[: self.steps_per_epoch * self.samples_per_step]

    def epoch(self, epoch: int, skip_steps: int = 0) -> Iterator[list[Batch]]:
        """The optimizer steps of ``epoch`` after the first ``skip_steps`` (already done before a resume)."""
        indices = self.epoch_indices(epoch)[skip_steps * self.samples_per_step :]
        micro_batches = iter(_loader(self.dataset, indices, self.per_worker))
        for _ in range(self.steps_per_epoch - skip_steps):
            yield [next(micro_batches) for _ in range(self.accumulation_steps)]


def val_batches(dataset: Dataset, *, rank: int, world_size: int, batch_size: int) -> Iterator[tuple[Batch, int]]:
    """This rank's validation batches with how many of their leading samples count.

    The shards (every ``world_size``-th sample) are disjoint and cover the set; the shorter ones are
    padded with sample 0 so that every rank runs the same number of forward passes (an
    FSDP forward is a collective). The padding is excluded from the metrics.
    """
    indices = list(range(rank, len(dataset), world_size))
    real = len(indices)
    padded = -(-len(dataset) // world_size)
    indices += [0] * (padded - real)
    for start, batch in zip(range(0, padded, batch_size), _loader(dataset, indices, batch_size), strict=False):
        yield batch, max(0, min(batch_size, real - start))
