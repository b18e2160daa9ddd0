"""How much of each epoch of the tuned loader a training loop takes: a loop that breaks after N
steps (or a ``zip`` with a shorter loader) begins the next epoch early, so its epochs, and how
often non-persistent workers start again, are that long, not the loader's length. A script
trial's child (:mod:`loadertune.trials.inside.controller`) and a live run
(:mod:`loadertune.api.live`) count the epochs they hand the loop."""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from typing import Any


class _CountedEpoch:
    """An epoch of the target as the script's loop takes it: how many batches, and whether it
    ran to its end."""

    __slots__ = ("_it", "batches", "ended", "taken")

    def __init__(self, it: Iterator[Any], batches: int) -> None:
        self._it, self.batches, self.taken, self.ended = it, batches, 0, False

    def __iter__(self) -> _CountedEpoch:
        return self

    def __next__(self) -> Any:
        try:
            batch = next(self._it)
        except StopIteration:
            self.ended = True
            raise
        self.taken += 1
        return batch

    def __len__(self) -> int:
        return len(self._it)  # type: ignore[arg-type]  # (as the epoch's own iterator answers)


class EpochLengths:
    """How much of each epoch of the target the script takes. A loop that breaks after N steps
    (or a ``zip`` with a shorter loader) begins the next epoch early: its epochs, and so how
    often non-persistent workers start again, are that long, not the loader's length.

    Only the epoch under way is held (as :class:`~loadertune.trials.inside.metered.Metered` holds
    it): an abandoned epoch's iterator must go when the script drops it, its workers with it."""

    def __init__(self) -> None:
        self._shares: list[float] = []  # of the epochs over: the share of the loader's taken
        self._open: _CountedEpoch | None = None

    def count(self, it: Iterator[Any], batches: int | None) -> Iterator[Any]:
        """``it``, an epoch the script begins, counted (``batches``: the loader's length)."""
        self.close()
        if not batches:  # the length is unknown: nothing to compare with
            return it
        self._open = _CountedEpoch(it, batches)
        return self._open

    def close(self) -> None:
        """The epoch under way is over (the script begins the next): its share is kept."""
        epoch, self._open = self._open, None
        if epoch is not None and (epoch.taken or epoch.ended):
            self._shares.append(1.0 if epoch.ended else min(1.0, epoch.taken / epoch.batches))

    def between_epochs(self) -> bool:
        """The epoch the script took last ran to its end, and no other has begun: the script's
        loop over the tuned loader is over, or between two epochs."""
        return self._open is not None and self._open.ended

    def fraction(self) -> float | None:
        """The mean share of the loader's epoch the script took per ``iter()`` (so start-ups
        per sample come out right), over the epochs it has left (began the next one) or
        finished, the first left out: a script may peek at one batch (``next(iter(loader))``)
        before its loop. None until two are over."""
        shares = self._shares + ([1.0] if self._open is not None and self._open.ended else [])
        return statistics.fmean(shares[1:]) if len(shares) >= 2 else None

    def scale(self, epoch_samples: int | None) -> int | None:
        """The samples of an epoch as the script takes it: ``epoch_samples`` (the loader's)
        times :meth:`fraction`, once known."""
        taken = self.fraction()
        if not epoch_samples or taken is None or taken >= 1.0:
            return epoch_samples
        return max(1, round(epoch_samples * taken))
