"""Say which stage limits training, how far each ceiling is, and what to do next.

The barrel principle: training runs at the pace of its slowest stage. A trial whose loop spends
much of its time blocked in ``next()`` is input-bound (a faster loader helps); one that almost
never waits is compute-bound (only a faster step helps); in between, the two are balanced. With a
GPU, NVML's utilization samples over the window show the same thing from the other side: the
0% → 99% → 0% swing of a GPU that waits for its data.
"""

from __future__ import annotations

import statistics
from typing import Any

from loadertune.probe import Estimates
from loadertune.trial import TrialResult

INPUT_BOUND_BLOCKED = 0.20  # waiting this much of the loop on data: the loader is the bottleneck
COMPUTE_BOUND_BLOCKED = 0.05  # waiting less than this: the step is


def bottleneck(blocked_fraction: float) -> str:
    """``"input"``, ``"compute"`` or ``"balanced"`` from the fraction of time blocked on data."""
    if blocked_fraction >= INPUT_BOUND_BLOCKED:
        return "input"
    if blocked_fraction <= COMPUTE_BOUND_BLOCKED:
        return "compute"
    return "balanced"


def gpu_histogram(samples: list[int]) -> dict[str, float]:
    """Share of NVML samples in each utilization band (the starved GPU's swing shows here)."""
    bands = {"0-10%": 0, "10-50%": 0, "50-90%": 0, "90-100%": 0}
    for s in samples:
        band = "0-10%" if s < 10 else "10-50%" if s < 50 else "50-90%" if s < 90 else "90-100%"
        bands[band] += 1
    n = len(samples) or 1
    return {k: v / n for k, v in bands.items()}


def describe_trial(results: list[TrialResult]) -> dict[str, Any] | None:
    """Bottleneck and evidence for one setting, over its measurements (medians)."""
    ok = [r for r in results if r.ok and r.measurement is not None]
    if not ok:
        return None
    blocked = statistics.median(r.measurement.blocked_fraction for r in ok if r.measurement)
    gpu = [s for r in ok if r.resources for s in r.resources.gpu_util_percent]
    out: dict[str, Any] = {
        "bottleneck": bottleneck(blocked),
        "blocked_fraction": blocked,
        "samples_per_s": statistics.median(r.samples_per_s or 0.0 for r in ok),
    }
    if gpu:
        out["gpu_util_mean"] = statistics.fmean(gpu)
        out["gpu_util_histogram"] = gpu_histogram(gpu)
    return out


def ceilings(est: Estimates | None) -> dict[str, Any]:
    """The roofline of the input pipeline, from the probe's estimates."""
    if est is None:
        return {}
    return {
        "consumer_samples_per_s": est.consumer_ceiling,
        "loader_samples_per_s": est.loader_ceiling,
        "cpu_samples_per_s": est.cpu_ceiling,
        "transfer_samples_per_s": est.transfer_ceiling,
        "achievable_samples_per_s": est.achievable,
        "limiting_stage": est.limiting_stage,
        "io_bound_loading": est.io_bound,
        "workers_needed": est.workers_needed(),
    }
