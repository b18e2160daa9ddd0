"""How long a trial may take: learned from the trials so far, never cut to the budget left.

The budget decides whether a trial starts (the driver's stop rules); a limit cut to what is
left of it would turn the tuner's own budget into the user's "timeout" or "no loader" error.
An exploring trial still running at the deadline is stopped there (``Limits.ends_by``) and
recorded as skipped, not failed.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from loadertune.trials import Limits, TrialResult

UNKNOWN_HANG_S = 15.0  # before any trial: scripts import, CUDA initialises


def typical_wall(trials: Sequence[TrialResult], *, default_s: float) -> float:
    """The median wall time of the successful trials (replays left out: they skip loading)."""
    walls = [t.wall_s for t in trials if t.ok and t.phase != "replay"]
    return statistics.median(walls) if walls else default_s


def overhead_s(trials: Sequence[TrialResult]) -> float:
    """The median of what the successful trials took beyond what they measured (first batch,
    warm-up, window): a launch, the loader built, the workers stopped. 0 before any."""
    extra = [
        t.wall_s - (t.measurement.first_batch_s + t.measurement.warmup_s + t.measurement.window_s)
        for t in trials
        if t.ok and t.measurement is not None and t.phase != "replay"
    ]
    return max(0.0, statistics.median(extra)) if extra else 0.0


# An epoch that takes no longer than this many window trials is measured whole (short_epoch_s).
WHOLE_EPOCH_WITHIN = 2.0


def short_epoch_s(
    trials: Sequence[TrialResult], *, epoch_samples: int, rate: float, default_wall_s: float
) -> float | None:
    """What an epoch of ``epoch_samples`` takes at ``rate`` (the best so far), when that is
    short enough to measure whole: :data:`WHOLE_EPOCH_WITHIN` of this run's window trials at
    most (their :func:`typical_wall`). None: measure windows.

    A window's rate stands for an epoch only when the epoch is long beside the workers' start
    and their buffer's filling and draining. In a short one (the image example's 14 batches of
    128 with 12 in flight), a window sees the step drain a full buffer while the workers idle,
    and the epoch's first step, its slowest (every worker is busy filling the buffer), is left
    out: an in-process trial read 1.14 of what whole epochs ran at, hot-swapped ones 0.79 to
    0.99 (``python scripts/bench_epoch_edges.py --images [--swap]``); trials of whole epochs
    read 0.88 to 1.05 (``--whole``). An epoch that takes about a trial costs little more."""
    if rate <= 0:
        return None
    windows = [t for t in trials if not (t.measurement and t.measurement.whole_epoch)]
    epoch_s = epoch_samples / rate
    return (
        epoch_s
        if epoch_s <= WHOLE_EPOCH_WITHIN * typical_wall(windows, default_s=default_wall_s)
        else None
    )


def limits_for(
    trials: Sequence[TrialResult],
    *,
    startup_timeout_s: float,
    default_wall_s: float,
    memory_budget_bytes: int | None,
) -> Limits:
    """Limits from what the workload showed: start-up up to 4 times the slowest trial seen (at
    least 15 s, at most ``startup_timeout_s``), a hang at 20 times the slowest batch (at least
    5 s), and the whole trial at 4 typical trials plus that start-up."""
    ok = [t for t in trials if t.ok and t.measurement and t.measurement.n_batches]
    if ok:
        per_batch = max(
            t.measurement.window_s / t.measurement.n_batches for t in ok if t.measurement
        )
        hang = max(5.0, 20 * per_batch)
        start = min(startup_timeout_s, max(15.0, 4 * max(t.wall_s for t in ok)))
    else:
        hang, start = UNKNOWN_HANG_S, startup_timeout_s
    timeout = 4 * typical_wall(trials, default_s=default_wall_s) + start
    return Limits(
        timeout_s=timeout,
        startup_s=min(start, timeout),
        hang_s=hang,
        memory_budget_bytes=memory_budget_bytes,
    )
