"""What the benchmarks share: an exhaustive grid, interleaved side-by-side rounds, a row.

``measure(config) -> samples/s per epoch (or None)`` is whatever runs one trial: an in-process
trial for ``bench_tuner.py``, a script trial for ``bench_script.py``.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from typing import Any

from loadertune.config import Config
from loadertune.search.confirm import interleaved
from loadertune.search.space import SearchSpace

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
