"""What a search has measured so far, and what it makes of each new result."""

from __future__ import annotations

import statistics

from loadertune.config import Config
from loadertune.measure.failures import FailureKind
from loadertune.search import plan
from loadertune.search.frontier import Frontier
from loadertune.search.study import Previous
from loadertune.trials import TrialResult


class Ledger:
    """Every trial of this run, the best rate per setting (earlier runs included), every rate of
    this run, and the counts the stop rules read.

    Args:
        memory_margin: share of GPU memory the frontier keeps free.
        min_gain: relative gain over the robust best that counts as an improvement.
    """

    def __init__(self, *, memory_margin: float, min_gain: float) -> None:
        self.trials: list[TrialResult] = []
        self.values: dict[Config, float] = {}  # best rate per setting, earlier runs included
        self.samples: dict[Config, list[float]] = {}  # every full rate measured in this run
        self.whole: dict[Config, list[bool]] = {}  # each of those: a whole epoch's, or a window's
        self.blocked: dict[Config, float] = {}  # blocked fraction of each explored setting
        self.frontier = Frontier(margin=memory_margin)
        self.best: TrialResult | None = None
        self.best_value = 0.0
        self.since_gain = 0  # trials since the last gain (the patience count)
        self.n_run = 0  # trials of the probe and the exploration
        self.n_explored = 0  # trials of the exploration alone
        self._min_gain = min_gain

    def add(self, result: TrialResult) -> None:
        """Record one trial; all but the replay (which skips loading) teach something, but for
        what fails at the replay's batch size, loading or not: the user's code rejecting it,
        or the step running out of GPU memory (the same step, the same batch)."""
        self.trials.append(result)
        if result.phase == "replay":
            if result.error in (FailureKind.BATCH_SIZE_REJECTED, FailureKind.OOM):
                self.frontier.learn(result)
            return
        self.n_run += result.phase != "confirm"
        self.n_explored += result.phase == "search"
        self.frontier.learn(result)
        if result.failure is not None:
            self.since_gain += 1
            return
        value = result.epoch_samples_per_s
        if value is None or result.pruned or result.phase == "confirm":
            self.since_gain += result.phase != "confirm"
            return
        # A gain beats the robust best (the median of the three best), not one lucky figure.
        bar = self.robust_best()
        self.values[result.config] = max(value, self.values.get(result.config, 0.0))
        self.samples.setdefault(result.config, []).append(value)
        whole = result.measurement is not None and result.measurement.whole_epoch
        self.whole.setdefault(result.config, []).append(whole)
        if result.measurement is not None and result.phase == "search":
            self.blocked[result.config] = result.measurement.blocked_fraction
        if value > bar * (1 + self._min_gain):
            self.since_gain = 0
        else:
            self.since_gain += 1
        if value > self.best_value:
            self.best, self.best_value = result, value

    def add_kept(self, result: TrialResult) -> None:
        """A trial an earlier run of the study measured and kept (its opening's): known as this
        run's are, but neither counted as run by this one nor pooled with this run's rates."""
        self.trials.append(result)
        if result.phase == "replay":
            return
        self.frontier.learn(result)
        value = result.epoch_samples_per_s
        if result.failure is None and not result.pruned and value is not None:
            self.values[result.config] = max(value, self.values.get(result.config, 0.0))
            if value > self.best_value:
                self.best, self.best_value = result, value

    def samples_of_kind(
        self, whole_epoch: dict[Config, bool]
    ) -> tuple[dict[Config, list[float]], dict[Config, list[float]]]:
        """This run's rates of each setting split in two: those measured as the later trials
        of it will be (a whole epoch, or a window: ``whole_epoch``, per setting; a setting not
        in it keeps all its rates here), and the rest."""
        same: dict[Config, list[float]] = {}
        other: dict[Config, list[float]] = {}
        for config, rates in self.samples.items():
            wanted = whole_epoch.get(config)
            for rate, whole in zip(rates, self.whole[config], strict=True):
                kind = same if wanted is None or whole == wanted else other
                kind.setdefault(config, []).append(rate)
        return same, other

    def sub_windows(self) -> dict[Config, list[float]]:
        """The sub-window rates of this run's full measurements of each setting."""
        subs: dict[Config, list[float]] = {}
        for t in self.trials:
            if t.ok and t.measurement and not t.pruned and not t.kept and t.phase != "replay":
                subs.setdefault(t.config, []).extend(t.measurement.sub_window_samples_per_s)
        return subs

    def walls(self) -> dict[Config, float]:
        """How long this run's measurements of each setting took, median: first batch, warm-up
        and window (a baseline at a large batch may take many typical trials). A script's
        process start is left out: the confirmation runs in a launch already up."""
        walls: dict[Config, list[float]] = {}
        for t in self.trials:
            m = t.measurement
            if t.ok and m is not None and not t.kept and t.phase != "replay":
                walls.setdefault(t.config, []).append(m.first_batch_s + m.warmup_s + m.window_s)
        return {c: statistics.median(w) for c, w in walls.items()}

    def robust_best(self) -> float:
        return plan.robust_best(self.values)

    def add_previous(self, previous: Previous) -> None:
        """What an earlier run of the study measured and saw fail."""
        self.values.update(previous.values)
        self.frontier.learn_previous(list(previous.values), previous.failed)
        self.best_value = max(self.values.values(), default=0.0)

    def best_figures(self) -> dict[str, object] | None:
        """The best setting and its rates, for a search that ends without a result."""
        if self.best is None:
            return None
        return {
            "loader_kwargs": self.best.params,
            "samples_per_s": self.best.samples_per_s,
            "epoch_samples_per_s": self.best.epoch_samples_per_s,
        }
