"""EpochLengths: the share of each epoch a loop takes, as the epochs of a loader that
breaks early, peeks once, or runs whole are counted."""

from __future__ import annotations

import pytest
from torch.utils.data import DataLoader

from loadertune.trials.inside.epochs import EpochLengths


def _epoch(lengths: EpochLengths, loader: DataLoader, take: int | None) -> None:
    """One ``iter(loader)`` as a loop does it: ``take`` batches then break (None: to the end)."""
    for i, _ in enumerate(lengths.count(iter(loader), len(loader))):
        if take is not None and i + 1 == take:
            break


@pytest.mark.parametrize(
    ("takes", "expected"),
    [
        ([None, None, None], 160),  # whole epochs
        ([2, 2, 2], 32),  # 2 of 10 batches a time
        ([1, None, None], 160),  # a peek at one batch, then whole epochs
        ([1, 3, 3, 3], 48),  # a peek, then 3 a time
        ([3], 160),  # one epoch over: too soon to tell
    ],
)
def test_an_epoch_is_as_long_as_the_loop_makes_it(takes: list[int | None], expected: int) -> None:
    loader = DataLoader(list(range(160)), batch_size=16)
    lengths = EpochLengths()
    for take in takes:
        _epoch(lengths, loader, take)
    lengths.close()
    assert lengths.scale(160) == expected


def test_a_counted_epoch_answers_len_as_the_loaders_iterator_does() -> None:
    loader = DataLoader(list(range(160)), batch_size=16)
    assert len(EpochLengths().count(iter(loader), len(loader))) == 10
