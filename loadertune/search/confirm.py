"""Re-measure the finalists side by side before declaring a winner.

The best of many noisy measurements is biased upwards (the winner's curse), and a shared machine
drifts, so the search's own figures do not decide. The finalists and the user's baseline are
measured again in interleaved rounds (A B C, B C A, C A B, ...: no setting always runs first or
last). The rounds go on while time is left; a setting that failed every round leaves them. The
winner is the cheapest setting within the noise of the highest median (:func:`cheapest_tied`).

The winner clearly beats the baseline only when its worst round beats the baseline's best round;
with three rounds each, that happens by chance with probability 1/20 when the two are really
equal. With fewer rounds the sub-window rates decide (:func:`sub_windows_clearly_better`).
Otherwise the result is reported as within noise."""

from __future__ import annotations

import math
import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from loadertune.config import Config
from loadertune.trials import TrialResult

SIMPLER_WITHIN = 0.02  # a simpler setting this close to the best median wins


def interleaved(configs: Sequence[Config], rounds: int) -> list[Config]:
    """Round ``r`` runs the list rotated by ``r``."""
    n = len(configs)
    return [configs[(i + r) % n] for r in range(rounds) for i in range(n)]


@dataclass
class Confirmation:
    """Fresh, interleaved measurements of the finalists and the baseline."""

    baseline: Config
    values: dict[Config, list[float]] = field(default_factory=dict)  # epoch samples/s per round
    results: dict[Config, list[TrialResult]] = field(default_factory=dict)
    prior_sub_windows: dict[Config, list[float]] = field(default_factory=dict)  # this run's
    # the settings the rounds left out (failed every round, or on a live run behind the baseline)
    left_out: set[Config] = field(default_factory=set)

    def median(self, config: Config) -> float | None:
        vals = self.values.get(config)
        return statistics.median(vals) if vals else None

    def spread(self, config: Config) -> float:
        """(max - min) / median of the rounds: the noise seen for this setting."""
        vals = self.values.get(config) or []
        if len(vals) < 2:
            return 0.0
        return (max(vals) - min(vals)) / statistics.median(vals)

    @property
    def winner(self) -> Config | None:
        """Of the settings the rounds kept (one they left out does not come back on its few
        figures from another time), the cheapest within the noise of the highest median
        (:func:`cheapest_tied`): noise does not pick the luckier sample."""
        ranked = [
            c
            for c in self.values
            if self.values[c] and not self.failed_here(c) and c not in self.left_out
        ]
        # Where the deadline cut the rounds short, a finalist they never measured does not win
        # on its exploration figure.
        ranked = [c for c in ranked if self.measured_here(c)] or ranked
        if not ranked:
            return None
        return cheapest_tied(ranked, self.values, self.baseline)

    def measured_here(self, config: Config) -> bool:
        """``config`` has a figure from these rounds."""
        return any(
            r.epoch_samples_per_s is not None and not r.pruned
            for r in self.results.get(config) or []
        )

    def failed_here(self, config: Config) -> bool:
        """``config`` ran in these rounds and failed every time: whatever the exploration
        measured of it, it is no winner (nor worth another round)."""
        results = self.results.get(config) or []
        return bool(results) and all(r.failure is not None for r in results)

    def sub_window_rates(self, config: Config) -> list[float]:
        """The sub-window rates of every measurement of ``config`` in this run: the rounds', and
        the exploration's (a baseline the deadline left out of the rounds still has its own)."""
        return [
            r
            for res in self.results.get(config, [])
            if res.ok and res.measurement
            for r in res.measurement.sub_window_samples_per_s
        ] + self.prior_sub_windows.get(config, [])

    @property
    def clearly_better(self) -> bool:
        """The winner's worst round beats the baseline's best.

        With fewer than two rounds of each (a tight budget), the sub-window rates of the
        measurements there are decide (:func:`sub_windows_clearly_better`).
        """
        return self.clearly_better_than_baseline(sub_windows=True)

    def clearly_better_than_baseline(self, *, sub_windows: bool) -> bool:
        """:attr:`clearly_better`; ``sub_windows`` False: the rounds alone may say so (two of
        each at least). Sub-windows of one window share its moment's load: on a machine other
        processes keep busy, they are no independent figures."""
        win = self.winner
        if win is None or win == self.baseline:
            return False
        ours_subs, theirs_subs = self.sub_window_rates(win), self.sub_window_rates(self.baseline)
        # A gap no load of the machine explains is clear whatever else holds, busy or not.
        if sub_windows_clearly_better(ours_subs, theirs_subs, APART_MARGIN):
            return True
        if not self.results.get(self.baseline):
            # The deadline came before the baseline's turn: its figures are from another moment
            # (a script's first launch, whose opening window may read low).
            return False
        ours, theirs = self.values.get(win, []), self.values.get(self.baseline, [])
        if not theirs:  # the baseline failed every round it ran: anything that runs is better
            return True
        if len(ours) < 2 or len(theirs) < 2:
            return sub_windows and sub_windows_clearly_better(ours_subs, theirs_subs)
        return rates_clearly_better(ours, theirs)

    @property
    def within_noise(self) -> bool:
        return not self.clearly_better

    @property
    def speedup(self) -> float | None:
        win, base = self.winner, self.median(self.baseline)
        if win is None or not base:
            return None
        best = self.median(win)
        return best / base if best else None


def complexity(
    config: Config, baseline: Config, value: float
) -> tuple[bool, int, int, bool, bool, float]:
    """What ``config`` costs, to rank settings a noisy figure cannot tell apart: the baseline
    first, then fewer workers, a smaller prefetch, no pinning, the baseline's batch size, and
    last the higher ``value``."""
    return (
        config != baseline,
        config.num_workers,
        (config.prefetch_factor or 0) if config.num_workers else 0,
        config.pin_memory,
        config.batch_size != baseline.batch_size,
        -value,
    )


# A dearer setting must beat a cheaper one by this many standard errors of the difference of
# their median log rates (the noise this run measured), and by SIMPLER_WITHIN at least; the margin
# is capped at TIE_CAP, so that a cheaper setting never wins from much further behind.
TIE_Z = 1.0
TIE_CAP = 0.05


def cheapest_tied(
    configs: Sequence[Config], values: Mapping[Config, Sequence[float]], baseline: Config
) -> Config:
    """Of ``configs`` (each with figures in ``values``), the cheapest (:func:`complexity`)
    whose median is within the noise of the leader's: a dearer setting wins only by more than
    the effect size."""
    sigma = noise_sigma(values)
    logs = _log_rates(configs, values)
    means = {c: statistics.median(v) for c, v in logs.items() if v}
    if not means:
        return configs[0]
    lead = max(means, key=lambda c: means[c])

    def tied(c: Config) -> bool:
        se = sigma * math.sqrt(1 / len(logs[c]) + 1 / len(logs[lead]))
        margin = min(TIE_CAP, max(SIMPLER_WITHIN, TIE_Z * se))
        return means[lead] - means[c] <= margin

    close = [c for c in means if tied(c)]
    return min(close, key=lambda c: complexity(c, baseline, math.exp(means[c])))


def simplest_close(values: Mapping[Config, float], baseline: Config) -> Config:
    """Of ``values`` (not empty), the simplest setting within :data:`SIMPLER_WITHIN` of the
    best figure (see :func:`complexity`)."""
    best = max(values.values())
    close = [c for c in values if values[c] >= (1 - SIMPLER_WITHIN) * best]
    return min(close, key=lambda c: complexity(c, baseline, values[c]))


def rates_clearly_better(ours: Sequence[float], theirs: Sequence[float]) -> bool:
    """Our worst rate beats their best, with at least two of each."""
    return len(ours) >= 2 and len(theirs) >= 2 and min(ours) > max(theirs)


# One measurement each: each rate may be off by 20% (the spread of repeated trials on a shared
# machine), in opposite directions: 1.2 / 0.8.
SINGLE_TRIAL_MARGIN = 1.5
# Figures from different moments of the search (the baseline's from its opening, where the
# rounds' deadline left it out): one may be a neighbour's burst at half speed, the other 30%
# high, and a script's opening window reads low.
APART_MARGIN = 3.0
BOOTSTRAP_DRAWS = 2000


def sub_windows_clearly_better(
    ours: Sequence[float], theirs: Sequence[float], margin: float = SINGLE_TRIAL_MARGIN
) -> bool:
    """The test of one measurement each, on their sub-window rates: ours all beat theirs
    (:func:`rates_clearly_better`), or our mean, resampled, beats theirs by more than
    ``margin`` in 97.5% of draws (a seeded bootstrap). With a margin above
    :data:`SINGLE_TRIAL_MARGIN` (figures from different moments), only the second test.

    The second test is for windows whose sub-windows differ by more than noise (short epochs
    spread them widely): the mean is what the window's rate is made of."""
    if margin <= SINGLE_TRIAL_MARGIN and rates_clearly_better(ours, theirs):
        return True
    if len(ours) < 2 or len(theirs) < 2:
        return False
    rng = random.Random(0)
    beats = sum(
        statistics.fmean(rng.choices(ours, k=len(ours)))
        > margin * statistics.fmean(rng.choices(theirs, k=len(theirs)))
        for _ in range(BOOTSTRAP_DRAWS)
    )
    return beats >= 0.975 * BOOTSTRAP_DRAWS


# Measures the settings in turn, calling back with each result; stops when the callback says so.
RunInTurn = Callable[[Sequence[Config], Callable[[TrialResult], bool]], object]


def confirm(
    run_in_turn: RunInTurn,
    finalists: Sequence[Config],
    baseline: Config,
    *,
    rounds: int,
    deadline: float,
    trial_wall_s: float,
    walls: Mapping[Config, float] | None = None,
    measure_first: bool = False,
    prior: Mapping[Config, Sequence[float]] | None = None,
    stand_in: Mapping[Config, Sequence[float]] | None = None,
    prior_sub_windows: Mapping[Config, Sequence[float]] | None = None,
    live: bool = False,
    clock: Callable[[], float] = time.monotonic,
) -> Confirmation:
    """Measure ``finalists`` and ``baseline`` in up to ``rounds`` interleaved rounds: fewer if
    the deadline, a ``clock()`` value, comes first, or once one setting alone is left (a
    setting that failed every round it ran leaves). ``run_in_turn`` measures a round's
    settings in one go (a script's runner keeps its process between calls), and stops when a
    trial would end past the deadline: each trial is expected to take ``trial_wall_s``, or its
    setting's time in ``walls`` when longer. ``measure_first``: the first finalist is
    measured even past the deadline. ``prior``: rates measured earlier in this run (the
    exploration's), pooled with the rounds: more samples per setting, so one unlucky round
    decides less; ``stand_in``: earlier rates measured otherwise than the rounds measure (a
    script's baseline, a window before the epoch's length was known, where the rounds take whole
    epochs), which stand in for a setting without ``prior`` rates only until the rounds
    measure it (a launch's first window may read low);
    ``prior_sub_windows``: their sub-window rates, for the test of a tight budget's rounds.
    ``live``: the rounds run on a real training run, whose own setting is the baseline; a
    finalist behind it leaves too (:func:`ahead_of_baseline`)."""
    configs = list(dict.fromkeys([*finalists, baseline]))
    order: list[Config] = list(configs)  # grows a round at a time, rotated
    outcome = Confirmation(
        baseline=baseline,
        prior_sub_windows={c: list(v) for c, v in (prior_sub_windows or {}).items()},
    )
    standing_in = _pool_earlier(outcome, configs, prior or {}, stand_in or {})
    done = 0

    def fits() -> bool:
        """The next trial (its setting's own wall time when known) ends by the deadline."""
        if done >= len(order):
            return False
        wall = max(trial_wall_s, (walls or {}).get(order[done], 0.0))
        return clock() + wall <= deadline

    def record(result: TrialResult) -> bool:
        nonlocal done
        done += 1
        config = result.config
        outcome.results.setdefault(config, []).append(result)
        value = result.epoch_samples_per_s
        outcome.values.setdefault(config, [])
        if value is not None and not result.pruned:
            if config in standing_in:
                standing_in.discard(config)
                outcome.values[config] = []
            outcome.values[config].append(value)
        return fits()

    if not (measure_first or fits()):
        return outcome
    for r in range(rounds):
        if r:
            order += [configs[(i + r) % len(configs)] for i in range(len(configs))]
            if not fits():
                break
        run_in_turn(order[done:], record)
        if done < len(order):  # the deadline came within the round
            break
        configs = _still_in(outcome, configs, live=live)
        if len(configs) <= 1:
            break
    return outcome


def _pool_earlier(
    outcome: Confirmation,
    configs: Sequence[Config],
    prior: Mapping[Config, Sequence[float]],
    stand_in: Mapping[Config, Sequence[float]],
) -> set[Config]:
    """Start ``outcome``'s figures with this run's earlier ones; returns the settings whose
    figures only stand in until the rounds measure them."""
    standing_in: set[Config] = set()
    for config in configs:
        if prior.get(config):
            outcome.values[config] = list(prior[config])
        elif stand_in.get(config):
            outcome.values[config] = list(stand_in[config])
            standing_in.add(config)
    return standing_in


def _still_in(outcome: Confirmation, configs: Sequence[Config], *, live: bool) -> list[Config]:
    """The settings the next round measures: one that failed every round it ran leaves (the
    baseline only after two such rounds: a baseline that fails twice is clearly beaten); on a
    live run, one behind the baseline leaves too."""
    baseline, runs = outcome.baseline, outcome.results
    kept = [
        c for c in configs if not outcome.failed_here(c) or (c == baseline and len(runs[c]) < 2)
    ]
    if live:
        kept = ahead_of_baseline(kept, outcome.values, baseline)
    outcome.left_out.update(c for c in configs if c not in kept)
    return kept


# Until settings have been measured again, the noise is taken to be this (log rate, between two
# trials of one setting), with this weight in degrees of freedom: trials on a shared machine
# differ by 5-30%.
PRIOR_SIGMA, PRIOR_DOF = 0.2, 3


def noise_sigma(values: Mapping[Config, Sequence[float]]) -> float:
    """The spread of log rates between measurements of one setting, pooled over the settings
    measured more than once, shrunk towards PRIOR_SIGMA."""
    ss, dof = PRIOR_DOF * PRIOR_SIGMA**2, PRIOR_DOF
    for vals in values.values():
        logs = [math.log(v) for v in vals if v > 0]
        if len(logs) >= 2:
            ss += statistics.variance(logs) * (len(logs) - 1)
            dof += len(logs) - 1
    return math.sqrt(ss / dof)


def _log_rates(
    configs: Sequence[Config], values: Mapping[Config, Sequence[float]]
) -> dict[Config, list[float]]:
    return {c: [math.log(v) for v in values.get(c, []) if v > 0] for c in configs}


def ahead_of_baseline(
    configs: Sequence[Config], values: Mapping[Config, Sequence[float]], baseline: Config
) -> list[Config]:
    """On a live run, the settings that may still replace the baseline (the setting the
    training runs): those ahead of it by mean log rate, and the baseline. Each round of one
    behind it is training time at a slower setting, and the switch needs most of its rates to
    beat the baseline's (:func:`~loadertune.search.plan.switch_pays`): one behind after its
    rounds and the exploration's figures seldom gets there. With only the baseline left, the
    rounds end."""
    logs = _log_rates(configs, values)
    if len(logs.get(baseline, [])) < 2:
        return list(configs)
    base = statistics.fmean(logs[baseline])
    return [c for c in configs if c == baseline or not logs[c] or statistics.fmean(logs[c]) > base]
