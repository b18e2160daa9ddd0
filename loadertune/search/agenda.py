"""What the search runs next: its own queue ahead of Optuna's proposals.

The queue is ours, not Optuna's, so that what the last result asks for (a climb) goes before
the remaining seeds; each setting is planned once.
"""

from __future__ import annotations

from collections.abc import Iterable

from loadertune.config import Config
from loadertune.search import plan
from loadertune.search.ledger import Ledger
from loadertune.search.space import SearchSpace


class Agenda:
    """The settings to run next, first first, for one search over ``ledger``'s results."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self._queue: list[Config] = []
        self._planned: set[Config] = set()  # planned by a climb (each once)

    def add_seeds(self, seeds: Iterable[Config]) -> None:
        """Seeds run after everything already planned, each unless measured already."""
        self._queue += [s for s in seeds if s not in self.ledger.values]

    def update(self, space: SearchSpace) -> None:
        """Plan what the results so far ask for: the climbs (see :func:`plan.climbs`), ahead of
        the remaining seeds, each once."""
        self._queue[:0] = plan.climbs(
            self.ledger.values, self.ledger.blocked, space, skip=self._planned_before
        )

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

    def _planned_before(self, config: Config) -> bool:
        seen = config in self._planned or config in self.ledger.values
        self._planned.add(config)
        return seen or self.ledger.frontier.rules_out(config) is not None
