"""How long a trial will take, and whether it fits in what is left of the budget.

Trials differ thirtyfold in time (a batch of slow samples, many workers' start-up), so each
setting's own expected time decides whether it runs, not the run's typical trial. A mixin of
:class:`~loadertune.search.driver.Search`: it reads the search's ledger, settings, runner and
clock.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from loadertune.config import Config
from loadertune.search import plan
from loadertune.search.limits import overhead_s, short_epoch_s, typical_wall
from loadertune.search.probe import Estimates

if TYPE_CHECKING:
    from loadertune.measure.window import WindowSpec
    from loadertune.search.ledger import Ledger
    from loadertune.search.settings import SearchSettings
    from loadertune.trials import TrialRunner


class TrialTiming:
    """The search's time predictions (see the module docstring)."""

    # What the search (driver.Search) provides; declared for the type checker only.
    ledger: Ledger
    settings: SearchSettings
    runner: TrialRunner
    _est: Estimates | None
    _remaining: Callable[[], float]
    _window: Callable[..., WindowSpec]
    _confirm_cost: Callable[[], float]

    def _typical_wall(self) -> float:
        """The typical trial's wall, the user's own settings' left out: one slow baseline is
        no sample of what the search runs. Before any other trial: theirs, or when longer, a
        window and the run's overhead per trial (a script's launch). Each setting's own time is
        checked where it is chosen (:meth:`_past_the_budget`, :meth:`_trial_fits`)."""
        trials = self.ledger.trials
        others = [t for t in trials if t.phase != "baseline"]
        default = self.settings.trial_window_s + 1.0 + overhead_s(trials)
        if not any(t.ok and t.phase != "replay" for t in others):
            return min(default, typical_wall(trials, default_s=default))
        return typical_wall(others, default_s=default)

    def _short_epoch_s(self, config: Config | None) -> float | None:
        """An epoch's time when ``config``'s epochs are short enough to measure whole: at the
        best rate so far, or at ``config``'s own when this run measured it slower (a slow
        baseline's whole epoch could take minutes where the best's takes a second) or, with no
        workers, when the probe says it is (twice its figure, at most: see
        :meth:`_in_process_ceiling`)."""
        if self.settings.live or not self.runner.epoch_samples:
            return None
        rate = self.ledger.robust_best()
        own = self.ledger.samples.get(config) if config is not None else None
        if own:
            rate = min(rate, max(own))
        elif config is not None and not config.num_workers:
            rate = min(rate, self._in_process_ceiling(config, self._est))
        return short_epoch_s(
            self.ledger.trials,
            epoch_samples=self.runner.epoch_samples,
            rate=rate,
            default_wall_s=self.settings.trial_window_s + 1.0,
        )

    def _fits(self, n: int = 1) -> bool:
        """``n`` more trials fit in what is left of the budget (as long as the typical one)."""
        return self._remaining() >= n * self._typical_wall()

    def _trial_fits(self, config: Config, rate: float, n: int = 1) -> bool:
        """``n`` trials as long as one of ``config`` fit in what is left of the budget, judged
        by its own expected time at ``rate`` samples/s (:func:`plan.trial_s`, plus the run's
        overhead per trial), not by the run's typical trial: trials differ thirtyfold. Without
        a rate, the typical trial decides."""
        if rate <= 0:
            return self._fits(n)
        return self._remaining() >= n * self._expected_s(config, rate, "probe")

    def _expected_s(
        self,
        config: Config,
        rate: float,
        phase: str = "search",
        *,
        loader_bound: bool = True,
        overhead: bool = True,
    ) -> float:
        """What a trial of ``config`` at ``rate`` samples/s is expected to take: its own
        (:func:`plan.trial_s`) and, with ``overhead``, the run's overhead per trial. A whole
        epoch's window lasts the epoch at ``rate``, not at the best so far's (a slow best would
        time every faster setting's epoch as long as its own)."""
        window = self._window(config, phase)
        if window.whole_epoch and rate > 0 and self.runner.epoch_samples:
            window = dataclasses.replace(window, window_s=self.runner.epoch_samples / rate)
        own = plan.trial_s(config, window, rate, loader_bound=loader_bound)
        return own + overhead_s(self.ledger.trials) if overhead else own

    def _past_the_budget(self, config: Config, est: Estimates | None = None) -> str | None:
        """Why ``config``'s trial would not end within the budget (the confirmation's time kept
        aside), or None. The trial's own expected time decides (:func:`plan.trial_s` and the
        run's overhead per trial), not the typical trial's, which may be a slow setting's: it
        must receive its first batch, its warm-up and its window, which at a large batch or
        with many workers can take many seconds. The rate is the highest of the best so far,
        half what the probe's estimates predict for ``config``, and what its workers make at
        the best pace per worker measured (up to the prediction; without estimates, that pace
        alone): many workers are tried because they are expected to be that much faster, and
        judging their batches by a slow best would skip every setting that could beat it.
        Half, not all, of a prediction: storage that serves few requests at once, which the
        probe cannot see, can make many workers far slower than predicted (such a trial is
        also cut at the deadline: ``Limits.ends_by``).

        Before any setting has been explored, a trial is judged at the whole prediction and
        without the run's overhead per trial, which is then the baseline's (in a script, the
        launch's start, which a hot-swapped trial does not pay): a setting skipped then ends
        the search at the baseline for certain, one that runs long is cut at the deadline,
        where the budget ends anyway."""
        rate = self.ledger.robust_best()
        loader_bound = True  # unknown: the shorter warm-up, so that no setting is skipped wrongly
        explored = self.ledger.n_explored > 0
        if est is not None:
            at = est.at(config.batch_size)
            predicted = at.predicted_samples_per_s(config.num_workers)
            if config.num_workers:
                share = 0.5 if explored else 1.0
                rate = max(rate, share * predicted, min(predicted, self._workers_pace(config)))
                # The workers set the pace only below every other ceiling; at the step's or the
                # CPUs' the buffer stays full and the whole warm-up drains it.
                loader_bound = predicted < 0.95 * at.hard_ceiling
            else:
                rate = min(rate, self._in_process_ceiling(config, est))
        elif config.num_workers:
            rate = max(rate, self._workers_pace(config))
        # its own expected time: the run's typical trial may be a slow setting's
        needed = (
            self._expected_s(config, rate, loader_bound=loader_bound, overhead=explored)
            if rate > 0
            else self._typical_wall()
        )
        if self._remaining() - self._confirm_cost() >= needed:
            return None
        return f"a trial would take about {needed:.0f} s, more than the budget has left"

    def _workers_pace(self, config: Config) -> float:
        """``config``'s workers at the most samples/s a worker made in a setting measured with
        workers (0: none yet): what times a setting of more workers without the probe's
        estimates (a slow best's rate would time it far too long), and with them up to their
        prediction."""
        pace = max(
            (v / c.num_workers for c, v in self.ledger.values.items() if c.num_workers),
            default=0.0,
        )
        return config.num_workers * pace

    @staticmethod
    def _in_process_ceiling(config: Config, est: Estimates | None) -> float:
        """The most a trial of ``config`` without workers is expected to make, for its time:
        twice the probe's model of it (loading and step take turns in one process; no worker
        count lifts it), rather than the best's rate, which may be far above it."""
        if est is None:
            return math.inf
        return 2 * est.at(config.batch_size).predicted_samples_per_s(0)
