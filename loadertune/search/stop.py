"""When a search may stop early: the rules that decide that exploring further cannot help.

The barrel principle: a loop that almost never waits for data is limited by its step, and a
faster loader buys nothing. :func:`bottleneck` is the verdict for one measurement (also what the
diagnosis reports); :func:`loader_keeps_up` is the early stop built on it.
"""

from __future__ import annotations

from loadertune.search.probe import Estimates
from loadertune.trials import TrialResult

INPUT_BOUND_BLOCKED = 0.20  # waiting this much of the loop on data: the loader is the bottleneck
COMPUTE_BOUND_GAIN = 0.05  # a faster loader could win back less than this: the step is


def bottleneck(blocked_fraction: float, noise: float = 0.0) -> str:
    """``"input"``, ``"compute"`` or ``"balanced"`` from the fraction of time blocked on data.

    A perfect loader removes the blocked time and no more: the loop then runs ``1 / (1 - b)``
    times faster. The loop is compute-bound when that gain is one this machine cannot resolve:
    below 5%, or below half the spread of the window's own sub-window rates (``noise``), so a
    noisy or slower machine widens the band instead of flipping the verdict. At 20% blocked or
    more (a gain of 25% or more) it is input-bound whatever the noise; in between, balanced.
    """
    if blocked_fraction >= INPUT_BOUND_BLOCKED:
        return "input"
    gain = blocked_fraction / max(1e-9, 1.0 - blocked_fraction)
    if gain <= max(COMPUTE_BOUND_GAIN, noise / 2):
        return "compute"
    return "balanced"


def loader_keeps_up(baseline: TrialResult | None, est: Estimates | None) -> bool:
    """The baseline is compute-bound and the loader keeps up: tuning the loader cannot help.

    Its loop almost never waits for data (see :func:`bottleneck`), and it runs at (nearly) the
    step's own rate with the data in memory, over a whole epoch. The second test catches workers
    that keep up by stealing the step's CPUs, and workers that keep up once started but are
    started again at every epoch: a short epoch can spend most of its time waiting for them,
    which the blocked fraction of a steady window never shows (``persistent_workers`` helps).
    """
    if baseline is None or not baseline.ok or baseline.measurement is None or est is None:
        return False
    m = baseline.measurement
    return (
        bottleneck(m.blocked_fraction, m.spread or 0.0) == "compute"
        and (baseline.epoch_samples_per_s or 0.0) >= 0.85 * est.consumer_ceiling
    )
