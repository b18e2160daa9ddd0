"""What the search runs next: its own queue ahead of Optuna's proposals.

The queue is ours, not Optuna's, so that what the last result asks for (a climb, a wider
range, the check of the largest batch) goes before the remaining seeds. The rules that fill it
are the functions of :mod:`loadertune.search.plan`; this module keeps their order and makes
sure each setting is planned once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from loadertune.config import Config
from loadertune.search import plan
from loadertune.search.ledger import Ledger
from loadertune.search.space import SearchSpace, widened


class Agenda:
    """The settings to run next, first first, for one search over ``ledger``'s results."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self._queue: list[Config] = []
        self._climbed: set[Config] = set()  # settings a climb planned (each once)
        self._verified = False

    def add_seeds(self, seeds: Iterable[Config]) -> None:
        """Seeds run after everything already planned, each unless measured already."""
        self._queue += [s for s in seeds if s not in self.ledger.values]

    def update(self, space: SearchSpace) -> SearchSpace:
        """Plan what the results so far ask for; returns the space, widened when the best sat at
        its edge."""
        self._verify_largest_batch(space)
        space = self._widen(space)
        self._climb(space)
        return space

    def next(self, space: SearchSpace) -> Config | None:
        """The first planned setting still worth running, taken off the queue; None: let
        Optuna's sampler propose."""
        while self._queue:
            config = self._queue.pop(0)
            if (
                config not in self.ledger.values
                and space.rejects(config) is None
                and self.ledger.frontier.rules_out(config) is None
            ):
                return config
        return None

    def _verify_largest_batch(self, space: SearchSpace) -> None:
        """Once, as soon as two batch sizes have run: measure the largest batch the memory model
        calls safe, at the best setting's loader settings."""
        ledger = self.ledger
        if self._verified or ledger.frontier.memory_model()[0] is None:
            return
        self._verified = True
        size = ledger.frontier.largest_safe_batch(list(space.batch_sizes))
        if ledger.best and size and not any(c.batch_size == size for c in ledger.values):
            target = dataclasses.replace(ledger.best.config, batch_size=size)
            self._queue.insert(0, space.nearest(target))

    def _climb(self, space: SearchSpace) -> None:
        """Plan the climbs (see :func:`plan.climbs`) ahead of the remaining seeds, each once."""

        def skip(config: Config) -> bool:
            seen = config in self._climbed or config in self.ledger.values
            self._climbed.add(config)
            return seen or self.ledger.frontier.rules_out(config) is not None

        self._queue[:0] = plan.climbs(self.ledger.values, self.ledger.blocked, space, skip=skip)

    def _widen(self, space: SearchSpace) -> SearchSpace:
        """No rule of thumb caps the workers: when the best sits at the edge of the range and
        only the CPU rule set that edge, double the range and try past the edge next."""
        if self.ledger.best is None:
            return space
        best = self.ledger.best.config
        wider = widened(space, best_workers=best.num_workers)
        if wider is not space:
            self._queue[:0] = plan.past_the_edge(best, wider)
            self.ledger.since_gain = 0  # a new region: patience starts again
        return wider
