"""Which samples each rank sees (in one process: the sampler takes rank and world size explicitly)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import TensorDataset

from workers.runtime.data import TrainBatches, val_batches


def ids(size: int) -> TensorDataset:
    """A data set whose x is each sample's own id."""
    return TensorDataset(torch.arange(size), torch.zeros(size, dtype=torch.long))


def rank_batches(size: int, world_size: int = 2, **kwargs) -> list[TrainBatches]:
    kwargs = {"per_worker": 4, "accumulation_steps": 2, "seed": 7, **kwargs}
    return [TrainBatches(ids(size), rank=rank, world_size=world_size, **kwargs) for rank in range(world_size)]


def epoch_ids(batches: TrainBatches, epoch: int, skip_steps: int = 0) -> list[int]:
    return [i for step in batches.epoch(epoch, skip_steps) for x, _ in step for i in x.tolist()]


def test_each_epoch_splits_the_whole_set_into_disjoint_shards():
    ranks = rank_batches(64)
    for epoch in (1, 2, 3):
        shards = [epoch_ids(batches, epoch) for batches in ranks]
        assert len(shards[0]) == len(shards[1]) == 32
        assert not set(shards[0]) & set(shards[1])
        assert sorted(shards[0] + shards[1]) == list(range(64))


def test_the_order_changes_between_epochs_and_repeats_for_the_same_epoch():
    batches = rank_batches(64)[0]
    assert epoch_ids(batches, 1) != epoch_ids(batches, 2)
    assert epoch_ids(batches, 2) == epoch_ids(rank_batches(64)[0], 2)  # a resumed run sees the same order


def test_uneven_sets_give_equal_shards_of_whole_steps_without_duplicates():
    ranks = rank_batches(70)  # 35 per rank: 4 steps of 2 x 4 samples, 3 left over on each
    shards = [epoch_ids(batches, 1) for batches in ranks]
    assert [len(shard) for shard in shards] == [32, 32]
    assert len(set(shards[0] + shards[1])) == 64
    assert all(batches.steps_per_epoch == 4 for batches in ranks)


def test_steps_are_micro_batches_and_resuming_skips_the_done_ones():
    batches = rank_batches(64)[1]
    steps = list(batches.epoch(2))
    assert len(steps) == batches.steps_per_epoch == 4
    assert all(len(step) == 2 and all(len(x) == 4 for x, _ in step) for step in steps)
    assert epoch_ids(batches, 2, skip_steps=3) == epoch_ids(batches, 2)[3 * 8 :]


def test_a_set_smaller_than_one_step_is_refused():
    with pytest.raises(ValueError, match="smaller than one step"):
        rank_batches(10)


@pytest.mark.parametrize(("size", "batch_size"), [(31, 4), (32, 4), (5, 8), (1, 2)])
def test_validation_shards_cover_the_set_once_in_the_same_number_of_batches(size, batch_size):
    counted, batch_counts = [], []
    for rank in range(2):
        batches = list(val_batches(ids(size), rank=rank, world_size=2, batch_size=batch_size))
        batch_counts.append(len(batches))
        counted += [i for (x, _), real in batches for i in x[:real].tolist()]
    assert sorted(counted) == list(range(size))
    assert batch_counts[0] == batch_counts[1]  # an FSDP forward is a collective
