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
from loadertune.measure.failures import FailureKind
from loadertune.search import plan
from loadertune.search.ledger import Ledger
from loadertune.search.probe import Estimates
from loadertune.search.space import SearchSpace, widened

# What more workers run out of (a GPU's memory grows with the batch instead), and a trial too
# slow to start or deliver (more workers start slower still).
BACK_OFF_KINDS = frozenset(
    {
        FailureKind.WORKER_KILLED,
        FailureKind.SHM_EXHAUSTED,
        FailureKind.TOO_MANY_FILES,
        FailureKind.HOST_OOM,
        FailureKind.MEMORY_BUDGET,
        FailureKind.TIMEOUT,
    }
)
# After a memory-budget failure: the workers that fit in this share of the budget, by the memory
# seen at the failure. The budget itself leaves a fifth of the available RAM free, and a loader
# that waits on I/O is often fastest with as many workers as fit: with 0.8 here, the simulator's
# picks missed that band (``scripts/simulate.py``, below 0.95: 27.1% -> 26.6% in-process and
# 29.1% -> 27.7% for scripts over 1000 workloads of seed 2157311).
FIT_SHARE = 0.95


class Agenda:
    """The settings to run next, first first, for one search over ``ledger``'s results."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self._queue: list[Config] = []
        self._planned: set[Config] = set()  # planned by a climb or another batch (each once)
        self._verified = False
        self._failures_seen = 0  # failures already answered by a back-off
        self.memory_budget: int | None = None  # the trial tree's PSS limit, once known

    def add_seeds(self, seeds: Iterable[Config]) -> None:
        """Seeds run after everything already planned, each unless measured already."""
        self._queue += [s for s in seeds if s not in self.ledger.values]

    def update(self, space: SearchSpace, est: Estimates | None = None) -> SearchSpace:
        """Plan what the results so far ask for (``est``: the probe's estimates, when it ran);
        returns the space, widened when the best sat at its edge."""
        self._verify_largest_batch(space)
        self._back_off(space)
        space = self._widen(space)
        self._climb(space)
        self._more_workers(space)
        self._other_batch(space, est)
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
        """Once, as soon as two batch sizes have run and the exploration has begun: measure the
        largest batch the memory model calls safe, at the best setting's loader settings (not at
        the probe's, whose loading is deliberately starved)."""
        ledger = self.ledger
        if self._verified or not ledger.n_explored or ledger.frontier.memory_model()[0] is None:
            return
        self._verified = True
        size = ledger.frontier.largest_safe_batch(list(space.batch_sizes))
        if ledger.best and size and not any(c.batch_size == size for c in ledger.values):
            target = dataclasses.replace(ledger.best.config, batch_size=size)
            self._queue.insert(0, space.nearest(target))

    def _back_off(self, space: SearchSpace) -> None:
        """A setting that ran out of a host resource (RAM, shared memory, file descriptors) or of
        time with several workers: try it next with as many workers as the memory seen at the
        failure says fit (in :data:`FIT_SHARE` of the budget), or else half as many. The
        frontier rules out everything at least as demanding; stepping down one worker at a time
        (what the sampler proposes next to a failure) would take dozens of trials."""
        ledger = self.ledger
        failed = ledger.frontier.failed
        for config, kind in failed[self._failures_seen :]:
            if kind not in BACK_OFF_KINDS or config.num_workers <= 1:
                continue
            fewer = config.num_workers // 2
            usage = next((t.resources for t in reversed(ledger.trials) if t.config == config), None)
            if (
                kind == FailureKind.MEMORY_BUDGET
                and self.memory_budget
                and usage is not None
                and usage.worker_pss_bytes
                and usage.pss_bytes
                and usage.n_workers
            ):
                main = usage.pss_bytes - usage.n_workers * usage.worker_pss_bytes
                fit = int(FIT_SHARE * (self.memory_budget - main) / usage.worker_pss_bytes)
                fewer = max(1, min(config.num_workers - 1, fit))
            target = space.nearest(dataclasses.replace(config, num_workers=fewer))
            if target not in ledger.values:
                self._queue.insert(0, target)
        self._failures_seen = len(failed)

    def _climb(self, space: SearchSpace) -> None:
        """Plan the climbs (see :func:`plan.climbs`) ahead of the remaining seeds, each once."""

        self._queue[:0] = plan.climbs(
            self.ledger.values, self.ledger.blocked, space, skip=self._planned_before
        )

    def _more_workers(self, space: SearchSpace) -> None:
        """Plan the best with more workers though it hardly waits (see
        :func:`plan.more_workers`), ahead of the climbs, each once."""
        config = plan.more_workers(
            self.ledger.values, self.ledger.blocked, space, skip=self._planned_before
        )
        if config is not None:
            self._queue.insert(0, config)

    def _other_batch(self, space: SearchSpace, est: Estimates | None) -> None:
        """Plan another batch size for a best whose step sets the pace (see
        :func:`plan.other_batch`) first, each once."""
        config = plan.other_batch(
            self.ledger.values,
            self.ledger.blocked,
            space,
            skip=self._planned_before,
            step_rate=(lambda bs: est.at(bs).consumer_ceiling) if est is not None else None,
        )
        if config is not None:
            self._queue.insert(0, config)

    def _planned_before(self, config: Config) -> bool:
        seen = config in self._planned or config in self.ledger.values
        self._planned.add(config)
        return seen or self.ledger.frontier.rules_out(config) is not None

    def _widen(self, space: SearchSpace) -> SearchSpace:
        """No rule of thumb caps the workers: when the best sits at the edge of the range, still
        waits for data, and only the CPU rule set that edge, double the range and try past the
        edge next."""
        if self.ledger.best is None:
            return space
        best = self.ledger.best.config
        if self.ledger.blocked.get(best, 1.0) < plan.CLIMB_BLOCKED:
            return space  # its step sets the pace: more workers buy nothing
        wider = widened(space, best_workers=best.num_workers)
        if wider is not space:
            self._queue[:0] = plan.past_the_edge(best, wider)
            self.ledger.since_gain = 0  # a new region: patience starts again
        return wider
