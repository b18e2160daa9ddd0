"""What the benchmarks share: a grid, interleaved side-by-side rounds, a row.

``measure(config) -> samples/s per epoch (or None)`` is whatever runs one trial: an in-process
trial for ``bench_tuner.py``, a script trial for ``bench_script.py``.

The grid is exhaustive when the space is small enough (:func:`grid`). A space whose worker range
is wide (loading that waits on I/O: up to hundreds of workers) has thousands of settings, hours
at a second or more each; :func:`coarse_to_fine` then measures every batch size, prefetch factor
and persistence over a ladder of worker counts (every count up to a few, then steps of a fixed
ratio, the top of the range included), then the skipped counts between the ladder's neighbours of
the best setting, the closest to it first.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch.utils.data import DataLoader

from loadertune.config import Config
from loadertune.search.confirm import interleaved
from loadertune.search.space import SearchSpace
from loadertune.trials.loader import sample_counter

Measure = Callable[[Config], "float | None"]


def space_from(search: dict[str, Any]) -> SearchSpace:
    """The space a search explored (``rec.search["space"]``), to grid over the same one."""
    s = search["space"]
    return SearchSpace(
        batch_sizes=tuple(s["batch_sizes"]),
        max_workers=s["max_workers"],
        prefetch_factors=tuple(s["prefetch_factors"]),
        pin_memory=tuple(s["pin_memory"]),
        persistent_workers=tuple(s["persistent_workers"]),
    )


def grid(measure: Measure, configs: Iterable[Config]) -> dict[Config, float]:
    """Every setting measured once (a failure counts as 0)."""
    return {c: measure(c) or 0.0 for c in configs}


LADDER_RATIOS = (1.25, 1.5, 2.0, 3.0, 4.0)  # tried in turn until the coarse grid fits
DENSE_WORKERS = 4  # every worker count up to this one is on the ladder


def worker_ladder(max_workers: int, ratio: float) -> list[int]:
    """0 to ``DENSE_WORKERS`` workers, then steps of ``ratio`` (at least one worker), then
    ``max_workers``."""
    counts = list(range(min(DENSE_WORKERS, max_workers) + 1))
    while counts[-1] < max_workers:
        counts.append(min(max_workers, max(counts[-1] + 1, math.floor(counts[-1] * ratio))))
    return counts


@dataclass
class GridResult:
    """What a grid measured, and how it chose its settings (for the report)."""

    values: dict[Config, float]
    space_settings: int  # settings in the whole space
    thinned: list[str] = field(default_factory=list)  # how, in words; empty: exhaustive
    refined: list[Config] = field(default_factory=list)  # added around the coarse grid's best

    def describe(self) -> str:
        if not self.thinned:
            return f"{len(self.values)} settings (exhaustive)"
        return (
            f"{len(self.values)} of {self.space_settings} settings ({'; '.join(self.thinned)}; "
            f"then {len(self.refined)} more around the best)"
        )


def _default_variant(configs: Sequence[Config]) -> tuple[int, bool]:
    """The prefetch factor and persistence a thinned grid keeps: PyTorch's default (2, not
    persistent) where the space has it."""
    factors = {c.prefetch_factor or 2 for c in configs if c.num_workers}
    persists = {c.persistent_workers for c in configs if c.num_workers}
    return (2 if 2 in factors or not factors else min(factors)), persists == {True}


def coarse_to_fine(
    measure: Measure, configs: Sequence[Config], max_settings: int, max_refine: int = 12
) -> GridResult:
    """Every setting of ``configs`` measured once when there are at most ``max_settings``.

    Otherwise the most complete coarse grid that fits ``max_settings``: every prefetch factor
    and persistence on the finest worker ladder (:data:`LADDER_RATIOS`) that fits; failing
    that, PyTorch's default prefetch factor and persistence alone on the finest ladder that
    fits; failing that, an evenly spaced subset of the coarsest. Then, around the coarse
    grid's best: every prefetch factor and persistence at its batch size and worker count (if
    the coarse grid left some out), and at its batch size, prefetch factor and persistence, the
    ``max_refine`` worker counts closest to its own that were skipped between its neighbours.
    """
    if max_settings < 1:
        raise ValueError(f"max_settings must be at least 1, but got {max_settings=}.")
    configs = list(configs)
    if len(configs) <= max_settings:
        return GridResult(grid(measure, configs), len(configs))
    top = max(c.num_workers for c in configs)
    factor, persist = _default_variant(configs)

    def default_only(cs: list[Config]) -> list[Config]:
        return [
            c
            for c in cs
            if not c.num_workers or (c.prefetch_factor, c.persistent_workers) == (factor, persist)
        ]

    plans = [(r, False) for r in LADDER_RATIOS] + [(r, True) for r in LADDER_RATIOS]
    for ratio, thin_variants in plans:
        ladder = worker_ladder(top, ratio)
        coarse = [c for c in configs if c.num_workers in ladder]
        if thin_variants:
            coarse = default_only(coarse)
        if len(coarse) <= max_settings:
            break
    thinned = [f"workers {','.join(map(str, ladder))}"] if len(ladder) <= top else []
    if thin_variants:
        thinned.append(f"pf={factor}{' persist' if persist else ''} only")
    if len(coarse) > max_settings:
        step = len(coarse) / max_settings
        coarse = [coarse[int(k * step)] for k in range(max_settings)]
        thinned.append(f"{max_settings} evenly spaced")
    values = grid(measure, coarse)
    best = max(values, key=lambda c: values[c])
    variants = [
        c
        for c in configs
        if (c.batch_size, c.num_workers, c.pin_memory)
        == (best.batch_size, best.num_workers, best.pin_memory)
        and c not in values
    ]
    tried = sorted({c.num_workers for c in coarse})
    i = tried.index(best.num_workers)
    lo, hi = tried[max(0, i - 1)], tried[min(len(tried) - 1, i + 1)]
    gap = [
        c
        for c in configs
        if lo < c.num_workers < hi
        and c not in values
        and (c.batch_size, c.prefetch_factor, c.pin_memory, c.persistent_workers)
        == (best.batch_size, best.prefetch_factor, best.pin_memory, best.persistent_workers)
    ]
    gap = sorted(gap, key=lambda c: abs(c.num_workers - best.num_workers))[:max_refine]
    refined = [*variants, *gap]
    values.update(grid(measure, refined))
    return GridResult(values, len(configs), thinned=thinned, refined=refined)


def side_by_side(measure: Measure, configs: list[Config], rounds: int) -> dict[Config, list[float]]:
    """Each setting measured ``rounds`` times, in rotated order (A B C, B C A, ...)."""
    out: dict[Config, list[float]] = {c: [] for c in configs}
    for config in interleaved(configs, rounds):
        out[config].append(measure(config) or 0.0)
    return out


def row(config: Config, rounds: dict[Config, list[float]], reference: float) -> dict[str, Any]:
    """Median, range and share of ``reference`` (the grid's best median) for one setting."""
    vals = rounds[config]
    median = statistics.median(vals)
    return {
        "setting": config.label(),
        "loader_kwargs": config.loader_kwargs(),
        "median": median,
        "min": min(vals),
        "max": max(vals),
        "percent_of_grid": 100 * median / reference,
    }


def compare(
    measure: Measure,
    grid_values: dict[Config, float],
    named: dict[str, Config],
    rounds: int,
    top: int = 3,
) -> dict[str, Any]:
    """Re-measure the grid's ``top`` best with the ``named`` settings side by side; the grid's
    best is the best median among its top. Returns a row per name, plus ``"grid_best"``."""
    best = sorted(grid_values, key=lambda c: grid_values[c], reverse=True)[:top]
    configs = list(dict.fromkeys([*best, *named.values()]))
    measured = side_by_side(measure, configs, rounds)
    medians = {c: statistics.median(v) for c, v in measured.items()}
    grid_best = max(best, key=lambda c: medians[c])
    out = {"grid_best": row(grid_best, measured, medians[grid_best])}
    out.update({name: row(c, measured, medians[grid_best]) for name, c in named.items()})
    return out


def plain_epoch_rate(
    dataset: Any, step: Any, fixed: dict[str, Any], config: Config, epochs: int = 2
) -> float:
    """Samples/s of the last of ``epochs`` epochs of a plain loop (``for batch in loader:
    step(batch)``), timed from ``iter()`` to its end: what a user's epochs run at, measured by
    nothing of loadertune's. The first epoch is left out (a persistent loader's workers start
    once per run, not per epoch); a non-persistent loader's start-up is in every epoch, the
    timed one too.

    A window's rate is no truth where the workers' buffer fills and drains over seconds: on
    ``drawn_20261127_2`` (27-MB batches, 3.9 ms of waiting a sample, 252 batches an epoch)
    in-process window trials read 0.52 to 1.85 of these epochs, whole-epoch trials 0.85 to 1.05
    (``python scripts/bench_window_truth.py --workload drawn_20261127_2``)."""
    loader = DataLoader(dataset, **{**fixed, **config.loader_kwargs()})
    count, rate = sample_counter(loader), 0.0
    for _ in range(epochs):
        t0, n = time.perf_counter(), 0
        for i, batch in enumerate(loader):
            if step is not None:
                step(batch)
            n += count(batch, i)
        rate = n / (time.perf_counter() - t0)
    del loader
    return rate
