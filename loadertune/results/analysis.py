"""Say which stage limits training and how far each ceiling is (:func:`analyze`: what
``rec.diagnosis`` holds); what to do next is :mod:`loadertune.results.advice`.

The barrel principle: training runs at the pace of its slowest stage. A trial whose loop spends
much of its time blocked in ``next()`` is input-bound (a faster loader helps); one that almost
never waits is compute-bound (only a faster step helps); in between, the two are balanced. With a
GPU, NVML's utilization samples over the window show the same thing from the other side: the
0% → 99% → 0% swing of a GPU that waits for its data.
"""

from __future__ import annotations

import os
import statistics
from typing import TYPE_CHECKING, Any

from loadertune.config import Config
from loadertune.hardware import Hardware
from loadertune.results.advice import advice
from loadertune.search import memory
from loadertune.search.confirm import (
    APART_MARGIN,
    SINGLE_TRIAL_MARGIN,
    sub_windows_clearly_better,
)
from loadertune.search.probe import Estimates
from loadertune.search.stop import bottleneck
from loadertune.trials import TrialResult
from loadertune.units import MIB

if TYPE_CHECKING:
    from loadertune.search import SearchOutcome

# A worker's private memory rising faster than this (median over the winner's trials) is copy-on-
# read. A worker's first batches grow it too, by a few MiB/s on datasets that do not copy
# (`python scripts/bench_copy_on_read.py`), so the threshold sits well above that.
COPY_ON_READ_BYTES_PER_S = 64 * MIB


# Other processes' share of the CPUs, median over the trials, from which a search warns that
# its figures moved with their load: on a shared machine the ratios can be off by several times.
BUSY_MACHINE_PERCENT = 20.0


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
    spreads = [sp for r in ok if r.measurement and (sp := r.measurement.spread) is not None]
    noise = statistics.median(spreads) if spreads else 0.0
    gpu = [s for r in ok if r.resources for s in r.resources.gpu_util_percent]
    out: dict[str, Any] = {
        "bottleneck": bottleneck(blocked, noise),
        "blocked_fraction": blocked,
        "samples_per_s": statistics.median(r.samples_per_s or 0.0 for r in ok),
        "epoch_samples_per_s": statistics.median(r.epoch_samples_per_s or 0.0 for r in ok),
        # every window an epoch: one of a few batches has no steady rate (its first wait,
        # left out of the window, holds the making of most of its batches)
        "whole_epochs": all(r.measurement.whole_epoch for r in ok if r.measurement),
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
        "in_process_samples_per_s": est.in_process_samples_per_s,
        "achievable_samples_per_s": est.achievable,
        "limiting_stage": est.limiting_stage,
        "step_floored": est.step_floored,
        "io_bound_loading": est.io_bound,
        "workers_needed": est.workers_needed(),
    }


def scaling(outcome: SearchOutcome) -> list[dict[str, float]]:
    """Best measured rate per ``num_workers`` at the winner's batch size: the observed scaling."""
    best: dict[int, float] = {}
    for config, value in outcome.values.items():
        if config.batch_size == outcome.winner.batch_size:
            best[config.num_workers] = max(value, best.get(config.num_workers, 0.0))
    return [{"num_workers": w, "samples_per_s": best[w]} for w in sorted(best)]


def gpu_memory(outcome: SearchOutcome) -> dict[str, Any] | None:
    """The affine memory model over every trial that reported a CUDA peak, and what it predicts."""
    points = [
        (t.config.batch_size, t.cuda_peak_reserved_bytes)
        for t in outcome.trials
        if t.ok and t.cuda_peak_reserved_bytes is not None
    ]
    oom = sorted({t.config.batch_size for t in outcome.trials if t.error == "oom"})
    if not points and not oom:
        return None
    capacities = [t.cuda_capacity_bytes for t in outcome.trials if t.cuda_capacity_bytes]
    capacity = min(capacities) if capacities else None
    model = memory.fit(points)
    margin = outcome.settings.memory_margin
    out: dict[str, Any] = {
        "peak_reserved_mib": {str(bs): peak / MIB for bs, peak in sorted(points)},
        "capacity_mib": capacity / MIB if capacity else None,
        "margin": margin,
        "oom_batch_sizes": oom,
        "largest_batch_run": max((bs for bs, _ in points), default=None),
    }
    if model is not None:
        out.update(
            fixed_mib=model.fixed_bytes / MIB,
            per_sample_mib=model.per_sample_bytes / MIB,
            fit_max_error=model.max_error,
            predicted_max_batch_size=(
                model.max_batch_size(capacity, margin=outcome.settings.memory_margin)
                if capacity
                else None
            ),
        )
    return out


def host_memory(outcome: SearchOutcome, hw: Hardware) -> dict[str, Any]:
    """Memory of the winner's processes, its batches in flight, and copy-on-read growth."""
    res = [r.resources for r in outcome.results_for(outcome.winner) if r.ok and r.resources]
    with_workers = [
        t.resources for t in outcome.trials if t.ok and t.resources and t.config.num_workers > 0
    ]
    growth_src = [u for u in res if u.n_workers] or with_workers
    per_worker = [
        u.worker_uss_growth_bytes_per_s / u.n_workers
        for u in growth_src
        if u.worker_uss_growth_bytes_per_s is not None and u.n_workers
    ]
    growth = statistics.median(per_worker) if per_worker else None

    def med(values: list[int | None]) -> float | None:
        vals = [v for v in values if v is not None]
        return statistics.median(vals) if vals else None

    return {
        "pss_bytes": med([u.pss_bytes for u in res]),
        "worker_pss_bytes": med([u.worker_pss_bytes for u in res]),
        "in_flight_bytes": outcome.space.in_flight_bytes(outcome.winner),
        "shm_free_bytes": hw.shm_free_bytes,
        "ram_available_bytes": hw.memory_available_bytes,
        "worker_uss_growth_bytes_per_s": growth,  # per worker
        "copy_on_read": growth is not None and growth > COPY_ON_READ_BYTES_PER_S,
    }


def failures_seen(outcome: SearchOutcome) -> dict[str, dict[str, Any]]:
    """Each kind of failure the trials met: how often, the first setting, and the fix."""
    seen: dict[str, dict[str, Any]] = {}
    for t in outcome.trials:
        if t.failure is not None:
            entry = seen.setdefault(
                t.failure.kind,
                {
                    "count": 0,
                    "message": t.failure.message,
                    "advice": t.failure.advice,
                    "first": t.params,
                },
            )
            entry["count"] += 1
    return seen


def others_cpu_percent(outcome: SearchOutcome, hw: Hardware) -> float | None:
    """What other processes kept busy of this process's CPUs during the trials' windows, as a
    share of those CPUs (median over the trials that measured it); None where it cannot be told
    (under a cgroup quota below the CPUs it may run on, their load is not what slows it)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None
    if hw.cpu_quota is not None and hw.cpu_quota < cpus:
        return None
    shares = [
        t.resources.cpu_percent_others / cpus
        for t in outcome.trials
        if t.ok and t.resources and t.resources.cpu_percent_others is not None and not t.kept
    ]
    return statistics.median(shares) if shares else None


def clearly_better(outcome: SearchOutcome, hw: Hardware) -> bool:
    """The winner clearly beats the baseline: the confirmation's verdict on it, or without one
    (it ran out of budget, or a live run kept its own setting) the winner's sub-window rates in
    this run against the baseline's, as the confirmation decides on a tight budget. One lucky
    window is not "clearly faster".

    While other processes kept the machine busy (:data:`BUSY_MACHINE_PERCENT`), only rounds,
    or a gap no load explains (:data:`~loadertune.search.confirm.APART_MARGIN`), may say so:
    the sub-windows of one window share its moment's load, so they can agree with each other
    and still be far from the setting's rate on a quiet machine."""
    winner, base = outcome.winner, outcome.baseline
    busy = (others_cpu_percent(outcome, hw) or 0.0) >= BUSY_MACHINE_PERCENT
    conf = outcome.confirmation
    if conf is not None and conf.winner == winner:
        return conf.clearly_better_than_baseline(sub_windows=not busy)
    if winner == base:
        return False
    ours, theirs = _sub_window_rates(outcome, winner), _sub_window_rates(outcome, base)
    # busy: only a gap no load of the machine explains (APART_MARGIN) says "clearly"
    return sub_windows_clearly_better(ours, theirs, APART_MARGIN if busy else SINGLE_TRIAL_MARGIN)


def unconfirmed(outcome: SearchOutcome) -> bool:
    """Nothing could compare the winner with the baseline: the final rounds measured the winner
    but the deadline came before the baseline's turn, or no final rounds measured the winner
    and one of the two has fewer than two sub-window rates in this run (a short epoch measured
    whole, once), so :func:`clearly_better` had nothing to test. "Within the noise" would then
    be a claim no figure supports (a short budget can leave no time for rounds even when the
    winner measured many times the baseline's rate)."""
    winner, base = outcome.winner, outcome.baseline
    conf = outcome.confirmation
    if winner == base:
        return False
    if conf is not None and conf.winner == winner:
        # the rounds measured the winner; the baseline too, unless the deadline came first,
        # when only a gap no load explains still compares them
        return not conf.results.get(base) and not conf.clearly_better_than_baseline(
            sub_windows=True
        )
    return min(len(_sub_window_rates(outcome, c)) for c in (winner, base)) < 2


def _sub_window_rates(outcome: SearchOutcome, config: Config) -> list[float]:
    """Every sub-window rate this run measured of ``config``."""
    return [
        r
        for t in outcome.results_for(config)
        if t.ok and t.measurement and not t.pruned
        for r in t.measurement.sub_window_samples_per_s
    ]


def warnings(outcome: SearchOutcome, hw: Hardware) -> list[str]:
    out = []
    others = others_cpu_percent(outcome, hw)
    if others is not None and others >= BUSY_MACHINE_PERCENT:
        out.append(
            f"other processes kept {others:.0f}% of this machine's CPUs busy during the trials "
            "(median): every figure moves with their load, and a setting measured while it "
            "peaked can look much faster or slower than it is; search again on a quiet machine"
        )
    if unconfirmed(outcome):
        out.append(
            "the winner was not measured beside your settings: the budget left no time for "
            "side-by-side rounds of both, and figures from different moments of a shared "
            "machine cannot tell noise from a difference; a longer search (--budget, or "
            "budget_s=) confirms it"
        )
    elif outcome.winner != outcome.baseline and not clearly_better(outcome, hw):
        out.append(
            "the winner does not clearly beat your settings: the difference is within "
            "the noise of this machine"
        )
    low = [
        t
        for t in outcome.results_for(outcome.winner)
        if t.measurement and t.measurement.low_confidence
    ]
    if low:
        out.append(
            "some measurements of the winner did not fill their window (low confidence): "
            "the script or dataset ended early"
        )
    for t in outcome.trials:
        for w in t.extra.get("warnings", []):
            if w not in out:
                out.append(w)
    return out


def analyze(outcome: SearchOutcome, hw: Hardware) -> dict[str, Any]:
    """Everything ``rec.diagnosis`` holds. ``"bottleneck"`` and ``"ceiling_samples_per_s"`` are
    the stable keys: the stage limiting the winner, and the achievable rate estimated."""
    win = describe_trial(outcome.results_for(outcome.winner))
    est = outcome.winner_estimates
    diag: dict[str, Any] = {
        "bottleneck": win["bottleneck"] if win else None,
        "ceiling_samples_per_s": est.achievable if est else None,
        "percent_of_ceiling": None,
        "winner": win,
        "baseline": describe_trial(outcome.results_for(outcome.baseline)),
        "ceilings": ceilings(est),
        "scaling": scaling(outcome),
        "memory": {"gpu": gpu_memory(outcome), "host": host_memory(outcome, hw)},
        "failures": failures_seen(outcome),
    }
    if diag["ceiling_samples_per_s"] and win:
        rate = win["epoch_samples_per_s"] if win["whole_epochs"] else win["samples_per_s"]
        diag["percent_of_ceiling"] = 100 * rate / diag["ceiling_samples_per_s"]
    diag["warnings"] = warnings(outcome, hw)
    diag["advice"] = advice(outcome, hw, diag)
    return diag
