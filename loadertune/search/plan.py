"""What to measure next, and what to re-measure at the end: the search's rules as functions of
what it has measured (no clock, no Optuna), so each can be read and tested alone.

- :func:`robust_best`: the bar a gain, a prune or patience is measured against.
- :func:`climbs`: the barrel principle, one step (a best that waits for data gets workers).
- :func:`finalists`: the few re-measured side by side with the baseline.
- :func:`switch_pays`: on a live run, whether the winner's rates beat the running setting's
  often enough to leave it.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Mapping, Sequence

from loadertune.config import Config
from loadertune.measure.window import WindowSpec
from loadertune.search.space import START_PREFETCH, SearchSpace

MIN_EXPLORED = 3  # search trials that run before any time is kept for the confirmation
CLIMB_BLOCKED = 0.10  # the best setting waits this much for data: try it with more workers
CLIMB_WITHIN = 0.6  # ... if it reaches this share of the best rate
SWITCH_EVIDENCE = 0.8  # a live run leaves its own setting when this share of pairs says so


def robust_best(values: Mapping[Config, float]) -> float:
    """The median rate of the three best settings (0 before any): one lucky figure must not
    prune everything after it, or stall the search as "no improvement"."""
    top = sorted(values.values(), reverse=True)[:3]
    return statistics.median(top) if top else 0.0


def _with_workers(space: SearchSpace, config: Config, workers: int) -> Config:
    return space.nearest(
        dataclasses.replace(
            config,
            num_workers=min(space.max_workers, workers),
            prefetch_factor=config.prefetch_factor or START_PREFETCH,
            persistent_workers=config.persistent_workers and config.num_workers > 0,
        )
    )


def climbs(
    values: Mapping[Config, float],
    blocked: Mapping[Config, float],
    space: SearchSpace,
    *,
    skip: Callable[[Config], bool],
) -> list[Config]:
    """The barrel principle, one step: when the best explored setting of a batch size still
    waits for data (``blocked``: the explored settings' blocked fractions), its loader is the
    bottleneck, so try it with the workers that would feed its loop: ``w / (1 - blocked)``,
    at least one more and at most twice as many. The step's rate at that batch size is what
    they must reach; the probe, at the user's batch size, cannot predict it. Batch sizes far
    behind the best are left to the sampler. Best first; ``skip`` drops settings already run,
    planned or ruled out."""
    by_size: dict[int, Config] = {}
    for c in sorted(blocked, key=lambda c: values[c], reverse=True):
        by_size.setdefault(c.batch_size, c)
    top = max((values[c] for c in by_size.values()), default=0.0)
    out = []
    for best in by_size.values():
        waits = blocked[best]
        if (
            waits < CLIMB_BLOCKED
            or best.num_workers >= space.max_workers
            or values[best] < CLIMB_WITHIN * top
        ):
            continue
        w = best.num_workers
        # At most twice the workers per step: waiting may also come from a limit no worker
        # count lifts (the storage's own bandwidth), and a trial of many workers costs more.
        wanted = min(2 * w, math.ceil(w / (1 - min(waits, 0.9))))
        config = _with_workers(space, best, max(w + 1, wanted))
        if not skip(config):
            out.append(config)
    return out


def finalists(
    values: Mapping[Config, float],
    *,
    n: int,
    user_batch_size: int,
    may_win: Callable[[Config], bool],
) -> list[Config]:
    """The best ``n`` settings, and the best at the user's batch size."""
    ranked = sorted((c for c in values if may_win(c)), key=lambda c: values[c], reverse=True)
    if not ranked:
        return []
    top = ranked[:n]
    at_user_bs = [c for c in ranked if c.batch_size == user_batch_size][:1]
    return list(dict.fromkeys([*top, *at_user_bs]))


def least_trial_s(config: Config, window: WindowSpec, rate: float, *, loader_bound: bool) -> float:
    """The least a trial of ``config`` can take at ``rate`` samples/s: its first batch (one
    worker's batch: a round of the workers' time), its warm-up (``settled_after`` batches when
    the loader sets the pace and the buffer settles at once, else all of ``warmup_batches``) and
    its window's minimum of batches, each ``batch / rate`` seconds apart. 0 without a rate.
    A whole epoch's window takes what the epoch is expected to (its ``window_s``), after its
    first batch."""
    if rate <= 0:
        return window.window_s if window.whole_epoch else 0.0
    per_batch = config.batch_size / rate
    first = max(1, config.num_workers) * per_batch
    if window.whole_epoch:
        return first + window.window_s
    warmup = window.warmup_batches
    if loader_bound and window.settled_after is not None:
        warmup = min(warmup, window.settled_after)
    return first + (warmup + window.min_window_batches) * per_batch


def trial_s(config: Config, window: WindowSpec, rate: float, *, loader_bound: bool) -> float:
    """What a trial of ``config`` is expected to take at ``rate`` samples/s, launch aside: the
    least it can (:func:`least_trial_s`), with a window of at least ``window_s`` however fast
    its batches come. ``window_s`` without a rate."""
    if rate <= 0:
        return window.window_s
    least = least_trial_s(config, window, rate, loader_bound=loader_bound)
    if window.whole_epoch:
        return least
    per_batch = config.batch_size / rate
    return least + max(0.0, window.window_s - window.min_window_batches * per_batch)


def confirm_cost(
    values: Mapping[Config, float],
    finalists: list[Config],
    *,
    baseline: Config | None,
    n_explored: int,
    trial_wall_s: float,
    rounds: int,
    budget_s: float,
    walls: Mapping[Config, float] | None = None,
) -> float:
    """Seconds to keep for the confirmation: ``rounds`` interleaved rounds of each finalist
    that beats the baseline, and of the baseline, at most 35% of the budget. Each trial takes
    ``trial_wall_s``, or its setting's own time in this run (``walls``) when longer. Nothing is kept
    before the first :data:`MIN_EXPLORED` settings of the exploration have run (the probe's
    predicted best among them), or while nothing beats the baseline: exploring is then worth
    more than re-measuring."""
    if n_explored < MIN_EXPLORED:
        return 0.0
    base = values.get(baseline) if baseline is not None else None
    contenders = [c for c in finalists if c != baseline and (base is None or values[c] > base)]
    if not contenders:
        return 0.0
    walls = walls or {}
    round_s = sum(
        max(trial_wall_s, walls.get(c, 0.0)) for c in [*contenders, baseline] if c is not None
    )
    if baseline is None:
        round_s += trial_wall_s
    return min(0.35 * budget_s, rounds * round_s)


def switch_pays(ours: Sequence[float], theirs: Sequence[float]) -> bool:
    """On a live run, whether to leave the running setting (``theirs``: its sub-window rates in
    this run) for the search's winner (``ours``): in at least :data:`SWITCH_EVIDENCE` of all
    pairs (one of ours, one of theirs) ours is faster. A wrong switch costs the rest of the run,
    not one trial, and the highest median lets one lucky measurement decide. Without rates on
    both sides the winner stands."""
    if not ours or not theirs:
        return True
    wins = sum(a > b for a in ours for b in theirs)
    return wins >= SWITCH_EVIDENCE * len(ours) * len(theirs)
