"""Run the REAL search driver on simulated workloads, in simulated time, and score its picks.

Each workload is drawn from a handful of parameters over wide ranges. A fake runner answers the
driver's trials from a small closed-form model (with noise, failures and wall-time costs), a fake
clock replaces ``time`` where the driver reads it, and the driver's pick is scored against the
noiseless optimum of the same model::

    python scripts/simulate.py --n 300 --seed 7                  # both modes, budget 60 s
    python scripts/simulate.py --n 300 --seed 8 --mode script --budget 30
    python scripts/simulate.py --n 50 --seed 7 --workload-json /tmp/w.json
    python scripts/simulate.py --seed 7 --one 42 --mode inline     # trace one search
    python scripts/simulate.py --n 300 --mode live --budget 60     # tuning inside the run
    python scripts/simulate.py --n 300 --seed 7 --ablate climbs    # one rule switched off
    python scripts/simulate.py --n 300 --seed 7 --set finalists=2  # a setting or constant

``--mode live`` scores the live search (``loadertune run --tune``: no replay, the run's own batch
size) by the time to train a run with tuning over the time without it (see :class:`LiveScore`),
for the side search's rules and the live ones side by side.

The seed is random (and printed) unless given; never tune a policy against one fixed seed.

The model (per workload; ``B`` batch size, ``n`` workers, ``P`` usable CPUs; times in seconds)
-------------------------------------------------------------------------------------------------
Per sample in ``__getitem__``: CPU ``c``, I/O wait ``io``; collate CPU ``cc`` per sample; per
batch a fixed fetch CPU ``fb`` (the sampler's indices, the dataset calls, collate's own
overhead: a larger batch spreads it thinner), so loading costs ``c(B) = c + cc + fb/B`` of CPU
per sample; ``S`` bytes per sample. Step per batch ``step(B) = a + b*B + xfer(B)`` of wall time,
of which ``f*(a + b*B)`` is CPU in the main process (``f = 1`` for a CPU step, 0.02..0.3 for a
GPU step); ``xfer(B) = B*S*h2d`` (GPU only; times ``pin_factor`` with ``pin_memory``, and
pinning then costs the main process ``B*S/8 GB/s`` of CPU). The main process receives each
batch from a worker in ``recv(B) = r0 + r1*B*S`` (inside ``next()``).

* ``n = 0``: loading and step take turns: ``rate = B / (B*(c(B) + io) + step(B) + pin_cpu(B))``.
* ``n > 0``: the barrel principle, the lowest of four stages::

      k      = 1 + kappa * max(0, n - P) / P          # process overhead past the CPU count
      t_w    = k*c(B) + io                             # a worker's time per sample
      loader = n / t_w * (1 - burst / (2*pf))          # prefetch smooths bursty I/O a little
      io_cap = q / io                                  # storage saturates at q requests in flight
      main   = B / (recv(B) + step(B))                 # the main process: receive, then step
      cpus   = P / (k*c(B) + (recv(B) + f*(a + b*B) + pin_cpu(B)) / B)
      rate   = min(buffered(min(loader, io_cap), main), cpus)

  ``buffered``: the workers and the step are joined by a buffer of ``n*pf`` batches, and their
  batch times vary (squared coefficient of variation ``v``, 0.02..0.6 per workload): when one
  runs ahead and the buffer is full, or empty, the other's time is lost. The rate of a finite
  queue of ``N = 1 + n*pf/v`` places, ``a*(1 - r^N)/(1 - r^(N+1))`` (``a`` the slower stage,
  ``r`` slower/faster; ``a*N/(N+1)`` at equal rates), stands for it: a deeper buffer, or more
  workers, gain where the two stages are close. On the 2-CPU machine the image example at
  batch 128 with 2 workers made 709 samples/s with ``prefetch_factor=2`` and 742 with 8 (with
  1 worker 624 and 680; ``bench_script.py --compare``).

* Epoch rate (what the driver maximises): ``N / (N/rate + start)`` with ``N`` samples per epoch
  and ``start = startup(n)*(not persistent) + B*t_w`` (a new epoch waits for a worker to make its
  first batch; ``startup(n) = s0*(1 + 0.05*(n - 1))``); the steady rate when ``N`` is unknown.
* Failures: GPU out of memory when ``g0 + g1*B`` exceeds the card; a Bus error (``/dev/shm``) when
  ``(n*pf + 1)*B*S`` (the batches in flight and the one the step holds) exceeds the free shared
  memory; the driver's host-memory budget when the trial's tree ``main_pss + n*worker_pss + B*S``
  (its PSS: the batches in flight sit in ``/dev/shm``, mapped by no process, as torch's do:
  ``scripts/bench_worker_memory.py``) exceeds it (``main_pss`` is in the budget inline, not for
  a script: the script is the trial's own process); the OOM killer (a worker killed) when the
  workers and the shared memory, ``n*worker_pss + (n*pf + 1)*B*S``, exceed the available RAM;
  the driver's start-up, hang and trial time limits, enforced on the trial's simulated times.
* Noise: per trial a log-normal factor (sigma drawn in 5..30% per workload, for a window of
  ``NOISE_REF_WINDOW_S``) and, with probability 3%, an outlier at 0.5x (a neighbour's burst); per
  sub-window a further log-normal factor. Half the trial's variance at the reference window is
  slow drift (a neighbour's load, the clock: a longer window does not average it out, and every
  setting measured while it lasts shares it: an Ornstein-Uhlenbeck process over simulated time,
  lasting 5..60 s per workload, :class:`Drift`) and half is fast (bursts within the window: its
  variance falls as 1/window), so a shorter window is noisier:
  ``sigma(W) = sigma * sqrt(0.5 + 0.5 * ref / W)`` in all; the sub-windows' sigma grows likewise
  as they shorten.
* A whole-epoch window (``WindowSpec.whole_epoch``) ends with the epoch; begun in a launch's
  epoch under way, or with persistent workers (their first epoch holds their start), it warms
  up (``meter.cycle_warmup`` batches) and holds an epoch's batches across the epoch's end, as
  the meter does; where the rest of the epoch under way is no longer than that warm-up it first
  waits for that rest at its own rate.
* Wall time of a trial: set-up + first batch + warm-up batches (a script's trial process sizes them
  for the setting it runs, ``window_for``, as the real one does) + the window (sub-windows of whole
  batches, at least 4 batches) + a re-entry (inline: every ``n > 0`` trial when ``N`` is known;
  script: with persistent workers) + teardown. Pruning (``should_stop``) is honoured at every
  sub-window. Set-up and teardown: inline 0.05 s and ``0.02 + 0.005*n`` (the workers stop). A script
  runs its trials in *launches* (``loadertune.trials.script``): a launch's first trial pays a
  process start of 2..5 s per workload (+-5% per trial; a later launch is a fork of the search's
  fork server and skips the interpreter and the imports, 30..80% of it, drawn per workload;
  ``--no-fork-server``: every launch pays it all) and each later trial ``SWAP_S`` (the search's
  round trip, the next setting's loader built); a launch ends after a failed trial (the group
  killed: 0.1 s), when the script has given all its samples (``epochs x N``, epochs drawn in 1..30;
  1e4..1e6 samples when ``N`` is unknown; each trial consumes its first, warm-up and window
  batches), and after every trial for the 20% of workloads whose loader cannot change setting
  mid-epoch (an IterableDataset: one setting per process, as before).
* Modes: both search the same workloads and batch-size candidates. ``inline`` is ``tune_loader``
  (the baseline is given, the runner knows the epoch length and CUDA); ``script`` is
  ``tune_script`` (baseline=None: the first trial reports the script's own loader, and with it the
  epoch length and CUDA), with a process start per launch.

Truth: the best noiseless epoch rate over every batch size offered x ``n`` in 0..256 (above any cap
of the driver: the user's speed does not care about our caps) x prefetch 1/2/4/8 x pin (GPU) x
persistent (known epoch), among settings that would not fail in that mode. "In space" restricts
the same grid to the space the driver built (its worker cap, shared-memory budget, candidates).
A search that raises scores 0. For each pick below 0.95 of the truth the report names a cause:
a good setting (>= 0.95) ran but lost in the confirmation or never became a finalist; the pick is
good within the space but the space left the optimum out; or no good setting was ever run (after
exploring nothing, or something, with the stop reason).

The driver runs in simulated time: :func:`new_search` hands it the fake clock and the
workload's own PSS (``Search(clock=..., own_pss=...)``); no module is patched.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import optuna

from loadertune.config import DEFAULT_BATCH_SIZES, Config
from loadertune.errors import LoadertuneError, UserCodeError
from loadertune.hardware import Hardware
from loadertune.measure import failures, meter
from loadertune.measure.failures import Failure
from loadertune.measure.meter import Measurement, WindowSpec
from loadertune.measure.resources import ResourceUsage
from loadertune.results.recommendation import build_recommendation
from loadertune.search import Search, SearchOutcome, SearchSettings
from loadertune.search.space import DEFAULT_PREFETCH_FACTORS, MAX_WORKERS_HARD
from loadertune.trials.contract import BaseRunner, Limits, ShouldStop, TrialResult, window_for

MODES = ("inline", "script")
CPU_CHOICES = (1, 2, 4, 8, 16, 32)
STARTUP_PER_WORKER = 0.05  # each extra worker adds 5% of s0 to the start-up
PIN_COPY_S_PER_BYTE = 1 / 8e9  # the pin thread's memcpy into page-locked memory
OUTLIER_P, OUTLIER_FACTOR = 0.03, 0.5
NOISE_REF_WINDOW_S = 1.5  # the window at which a workload's drawn sigma holds
SWAP_S = 0.05  # a script's next setting in the same launch: the round trip, its loader built
KILL_S = 0.1  # a script's launch killed (its process group)
MEMORY_FRACTION = SearchSettings().memory_budget_fraction
# The product's rule: a batch the GPU-memory model puts above (1 - margin) of the GPU's memory is
# never tried, so the best it can recommend leaves that margin free; the truth does too.
GPU_MARGIN = SearchSettings().memory_margin


# ---------------------------------------------------------------------------------------------
# Workloads


@dataclass(frozen=True)
class Workload:
    """One simulated workload (times in seconds, sizes in bytes). See the module docstring."""

    index: int
    cpus: int
    cpu_s: float  # c
    io_s: float  # io
    sample_bytes: float  # S
    collate_s: float  # cc
    step_a: float
    step_b: float
    step_cpu_frac: float  # f
    gpu: bool
    h2d_s_per_byte: float
    pin_factor: float
    recv_fixed_s: float  # r0
    recv_s_per_byte: float  # r1
    startup_s: float  # s0
    epoch_samples: int | None
    io_parallel: float  # q
    overhead: float  # kappa
    burst: float
    main_pss: float
    worker_pss: float
    ram_available: float
    shm_free: float
    gpu_mem_fixed: float
    gpu_mem_per_sample: float
    gpu_capacity: float
    noise_sigma: float
    sub_sigma: float
    process_start_s: float
    batch_sizes: tuple[int, ...]
    baseline: Config
    hot_swap: bool = True  # the script's loader can change setting mid-epoch
    script_samples: float = math.inf  # samples the script gives before it ends
    drift_tau_s: float = 20.0  # the slow half of the noise: how long the machine's load lasts
    fetch_s: float = 0.0  # fb: the fetch's fixed CPU per batch
    import_s: float = 0.0  # of process_start_s: the interpreter and imports (a fork skips them)
    variability: float = 0.0  # v: squared coefficient of variation of the stages' batch times

    @property
    def offered(self) -> tuple[int, ...]:
        """Every batch size the search may pick (the baseline's is added, as the driver does)."""
        return tuple(sorted({*self.batch_sizes, self.baseline.batch_size}))

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["baseline"] = self.baseline.loader_kwargs()
        return data


def _log_uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def _baseline(rng: np.random.Generator, bs: int, gpu: bool) -> Config:
    if rng.random() < 0.4:
        return Config(bs, 0, None, bool(gpu and rng.random() < 0.5))
    workers = int(rng.choice([1, 2, 4, 8, 16]))
    return Config(bs, workers, 2, bool(gpu and rng.random() < 0.5), bool(rng.random() < 0.2))


def draw_workload(seed: int, index: int) -> Workload:
    """Workload ``index`` of the run seeded ``seed`` (the same pair gives the same workload)."""
    rng = np.random.default_rng([seed, index])
    lu = lambda lo, hi: _log_uniform(rng, lo, hi)  # noqa: E731
    cpus = int(rng.choice(CPU_CHOICES))
    gpu = bool(rng.random() < 0.6)
    sample_bytes = lu(16, 8e6)
    io_s = 0.0 if rng.random() < 0.3 else lu(1e-5, 2e-2)
    cpu_s = lu(1e-6, 2e-2)
    collate_s = lu(2e-7, 1e-4) + sample_bytes / lu(2e9, 1e10)
    io_share = io_s / (io_s + cpu_s + collate_s)
    kind = rng.random()
    if kind < 0.5:
        sizes = DEFAULT_BATCH_SIZES
        user_bs = int(rng.choice(sizes))
    else:
        user_bs = int(rng.choice([8, 16, 32, 64, 128, 256]))
        sizes = (user_bs,) if kind < 0.75 else (user_bs // 2, user_bs, user_bs * 2)
    main_pss = lu(3e8, 8e9)
    gpu_capacity = lu(8e9, 8e10)
    gpu_fixed = rng.uniform(0.1, 0.5) * gpu_capacity
    max_fit = lu(1.2 * user_bs, 8192)  # the user's own batch fits
    baseline = _baseline(rng, user_bs, gpu)
    w = Workload(
        index=index,
        cpus=cpus,
        cpu_s=cpu_s,
        io_s=io_s,
        sample_bytes=sample_bytes,
        collate_s=collate_s,
        step_a=lu(1e-4, 1e-1),
        step_b=0.0 if rng.random() < 0.2 else lu(1e-6, 2e-3),
        step_cpu_frac=float(rng.uniform(0.02, 0.3)) if gpu else 1.0,
        gpu=gpu,
        h2d_s_per_byte=1 / lu(3e9, 2.5e10) if gpu else 0.0,
        pin_factor=float(rng.uniform(0.6, 1.15)),
        recv_fixed_s=lu(5e-5, 2e-3),
        recv_s_per_byte=1 / lu(1e9, 2e10),
        startup_s=lu(0.01, 2.0),
        epoch_samples=None if rng.random() < 0.25 else int(lu(2e3, 2e6)),
        io_parallel=lu(4, 1024),
        overhead=float(rng.uniform(0.05, 0.3)),
        burst=float(rng.uniform(0, 0.2)) * io_share,
        main_pss=main_pss,
        worker_pss=lu(5e7, 2e9),
        ram_available=max(2.5 * main_pss, cpus * lu(1e9, 8e9)),
        shm_free=64 * 2**20 if rng.random() < 0.2 else lu(1e9, 6.4e10),
        gpu_mem_fixed=gpu_fixed,
        gpu_mem_per_sample=(gpu_capacity - gpu_fixed) / max_fit,
        gpu_capacity=gpu_capacity if gpu else 0.0,
        noise_sigma=float(rng.uniform(0.05, 0.30)),
        sub_sigma=float(rng.uniform(0.02, 0.15)),
        process_start_s=float(rng.uniform(2.0, 5.0)),
        batch_sizes=tuple(sizes),
        baseline=baseline,
    )
    # The user's own setting runs (in either mode): fewer workers until it does.
    while failure_kind(w, w.baseline, "script") is not None and w.baseline.num_workers:
        b = w.baseline
        fewer = (
            Config(b.batch_size, b.num_workers // 2, None, b.pin_memory)
            if b.num_workers > 1
            else (Config(b.batch_size, 0, None, b.pin_memory))
        )
        w = dataclasses.replace(w, baseline=fewer)
    extra = np.random.default_rng([seed, index, 1])  # apart: the draws above stay as they were
    epochs = _log_uniform(extra, 1, 30)
    return dataclasses.replace(
        w,
        script_samples=epochs * (w.epoch_samples or _log_uniform(extra, 1e4, 1e6)),
        hot_swap=bool(extra.random() >= 0.2),
        drift_tau_s=_log_uniform(extra, 5, 60),
        fetch_s=_log_uniform(extra, 1e-5, 1e-3),
        import_s=w.process_start_s * float(extra.uniform(0.3, 0.8)),
        variability=_log_uniform(extra, 0.02, 0.6),
    )


# ---------------------------------------------------------------------------------------------
# The model (pure functions; ``n`` may be a numpy array of worker counts >= 1)


def xfer(w: Workload, bs: int, pin: bool) -> float:
    return bs * w.sample_bytes * w.h2d_s_per_byte * (w.pin_factor if pin else 1.0)


def pin_cpu(w: Workload, bs: int, pin: bool) -> float:
    return bs * w.sample_bytes * PIN_COPY_S_PER_BYTE if pin and w.gpu else 0.0


def step_wall(w: Workload, bs: int, pin: bool) -> float:
    return w.step_a + w.step_b * bs + xfer(w, bs, pin)


def recv(w: Workload, bs: int) -> float:
    return w.recv_fixed_s + w.recv_s_per_byte * bs * w.sample_bytes


def load_cpu(w: Workload, bs: int) -> float:
    """``c(B)``: loading's CPU seconds per sample at batch ``bs`` (the fetch's fixed cost spread
    over the batch)."""
    return w.cpu_s + w.collate_s + w.fetch_s / bs


def worker_time(w: Workload, n: Any, bs: int) -> Any:
    """``t_w``: a worker's seconds per sample with ``n`` workers (contention past the CPUs)."""
    k = 1 + w.overhead * np.maximum(0, n - w.cpus) / w.cpus
    return k * load_cpu(w, bs) + w.io_s


def busy_workers(w: Workload, bs: int, n: Any) -> Any:
    """The workers that get batches: torch hands an epoch's batches to its workers in turn,
    from the first at every epoch, so a worker past an epoch's batch count gets none."""
    if not w.epoch_samples:
        return n
    return np.minimum(n, max(1, math.ceil(w.epoch_samples / bs)))


def stage_rates(w: Workload, bs: int, n: Any, pf: int, pin: bool) -> dict[str, Any]:
    """Samples/s each stage allows with ``n >= 1`` workers (of which the busy ones load)."""
    n = busy_workers(w, bs, n)
    t_w = worker_time(w, n, bs)
    cpu_w = t_w - w.io_s
    main_cpu = (
        recv(w, bs) + w.step_cpu_frac * (w.step_a + w.step_b * bs) + pin_cpu(w, bs, pin)
    ) / bs
    return {
        "loader": n / t_w * (1 - w.burst / (2 * pf)),
        "io": w.io_parallel / w.io_s if w.io_s > 0 else math.inf,
        "main": bs / (recv(w, bs) + step_wall(w, bs, pin)),
        "cpu": w.cpus / (cpu_w + main_cpu),
    }


def buffered(produce: Any, consume: Any, slots: Any, variability: float) -> Any:
    """What a producer and a consumer joined by a buffer of ``slots`` batches deliver when their
    batch times vary (squared coefficient of variation ``variability``): the throughput of a
    queue that holds ``N = 1 + slots / variability`` (a steadier pair behaves as if the buffer
    were deeper), ``a * (1 - r**N) / (1 - r**(N+1))`` with ``a`` the slower rate and ``r`` the
    slower over the faster; at equal rates ``a * N / (N + 1)``. A producer far faster or slower
    than its consumer loses nothing to the buffer; at equal rates two slots of very variable
    batches lose a fifth."""
    slow, fast = np.minimum(produce, consume), np.maximum(produce, consume)
    r = slow / fast
    size = 1 + slots / variability
    with np.errstate(invalid="ignore", divide="ignore"):  # r == 1: taken from the other branch
        general = (1 - r**size) / (1 - r ** (size + 1))
    return slow * np.where(np.abs(1 - r) < 1e-9, size / (size + 1), general)


def steady_rate(w: Workload, bs: int, n: Any, pf: int | None, pin: bool) -> Any:
    """Samples/s in steady state (the barrel principle, the buffer between the workers and the
    step; see the module docstring)."""
    if np.isscalar(n) and n == 0:
        load = bs * (load_cpu(w, bs) + w.io_s)
        return bs / (load + step_wall(w, bs, pin) + pin_cpu(w, bs, pin))
    stages = stage_rates(w, bs, n, pf or 2, pin)
    loading = np.minimum(stages["loader"], stages["io"])
    if w.variability > 0:
        flow = buffered(loading, stages["main"], busy_workers(w, bs, n) * (pf or 2), w.variability)
    else:
        flow = np.minimum(loading, stages["main"])
    return np.minimum(flow, stages["cpu"])


def _fast_noise(window_s: float) -> float:
    """The fast half of a trial's noise at ``window_s``, as a share of the workload's sigma: its
    variance falls as 1/window (see the module docstring; the slow half is :class:`Drift`)."""
    return math.sqrt(0.5 * NOISE_REF_WINDOW_S / window_s)


class Drift:
    """The slow half of the noise: the machine's load, which every setting measured at the same
    time shares and which lasts ``tau`` seconds (an Ornstein-Uhlenbeck process in log-rate whose
    stationary sigma is ``sigma``). Read at each trial's start, in simulated time."""

    def __init__(self, sigma: float, tau: float, rng: np.random.Generator, now: float) -> None:
        self.sigma, self.tau, self.rng, self.t = sigma, tau, rng, now
        self.x = float(rng.normal(0.0, sigma))

    def factor(self, now: float) -> float:
        keep = math.exp(-max(0.0, now - self.t) / self.tau)
        self.x = self.x * keep + self.sigma * math.sqrt(1 - keep**2) * float(self.rng.normal())
        self.t = now
        return math.exp(self.x)


def startup(w: Workload, n: Any) -> Any:
    return w.startup_s * (1 + STARTUP_PER_WORKER * (n - 1))


def epoch_start(w: Workload, bs: int, n: Any, persistent: bool) -> Any:
    """Seconds each epoch spends before its first batch (0 without workers)."""
    if np.isscalar(n) and n == 0:
        return 0.0
    return (0.0 if persistent else startup(w, n)) + bs * worker_time(w, n, bs)


def epoch_rate(w: Workload, c: Config) -> float:
    rate = steady_rate(w, c.batch_size, c.num_workers, c.prefetch_factor, c.pin_memory)
    if not w.epoch_samples:
        return float(rate)
    start = epoch_start(w, c.batch_size, c.num_workers, c.persistent_workers)
    return float(w.epoch_samples / (w.epoch_samples / rate + start))


def shm_bytes(w: Workload, bs: int, n: Any, pf: int) -> Any:
    """Shared memory the batches take: those in flight and the one the step holds."""
    return (n * pf + 1) * bs * w.sample_bytes


def tree_bytes(w: Workload, bs: int, n: Any) -> Any:
    """The trial's PSS: the main process with the batch the step holds, and the workers (the
    batches in flight are in ``/dev/shm``, mapped by none of them)."""
    return w.main_pss + n * w.worker_pss + bs * w.sample_bytes


def host_bytes(w: Workload, bs: int, n: Any, pf: int) -> Any:
    """What the trial adds to the host's memory: its workers and its shared memory."""
    return n * w.worker_pss + shm_bytes(w, bs, n, pf)


def memory_budget(w: Workload, mode: str) -> float:
    """What the driver's budget will be: its own PSS (inline only) + 80% of available RAM."""
    return (w.main_pss if mode == "inline" else 0.0) + MEMORY_FRACTION * w.ram_available


def failure_kind(w: Workload, c: Config, mode: str) -> str | None:
    """The resource a trial of ``c`` runs out of (before any time limit), or None."""
    if w.gpu and w.gpu_mem_fixed + w.gpu_mem_per_sample * c.batch_size > w.gpu_capacity:
        return "oom"
    if not c.num_workers:
        return None
    pf = c.prefetch_factor or 2
    if shm_bytes(w, c.batch_size, c.num_workers, pf) > w.shm_free:
        return "shm_exhausted"
    if tree_bytes(w, c.batch_size, c.num_workers) > memory_budget(w, mode):
        return "memory_budget"
    if host_bytes(w, c.batch_size, c.num_workers, pf) > w.ram_available:
        return "worker_killed"
    return None


def recommendable(w: Workload, bs: int) -> bool:
    """The batch leaves the GPU memory margin free (see ``GPU_MARGIN``), or it is the user's
    own (the search measures it, margin or not, and may keep it)."""
    need = w.gpu_mem_fixed + w.gpu_mem_per_sample * bs
    return not w.gpu or need <= (1 - GPU_MARGIN) * w.gpu_capacity or bs == w.baseline.batch_size


@dataclass(frozen=True)
class Grid:
    """A grid of settings: batch sizes x workers 0..max x prefetch x pin x persistent."""

    batch_sizes: tuple[int, ...]
    max_workers: int
    prefetch_factors: tuple[int, ...] = DEFAULT_PREFETCH_FACTORS
    pin_memory: tuple[bool, ...] = (False,)
    persistent_workers: tuple[bool, ...] = (False,)
    max_in_flight_bytes: float | None = None


def true_grid(w: Workload) -> Grid:
    return Grid(
        batch_sizes=w.offered,
        max_workers=MAX_WORKERS_HARD,
        pin_memory=(False, True) if w.gpu else (False,),
        persistent_workers=(False, True) if w.epoch_samples else (False,),
    )


def space_grid(outcome: SearchOutcome) -> Grid:
    s = outcome.space
    return Grid(
        batch_sizes=s.batch_sizes,
        max_workers=s.max_workers,
        prefetch_factors=s.prefetch_factors,
        pin_memory=s.pin_memory,
        persistent_workers=s.persistent_workers,
        max_in_flight_bytes=s.max_in_flight_bytes,
    )


def grid_best(
    w: Workload, grid: Grid, mode: str, *, feasible_only: bool = True, below: float = math.inf
) -> tuple[float, Config]:
    """The best noiseless epoch rate over ``grid`` (settings that would fail excluded), among
    the settings slower than ``below``."""
    best, best_config = 0.0, Config(w.baseline.batch_size)
    for bs, pin in ((bs, pin) for bs in grid.batch_sizes for pin in grid.pin_memory):
        if feasible_only and not recommendable(w, bs):
            continue
        value = epoch_rate(w, Config(bs, 0, None, pin))
        if best < value < below:
            best, best_config = value, Config(bs, 0, None, pin)
        n = np.arange(1, grid.max_workers + 1)
        if not len(n):
            continue
        for pf in grid.prefetch_factors:
            rate = steady_rate(w, bs, n, pf, pin)
            in_flight = n * pf * bs * w.sample_bytes
            ok = np.ones_like(n, dtype=bool)
            if grid.max_in_flight_bytes is not None:
                ok &= in_flight <= grid.max_in_flight_bytes
            if feasible_only:
                ok &= shm_bytes(w, bs, n, pf) <= w.shm_free
                ok &= tree_bytes(w, bs, n) <= memory_budget(w, mode)
                ok &= host_bytes(w, bs, n, pf) <= w.ram_available
            for pers in grid.persistent_workers:
                values = rate
                if w.epoch_samples:
                    values = w.epoch_samples / (
                        w.epoch_samples / rate + epoch_start(w, bs, n, pers)
                    )
                values = np.where(ok & (values < below), values, 0.0)
                i = int(np.argmax(values))
                if values[i] > best:
                    best, best_config = float(values[i]), Config(bs, int(n[i]), pf, pin, pers)
    return best, best_config


# ---------------------------------------------------------------------------------------------
# The fake clock and the runner


class FakeClock:
    """Stands in for the ``time`` module where the driver reads it."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def monotonic(self) -> float:
        return self.now

    def perf_counter(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)


def new_search(
    runner: SimRunner,
    w: Workload,
    *,
    baseline: Config | None,
    batch_sizes: Sequence[int],
    settings: SearchSettings,
) -> Search:
    """The real driver on the simulated runner, its clock and its own PSS the simulation's."""
    return Search(
        runner,
        hardware=hardware_for(w),
        baseline=baseline,
        batch_sizes=batch_sizes,
        settings=settings,
        clock=runner.clock.monotonic,
        own_pss=lambda: int(w.main_pss),
    )


@dataclass
class TraceLine:
    clock: float
    phase: str
    config: Config
    true_epoch: float
    result: TrialResult


class SimRunner(BaseRunner):
    """A :class:`~loadertune.trials.TrialRunner` that answers from the model and moves the
    clock (``run_many`` is the base class's: one ``run`` after the other)."""

    user_error = UserCodeError
    batch_size_fixed = None
    loader_recreated = False
    target_note = None

    fork_server = True  # a script's later launches are forks (loadertune.trials.forkserver)

    def __init__(self, w: Workload, mode: str, clock: FakeClock, rng: np.random.Generator) -> None:
        self.w, self.mode, self.clock, self.rng = w, mode, clock, rng
        self.n_launches = 0
        self.launch_left = 0.0  # samples the script's live launch can still give (0: none)
        self.epoch_left = 0.0  # samples left of the launch's epoch under way (0: at a start)
        self.in_process = mode == "inline"
        self.uses_cuda = w.gpu if mode == "inline" else False  # a script's is learnt
        self.epoch_samples = w.epoch_samples if mode == "inline" else None
        self.bytes_per_sample: float | None = None
        self.trace: list[TraceLine] = []
        self.drift = Drift(w.noise_sigma * math.sqrt(0.5), w.drift_tau_s, rng, clock.now)

    def close(self) -> None:
        pass

    def _noise(self, sigma: float) -> float:
        return float(math.exp(self.rng.normal(0.0, sigma)))

    def run(
        self,
        config: Config | None,
        *,
        window: WindowSpec,
        limits: Limits,
        phase: str = "search",
        should_stop: ShouldStop | None = None,
    ) -> TrialResult:
        config = config or self.w.baseline
        result, wall = self._trial(config, window, limits, phase, should_stop)
        ends_by = getattr(limits, "ends_by", None)  # (older commits' Limits have none)
        if ends_by is not None and self.clock.now + wall > ends_by:  # the supervisor cuts it
            from loadertune.measure.failures import FailureKind  # (CUT: as ends_by)
            from loadertune.trials.contract import cut

            at = max(0.0, ends_by - self.clock.now)
            why = f"stopped at the search's deadline, {at:.0f} s into the trial"
            result = cut(
                TrialResult(
                    config,
                    phase=phase,
                    epoch_samples=self.w.epoch_samples,
                    failure=Failure(FailureKind.CUT, why, ""),
                )
            )
            wall = at + (KILL_S if self.mode == "script" else 0.02 + 0.005 * config.num_workers)
            self.launch_left = 0.0  # a script's launch is killed
        result.wall_s = wall
        if result.failure is not None or not self.w.hot_swap:
            self.launch_left = 0.0  # the launch was killed, or runs one setting only
        self.clock.sleep(wall)
        if self.mode == "script":  # what the script child reports of its loader
            result.extra["loader"] = {"settings": config.loader_kwargs()}
            self.uses_cuda = self.w.gpu
            self.epoch_samples = self.epoch_samples or self.w.epoch_samples
        self.bytes_per_sample = self.w.sample_bytes
        result.bytes_per_sample = self.bytes_per_sample
        if failure_kind(self.w, config, self.mode):
            true = 0.0
        elif phase == "replay":  # the consumer's own rate
            true = config.batch_size / step_wall(self.w, config.batch_size, False)
        else:
            true = epoch_rate(self.w, config)
        self.trace.append(TraceLine(self.clock.now, phase, config, true, result))
        return result

    def _trial(
        self,
        c: Config,
        window: WindowSpec,
        limits: Limits,
        phase: str,
        should_stop: ShouldStop | None,
    ) -> tuple[TrialResult, float]:
        """The result and its wall time."""
        w, bs, n = self.w, c.batch_size, c.num_workers
        replay = phase == "replay"
        if self.mode == "script":  # the trial process sizes the window for the setting it runs
            window = window_for(c, window_s=window.window_s, whole_epoch=window.whole_epoch)
        result = TrialResult(c, phase=phase, epoch_samples=w.epoch_samples)
        setup, teardown = 0.05, 0.02 + 0.005 * n  # in process: the workers stop
        if self.mode == "script":
            if self.launch_left <= 0:  # a fresh launch
                setup, self.launch_left = w.process_start_s, w.script_samples
                if self.n_launches and self.fork_server:  # forked: no interpreter, no imports
                    setup -= w.import_s
                self.n_launches += 1
                self.epoch_left = 0.0
            else:
                setup = SWAP_S
            setup *= self._noise(0.05)
            if not w.hot_swap:
                teardown = KILL_S
        load_batch = bs * (load_cpu(w, bs) + w.io_s)
        first = load_batch if n == 0 else startup(w, n) + bs * float(worker_time(w, n, bs))
        first *= self._noise(0.1)
        started = setup + first
        if started > limits.startup_s:
            why = Failure("timeout", f"no batch within {limits.startup_s:.0f} s", "hang")
            return self._failed(result, why, limits.startup_s, limits, teardown)
        kind = failure_kind(w, c, self.mode)
        if kind is not None:  # workers allocate as they start; an OOM comes at the first step
            at = started + step_wall(w, bs, c.pin_memory) if kind == "oom" else started
            if kind == "memory_budget":  # workers start one by one: the k-th crosses it
                held = w.main_pss + bs * w.sample_bytes
                k = min(n, int((memory_budget(w, self.mode) - held) // w.worker_pss) + 1)
                result.resources = ResourceUsage(
                    n_workers=k,
                    pss_bytes=int(held + k * w.worker_pss),
                    worker_pss_bytes=int(w.worker_pss),
                )
            return self._failed(result, self._failure(kind, c), at, limits, teardown)
        if replay:
            rate = bs / step_wall(w, bs, False)
        else:
            rate = float(steady_rate(w, bs, n, c.prefetch_factor, c.pin_memory))
        rate *= self.drift.factor(self.clock.now + started)
        rate *= self._noise(w.noise_sigma * _fast_noise(window.window_s)) * (
            OUTLIER_FACTOR if self.rng.random() < OUTLIER_P else 1.0
        )
        period = bs / rate  # seconds per batch in this trial
        if period > limits.hang_s:
            return self._failed(
                result, failures.hang(limits.hang_s), started + limits.hang_s, limits, teardown
            )
        # The warm-up drains the buffer by count at the step's pace; when the loader sets the
        # pace the buffer is empty after every worker's first batch, and the meter's first
        # waiting next() ends it (``WindowSpec.settled_after``).
        warmup_batches = window.warmup_batches
        loader_bound = not replay and step_wall(w, bs, c.pin_memory) * rate / bs < 0.95
        if loader_bound and getattr(window, "settled_after", None) is not None:
            warmup_batches = min(warmup_batches, window.settled_after)
        warmup = warmup_batches * period
        whole = window.whole_epoch and bool(w.epoch_samples) and not replay
        warmed = 0 if whole else window.warmup_batches  # the batches the warm-up gave
        persists = c.persistent_workers and n > 0
        if whole and self.mode == "script" and (self.epoch_left or persists):
            # begun mid-epoch, or persistent workers (their first epoch holds their start):
            # an epoch's batches across its end, after a warm-up; or where the rest of the
            # epoch under way is shorter than that, it runs unmeasured and the next is the window
            left = self.epoch_left or float(w.epoch_samples or 0)
            cycle = meter.cycle_warmup(
                window, math.ceil((w.epoch_samples or 0) / bs), math.ceil(left / bs)
            )
            if cycle:
                warmed = cycle
                warmup = cycle * period
            else:
                warmup = left / rate
                self._gave(left)
        subs, elapsed, batches, full = self._window(rate, period, window, should_stop, result)
        self._gave((1 + warmed + batches) * bs)
        measured = statistics.fmean(subs)
        reentry = 0.0
        if not replay and n and w.epoch_samples and (self.mode == "inline" or c.persistent_workers):
            reentry = float(epoch_start(w, bs, n, c.persistent_workers)) * self._noise(0.1)
        wall = started + warmup + elapsed + reentry + teardown
        if wall > limits.timeout_s:
            result.pruned = False
            return self._failed(result, None, wall, limits, teardown)
        step = step_wall(w, bs, c.pin_memory if not replay else False)
        if replay:
            blocked, cpu_fraction = 0.01, None
        elif n == 0:
            blocked = load_batch / (load_batch + step + pin_cpu(w, bs, c.pin_memory))
            cpu_fraction = min(1.0, load_cpu(w, bs) / (load_cpu(w, bs) + w.io_s))
            cpu_fraction *= self._noise(0.05)
        else:
            blocked, cpu_fraction = max(0.0, 1 - step * measured / bs), None
        result.measurement = Measurement(
            samples_per_s=measured,
            sub_window_samples_per_s=subs,
            blocked_fraction=min(1.0, blocked),
            first_batch_s=first,
            warmup_s=warmup,
            window_s=elapsed,
            n_samples=max(1, round(measured * elapsed)),
            n_batches=max(1, round(batches)),
            complete=full,
            stopped_early=not full,
            reentry_s=[reentry] if reentry else [],
            blocked_cpu_fraction=None if cpu_fraction is None else min(1.0, cpu_fraction),
            step_s_per_batch=step,
            whole_epoch=whole and full and elapsed >= ((w.epoch_samples or 0) - bs) / rate - 1e-9,
        )
        result.resources = self._resources(c, measured, replay)
        if w.gpu:
            result.cuda_peak_reserved_bytes = int(w.gpu_mem_fixed + w.gpu_mem_per_sample * bs)
            result.cuda_capacity_bytes = int(w.gpu_capacity)
            if replay:
                per = w.sample_bytes * w.h2d_s_per_byte
                result.transfer = {
                    "pageable_samples_per_s": 1 / per,
                    "pinned_samples_per_s": 1 / (per * w.pin_factor),
                }
        return result, wall

    def _gave(self, samples: float) -> None:
        """The script received ``samples`` more (its launch and its epoch move on)."""
        self.launch_left -= samples
        epoch = self.w.epoch_samples
        if epoch:
            self.epoch_left = (self.epoch_left - samples) % epoch

    def _window(
        self,
        rate: float,
        period: float,
        window: WindowSpec,
        should_stop: ShouldStop | None,
        result: TrialResult,
    ) -> tuple[list[float], float, float, bool]:
        """Sub-window rates, seconds and batches of the window, and whether it ran its full
        length; prunes like the meter does."""
        # Sub-windows hold whole rounds of workers when the loop waits for data (see the meter).
        step = step_wall(self.w, result.config.batch_size, result.config.pin_memory)
        waits = result.phase != "replay" and step < 0.95 * period
        round_s = (getattr(window, "round_batches", 1) if waits else 1) * period
        sub_s = math.ceil(window.window_s / window.n_sub_windows / round_s) * round_s
        subs: list[float] = []
        elapsed = batches = 0.0
        sub_sigma = self.w.sub_sigma * min(
            3.0, math.sqrt(NOISE_REF_WINDOW_S / window.n_sub_windows / sub_s)
        )
        # a whole epoch's window ends with the epoch (its first batch is the first batch's)
        epoch_end = math.inf
        if window.whole_epoch and self.w.epoch_samples and result.phase != "replay":
            epoch_end = (self.w.epoch_samples - result.config.batch_size) / rate
        while True:
            subs.append(rate * self._noise(sub_sigma))
            elapsed += sub_s
            batches += sub_s / period
            if elapsed >= epoch_end:
                batches -= (elapsed - epoch_end) / period
                elapsed = epoch_end
                full = True
            else:
                full = window.is_full(elapsed, batches)
            if should_stop is not None and should_stop(len(subs) - 1, statistics.fmean(subs)):
                result.pruned = True  # the supervisor marks it even on the last sub-window
                return subs, elapsed, batches, full
            if full:
                return subs, elapsed, batches, full

    def _resources(self, c: Config, rate: float, replay: bool) -> ResourceUsage:
        w, bs, n = self.w, c.batch_size, c.num_workers
        if replay:
            main = 100 * w.step_cpu_frac * (w.step_a + w.step_b * bs) / step_wall(w, bs, False)
        else:
            busy = recv(w, bs) if n else bs * load_cpu(w, bs)
            busy += w.step_cpu_frac * (w.step_a + w.step_b * bs) + pin_cpu(w, bs, c.pin_memory)
            main = 100 * min(1.0, busy * rate / bs)
        return ResourceUsage(
            cpu_percent_main=main * self._noise(0.05),
            cpu_percent_workers=None,
            n_workers=n,
            pss_bytes=int(tree_bytes(w, bs, n)),
            worker_pss_bytes=int(w.worker_pss) if n else None,
        )

    def _failed(
        self,
        result: TrialResult,
        failure: Failure | None,
        at: float,
        limits: Limits,
        teardown: float,
    ) -> tuple[TrialResult, float]:
        """``failure`` at ``at`` seconds into the trial, unless the trial's limit came first (a
        script's launch is killed: its group goes)."""
        if self.mode == "script":
            teardown = KILL_S
        if failure is None or at > limits.timeout_s:
            text = f"the trial ran past its limit of {limits.timeout_s:.0f} s"
            failure, at = Failure("timeout", text, "a slower setting or a hang"), limits.timeout_s
        result.failure = failure
        return result, at + teardown

    def _failure(self, kind: str, c: Config) -> Failure:
        if kind == "oom":
            return failures.classify_text(
                "torch.OutOfMemoryError: CUDA out of memory", where="step"
            )
        if kind in ("shm_exhausted", "worker_killed"):
            how = "Bus error" if kind == "shm_exhausted" else "Killed"
            text = f"DataLoader worker (pid 4242) is killed by signal: {how}."
            return failures.classify_text(text, where="loader", num_workers=c.num_workers)
        used = tree_bytes(self.w, c.batch_size, c.num_workers)
        return failures.memory_budget(int(used), int(memory_budget(self.w, self.mode)))


# ---------------------------------------------------------------------------------------------
# One search, scored


def hardware_for(w: Workload) -> Hardware:
    return Hardware(
        cpu_model="simulated",
        usable_cpus=w.cpus,
        logical_cpus=w.cpus,
        physical_cores=w.cpus,
        cpu_quota=None,
        memory_total_bytes=int(w.ram_available + w.main_pss),
        memory_available_bytes=int(w.ram_available),
        memory_limit_bytes=None,
        shm_total_bytes=int(w.shm_free),
        shm_free_bytes=int(w.shm_free),
        open_files_limit=65536,
        gpus=(),
        gpu_note="simulated",
        driver_version=None,
    )


@dataclass
class Score:
    """One search on one workload in one mode."""

    index: int
    mode: str
    ratio: float  # pick / true best (0 when the search raised)
    ratio_space: float  # pick / best in the space the driver built
    n_trials: int
    sim_s: float
    elapsed_s: float
    stop_reason: str
    pick: Config | None
    true_best: Config
    true_value: float
    space_best: Config | None
    max_workers: int | None
    n_search: int = 0  # settings the exploration ran (seeds and Optuna's)
    confirmed: int = 0  # settings the confirmation re-measured (baseline included)
    real_s: float = 0.0  # real seconds the search took (the driver and Optuna)
    ratio_ran: float = 0.0  # best true value among the settings the search ran / true best
    cause: str = ""  # why the pick is below 0.95 of the true best (see :func:`cause_of`)
    # the report's verdict (:func:`verdict_of`) and the baseline's true value / the true best
    verdict: str = ""
    baseline_ratio: float = 0.0
    tags: list[str] = field(default_factory=list)
    error: str | None = None


def _bs_best(w: Workload, mode: str, bs: int) -> float:
    return grid_best(w, dataclasses.replace(true_grid(w), batch_sizes=(bs,)), mode)[0]


def tags_for(w: Workload, mode: str, best: Config, value: float) -> list[str]:
    """Category tags from the truth (what kind of workload this is)."""
    tags = ["gpu step" if w.gpu else "cpu step", f"{w.cpus} cpu" + ("s" if w.cpus > 1 else "")]
    share = w.io_s / (w.io_s + w.cpu_s + w.collate_s)
    tags.append("io_bound" if share >= 0.5 else "cpu_bound loading")
    if best.num_workers > 8 * w.cpus:
        tags.append("optimum above 8xCPUs")
    elif best.num_workers > w.cpus + 1:
        tags.append("optimum above CPUs+1")
    if best.num_workers == 0:
        tags.append("optimum at w=0")
    if len(w.offered) == 1:
        tags.append("single batch size")
    else:
        if _bs_best(w, mode, w.baseline.batch_size) < 0.8 * value:
            tags.append("batch-size dominates")
        if best.batch_size == min(w.offered):
            tags.append("optimum at smallest batch")
        elif best.batch_size == max(w.offered):
            tags.append("optimum at largest batch")
    base = 0.0 if failure_kind(w, w.baseline, mode) else epoch_rate(w, w.baseline)
    if base >= 0.9 * value:
        tags.append("flat (baseline within 10%)")
    if w.noise_sigma >= 0.2:
        tags.append("high noise")
    unlimited = grid_best(w, true_grid(w), mode, feasible_only=False)[0]
    if unlimited > 1.05 * value:
        tags.append("memory-limited")
    if w.epoch_samples and best.num_workers:
        steady = float(
            steady_rate(w, best.batch_size, best.num_workers, best.prefetch_factor, best.pin_memory)
        )
        if value < 0.8 * steady:
            tags.append("epoch start-up matters")
    if best.num_workers:
        stages = stage_rates(
            w, best.batch_size, best.num_workers, best.prefetch_factor or 2, best.pin_memory
        )
        tags.append(f"limited by {min(stages, key=lambda k: float(stages[k]))}")
    return tags


# ---------------------------------------------------------------------------------------------
# Ablation: one rule of the search switched off at a time (``--ablate NAME``)

SETTINGS_OVERRIDES: dict[str, Any] = {}  # SearchSettings fields an ablation changes


def _set(item: str) -> None:
    """``--set NAME=VALUE``: a SearchSettings field, or ``module.CONST`` of loadertune.search."""
    import importlib

    name, _, text = item.partition("=")
    value = json.loads(text)
    if "." in name:
        module, const = name.split(".", 1)
        setattr(importlib.import_module(f"loadertune.search.{module}"), const, value)
    else:
        SETTINGS_OVERRIDES[name] = value


def _ablations() -> dict[str, tuple[str, Callable[[], None]]]:
    """Each rule of the search that can be switched off: (what it does, how to switch it off).
    A measurement harness: it patches the search's modules for this process only."""
    from loadertune.search import confirm, driver, plan

    def patch(obj: Any, name: str, value: Any) -> Callable[[], None]:
        return lambda: setattr(obj, name, value)

    def override(**kw: Any) -> Callable[[], None]:
        return lambda: SETTINGS_OVERRIDES.update(kw)

    return {
        "seeds": ("the probe's seed settings", patch(driver, "seed_configs", lambda *a, **k: [])),
        "climbs": (
            "agenda: climb workers while the best waits",
            patch(plan, "climbs", lambda *a, **k: []),
        ),
        "prune": (
            "stop a trial clearly behind the best mid-window",
            patch(driver.Search, "_prune_rule", lambda self, i, r: False),
        ),
        "patience": ("stop after `patience` trials without a gain", override(patience=10**6)),
        "compute_bound": (
            "stop at once when the baseline's loader keeps up",
            patch(driver, "loader_keeps_up", lambda *a: False),
        ),
        "cheaper_tie": (
            "confirmation: the cheapest within the noise wins (off: within 2%)",
            patch(confirm, "TIE_Z", 0.0),
        ),
        "rounds": ("confirmation: interleaved rounds (off: one round)", override(confirm_rounds=1)),
    }


def run_one(
    w: Workload, mode: str, *, seed: int, budget_s: float, trace: list[TraceLine] | None = None
) -> tuple[Score, SearchOutcome | None]:
    clock = FakeClock()
    runner = SimRunner(w, mode, clock, np.random.default_rng([seed, w.index, MODES.index(mode)]))
    settings = SearchSettings(
        budget_s=budget_s,
        storage=optuna.storages.InMemoryStorage(),  # type: ignore[arg-type]
        study_name="sim",
        seed=(seed * 1_000_003 + w.index) % 2**31,
        **SETTINGS_OVERRIDES,
    )
    search = new_search(
        runner,
        w,
        baseline=w.baseline if mode == "inline" else None,
        batch_sizes=w.batch_sizes,
        settings=settings,
    )
    t0, real0 = clock.now, time.perf_counter()
    outcome: SearchOutcome | None = None
    error = None
    try:
        outcome = search.run()
    except LoadertuneError as exc:
        error = f"{type(exc).__name__}: {exc}"
    real_s = time.perf_counter() - real0
    if trace is not None:
        trace.extend(runner.trace)
    value, best = grid_best(w, true_grid(w), mode)
    score = Score(
        index=w.index,
        mode=mode,
        ratio=0.0,
        ratio_space=0.0,
        n_trials=len(runner.trace),
        sim_s=clock.now - t0,
        elapsed_s=outcome.elapsed_s if outcome else clock.now - t0,
        stop_reason=outcome.stop_reason if outcome else "error",
        pick=outcome.winner if outcome else None,
        true_best=best,
        true_value=value,
        space_best=None,
        max_workers=outcome.space.max_workers if outcome else None,
        n_search=sum(t.phase == "search" for t in runner.trace),
        confirmed=len(outcome.confirmation.values) if outcome and outcome.confirmation else 0,
        real_s=real_s,
        tags=tags_for(w, mode, best, value),
        error=error,
    )
    if outcome is not None:
        pick = 0.0 if failure_kind(w, outcome.winner, mode) else epoch_rate(w, outcome.winner)
        in_space, score.space_best = grid_best(w, space_grid(outcome), mode)
        score.ratio = pick / value
        score.ratio_space = pick / in_space if in_space else 0.0
        if score.max_workers is not None and best.num_workers > score.max_workers:
            score.tags.append("optimum above the driver's cap")
        ran = [t.true_epoch for t in runner.trace if t.result.ok and t.phase != "replay"]
        score.ratio_ran = max(ran, default=0.0) / value
        score.cause = cause_of(score, outcome, in_space / value, runner.trace)
        score.verdict = verdict_of(outcome, w)
        base = 0.0 if failure_kind(w, outcome.baseline, mode) else epoch_rate(w, outcome.baseline)
        score.baseline_ratio = base / value
    else:
        score.cause = "search raised"
    return score, outcome


def verdict_of(outcome: SearchOutcome, w: Workload) -> str:
    """What the report says of the pick against the baseline (``report.summary_lines``):
    "baseline" (the pick is the baseline), "clearly" (clearly faster), or within the noise and
    "ahead" or "behind" side by side (its speed-up at or above 1, or under)."""
    if outcome.winner == outcome.baseline:
        return "baseline"
    rec = build_recommendation(outcome, hardware_for(w), workload={})
    if not rec.within_noise:
        return "clearly"
    return "behind" if rec.speedup is not None and rec.speedup < 1 else "ahead"


def cause_of(
    score: Score, outcome: SearchOutcome, space_ratio: float, trace: list[TraceLine]
) -> str:
    """Where a pick below 0.95 of the true best went wrong ("" when it did not)."""
    if score.ratio >= 0.95:
        return ""
    if score.ratio_ran >= 0.95:  # a good setting ran: the choice lost it
        good = {  # a replay's rate is the step's alone, not its setting's: no good setting
            t.config
            for t in trace
            if t.result.ok and t.phase != "replay" and t.true_epoch >= 0.95 * score.true_value
        }
        confirmed = set(outcome.confirmation.values) if outcome.confirmation else set()
        if good & confirmed:
            return "ran a good setting; confirmed, lost"
        return "ran a good setting; not a finalist"
    if score.ratio_space >= 0.95:  # a fine pick within the space: the space left the optimum out
        return "good within the space; the optimum is outside it"
    outside = " [optimum outside the space too]" if space_ratio < 0.95 else ""
    if score.n_search == 0:
        return f"explored nothing (stop: {score.stop_reason}){outside}"
    return f"explored, never ran a good setting (stop: {score.stop_reason}){outside}"


# ---------------------------------------------------------------------------------------------
# Report


def _dist(values: Sequence[float]) -> str:
    a = np.asarray(values)
    return (
        f"median {np.median(a):.3f}  p5 {np.percentile(a, 5):.3f}  worst {a.min():.3f}  "
        f"<0.95: {np.mean(a < 0.95):5.1%}  <0.90: {np.mean(a < 0.90):5.1%}"
    )


def _short(w: Workload) -> str:
    epoch = f"{w.epoch_samples}" if w.epoch_samples else "?"
    return (
        f"P={w.cpus} c={w.cpu_s * 1e3:.3g}ms io={w.io_s * 1e3:.3g}ms S={w.sample_bytes:.3g}B "
        f"cc={w.collate_s * 1e3:.3g}ms fb={w.fetch_s * 1e3:.3g}ms "
        f"step={w.step_a * 1e3:.3g}ms+{w.step_b * 1e3:.3g}ms*B "
        f"f={w.step_cpu_frac:.2f} r0={w.recv_fixed_s * 1e3:.2g}ms s0={w.startup_s:.2g}s "
        f"N={epoch} q={w.io_parallel:.0f} sigma={w.noise_sigma:.2f} bs={list(w.offered)} "
        f"base={w.baseline.label()}"
    )


def _table(p: Callable[..., None], title: str, groups: dict[str, list[float]]) -> None:
    p(f"\n{title:36} {'n':>4} {'median':>7} {'p5':>7} {'worst':>7} {'<0.95':>6}")
    for name, vals in sorted(groups.items(), key=lambda kv: float(np.percentile(kv[1], 5))):
        a = np.asarray(vals)
        p(
            f"{name:36} {len(a):4d} {np.median(a):7.3f} {np.percentile(a, 5):7.3f} {a.min():7.3f} "
            f"{np.mean(a < 0.95):6.0%}"
        )


def _bucket(n: int) -> str:
    return next(f"explored {name}" for top, name in ((0, "0"), (2, "1-2"), (5, "3-5"),
                (10, "6-10"), (10**9, ">10")) if n <= top)  # fmt: skip


def _verdicts(p: Callable[..., None], scores: list[Score]) -> None:
    """Per verdict of the report, the picks against the baseline they replace: is a pick within
    the noise of the baseline, behind it side by side, still the better one to save?"""
    p(
        f"\n{'verdict against the baseline':36} {'n':>4} {'pick<0.95':>9} {'base<0.95':>9} "
        f"{'pick truly slower':>17}"
    )
    groups: dict[str, list[Score]] = defaultdict(list)
    for s in scores:
        if not s.error:
            groups[s.verdict].append(s)
    for name, group in sorted(groups.items()):
        slower = sum(s.ratio < s.baseline_ratio for s in group)
        p(
            f"{name:36} {len(group):4d} {sum(s.ratio < 0.95 for s in group):9d} "
            f"{sum(s.baseline_ratio < 0.95 for s in group):9d} {slower:17d}"
        )


def report(
    scores: list[Score], workloads: dict[int, Workload], mode: str, budget_s: float, out: Any
) -> None:
    p = lambda *a: print(*a, file=out)  # noqa: E731
    ratios = [s.ratio for s in scores]
    p(f"\n=== mode {mode}: {len(scores)} workloads (a search that raised counts as 0) ===")
    p(f"pick / true best      {_dist(ratios)}")
    p(f"pick / best in space  {_dist([s.ratio_space for s in scores])}")
    ok = [s.ratio for s in scores if not s.error]
    if len(ok) < len(scores):
        p(f"  (without raised)    {_dist(ok)}")
    trials = [s.n_trials for s in scores]
    explored = [s.n_search for s in scores]
    sims = [s.sim_s for s in scores]
    over = [s.sim_s - budget_s for s in scores]
    p(
        f"trials per search     median {statistics.median(trials):.0f}  max {max(trials)}   "
        f"explored: median {statistics.median(explored):.0f}  max {max(explored)}   "
        f"zero explored: {sum(e == 0 for e in explored)}"
    )
    p(
        f"simulated s           median {statistics.median(sims):.1f}  max {max(sims):.1f}   "
        f"over budget: {sum(o > 0 for o in over)} searches, at most {max(0.0, max(over)):.1f} s, "
        f"by over 10%: {sum(o > 0.1 * budget_s for o in over)}"
    )
    longest = sorted(scores, key=lambda s: s.sim_s, reverse=True)[:3]
    p("  longest             " + "  ".join(f"#{s.index} {s.sim_s:.1f} s" for s in longest))
    real = [s.real_s for s in scores]
    p(f"real s per search     median {statistics.median(real):.3f}  max {max(real):.3f}")
    p(f"stop reasons          {dict(Counter(s.stop_reason for s in scores).most_common())}")
    by_tag: dict[str, list[float]] = defaultdict(list)
    by_stop: dict[str, list[float]] = defaultdict(list)
    by_explored: dict[str, list[float]] = defaultdict(list)
    for s in scores:
        for tag in s.tags:
            by_tag[tag].append(s.ratio)
        by_stop[s.stop_reason].append(s.ratio)
        by_explored[_bucket(s.n_search)].append(s.ratio)
    _table(p, "category (pick / true best)", by_tag)
    _table(p, "stop reason", by_stop)
    _table(p, "settings explored", by_explored)
    _verdicts(p, scores)
    causes = Counter(s.cause for s in scores if s.ratio < 0.95)
    p(f"\nwhy a pick is below 0.95 of the true best ({sum(causes.values())} searches):")
    for cause, count in causes.most_common():
        worst = min(s.ratio for s in scores if s.ratio < 0.95 and s.cause == cause)
        p(f"  {cause:80} {count:4d}  worst {worst:.3f}")
    raised = [s for s in scores if s.error]
    if raised:
        p(f"\nsearches that raised ({len(raised)}; the first 10):")
        for s in raised[:10]:
            p(f"  #{s.index:<4} {(s.error or '')[:110]}\n        {_short(workloads[s.index])}")
    p("\nworst 10 that returned (ratio, in-space ratio, stop reason, cause, pick vs true best):")
    for s in sorted((s for s in scores if not s.error), key=lambda s: s.ratio)[:10]:
        pick = s.pick.label() if s.pick else "-"
        p(
            f"  #{s.index:<4} {s.ratio:.3f} {s.ratio_space:.3f} {s.stop_reason:16} "
            f"cap={s.max_workers} trials={s.n_trials} explored={s.n_search}  {s.cause}\n"
            f"        pick [{pick}]  true best [{s.true_best.label()}]  "
            f"in space [{s.space_best.label() if s.space_best else '-'}]\n"
            f"        {', '.join(s.tags)}\n        {_short(workloads[s.index])}"
        )


def print_trace(
    w: Workload, mode: str, score: Score, outcome: SearchOutcome | None, trace: list[TraceLine]
) -> None:
    print(f"workload #{w.index} ({mode}): {_short(w)}")
    print(f"tags: {', '.join(score.tags)}")
    print(
        f"{'clock':>7} {'phase':9} {'setting':34} {'true':>9} {'measured':>9} {'epoch':>9} "
        f"{'wall':>6}  status"
    )
    for t in trace:
        r = t.result
        print(
            f"{t.clock - 1000:7.1f} {t.phase:9} {t.config.label():34} {t.true_epoch:9.1f} "
            f"{r.samples_per_s or 0:9.1f} {r.epoch_samples_per_s or 0:9.1f} {r.wall_s:6.2f}  "
            f"{r.status}{' ' + r.error if r.error else ''}"
        )
    if outcome is not None:
        if outcome.estimates:
            e = outcome.estimates
            print(
                f"estimates: achievable {e.achievable:.1f} ({e.limiting_stage}), "
                f"io_bound {e.io_bound}, workers_needed {e.workers_needed()}, "
                f"consumer {e.consumer_ceiling:.1f}, "
                f"loader {e.loader_ceiling:.1f}, cpu {e.cpu_ceiling:.1f}"
            )
        print(
            f"space: bs {outcome.space.batch_sizes}, max_workers {outcome.space.max_workers} "
            f"{outcome.space.limits}"
        )
        if outcome.confirmation:
            for c, vals in outcome.confirmation.values.items():
                print(
                    f"confirm {c.label():34} rounds {[round(v, 1) for v in vals]}  "
                    f"true {epoch_rate(w, c):.1f}"
                )
    print(
        f"stop {score.stop_reason}; pick {score.pick.label() if score.pick else '-'} "
        f"ratio {score.ratio:.3f} (in space {score.ratio_space:.3f}); true best "
        f"{score.true_best.label()} = {score.true_value:.1f}; in space "
        f"{score.space_best.label() if score.space_best else '-'}; simulated {score.sim_s:.1f} s"
        + (f"; error {score.error}" if score.error else "")
    )


def simulate(
    n: int,
    seed: int,
    modes: Sequence[str],
    budget_s: float,
    progress: Callable[[str], None] | None = None,
) -> tuple[dict[int, Workload], dict[str, list[Score]]]:
    workloads = {i: draw_workload(seed, i) for i in range(n)}
    scores: dict[str, list[Score]] = {m: [] for m in modes}
    for mode in modes:
        t0 = time.perf_counter()
        for w in workloads.values():
            scores[mode].append(run_one(w, mode, seed=seed, budget_s=budget_s)[0])
        if progress:
            progress(f"mode {mode}: {n} searches in {time.perf_counter() - t0:.1f} s of real time")
    return workloads, scores


# ---------------------------------------------------------------------------------------------
# The oracle: how often this noise makes even the right comparison come out wrong


def run_oracle(
    w: Workload, mode: str, *, seed: int, budget_s: float, paired: bool = False
) -> float | None:
    """Pick / true best for a policy that is *told* the true best setting and the best one
    below 0.95 of it (the closest that fails the bar), and spends the whole budget measuring
    the two in interleaved rounds, the search's windows, with this workload's noise: the higher
    median wins. A real search must make at least this comparison without knowing which two
    settings to make it between, on a budget it also spends exploring, so the share of
    workloads where the oracle picks the slower is (about) a floor under any policy's share
    below 0.95 on the same draws. None: no setting below 0.95 of the best can run.

    ``paired``: the decision is the mean log ratio of the two within each round instead (the
    slow drift, which both figures of a round share, cancels): the better of the two ways a
    policy could compare them, so that the floor does not rest on an estimator one could beat."""
    best_value, best = grid_best(w, true_grid(w), mode)
    rival_value, rival = grid_best(w, true_grid(w), mode, below=0.95 * best_value)
    if rival_value <= 0 or failure_kind(w, rival, mode) or failure_kind(w, best, mode):
        return None
    clock = FakeClock()
    runner = SimRunner(
        w, mode, clock, np.random.default_rng([seed, w.index, 7 + MODES.index(mode)])
    )
    window_s = SearchSettings(budget_s=budget_s).trial_window_s
    limits = Limits(timeout_s=1e9, startup_s=1e9, hang_s=1e9, memory_budget_bytes=None)
    rates: dict[Config, list[float]] = {best: [], rival: []}
    log_ratios: list[float] = []  # per round with both figures: log(best / rival)
    deadline, r = clock.now + budget_s, 0
    while clock.now < deadline:
        pair = (best, rival) if r % 2 == 0 else (rival, best)
        got = {}
        for c in pair:
            result = runner.run(c, window=window_for(c, window_s=window_s), limits=limits)
            if result.epoch_samples_per_s:
                rates[c].append(result.epoch_samples_per_s)
                got[c] = result.epoch_samples_per_s
        if len(got) == 2:
            log_ratios.append(math.log(got[best] / got[rival]))
        r += 1
    if not rates[best] or not rates[rival]:
        return None
    if paired:
        pick = best if log_ratios and statistics.fmean(log_ratios) >= 0 else rival
    else:
        pick = best if statistics.median(rates[best]) >= statistics.median(rates[rival]) else rival
    return (best_value if pick == best else rival_value) / best_value


NOISE_BANDS = ((0.0, 0.10), (0.10, 0.20), (0.20, math.inf))  # the workload's sigma


def report_oracle(
    workloads: dict[int, Workload],
    scores: dict[str, list[Score]],
    seed: int,
    budget_s: float,
    out: Any,
) -> None:
    """The oracle's share below 0.95 beside the search's, over all workloads and by noise."""
    for mode, mode_scores in scores.items():
        search = {s.index: s.ratio for s in mode_scores}
        oracle = {
            i: r
            for i, w in workloads.items()
            if (r := run_oracle(w, mode, seed=seed, budget_s=budget_s)) is not None
        }
        ratios = list(oracle.values())
        print(
            f"oracle, mode {mode}: {len(ratios)} workloads with a rival below 0.95; "
            f"the pick is the rival in {sum(r < 0.95 for r in ratios) / len(ratios):.1%} "
            f"(p5 {np.percentile(ratios, 5):.3f})",
            file=out,
        )
        paired = [
            r
            for w in workloads.values()
            if (r := run_oracle(w, mode, seed=seed, budget_s=budget_s, paired=True)) is not None
        ]
        print(
            f"  paired within rounds (the drift cancelled): the rival in "
            f"{sum(r < 0.95 for r in paired) / len(paired):.1%} "
            f"(p5 {np.percentile(paired, 5):.3f})",
            file=out,
        )
        for lo, hi in NOISE_BANDS:
            band = [i for i, w in workloads.items() if lo <= w.noise_sigma < hi]
            if not band:
                continue
            ours = [search[i] for i in band]
            theirs = [oracle[i] for i in band if i in oracle]
            print(
                f"  sigma {lo:.2f}-{hi:.2f}: {len(band)} workloads; below 0.95: search "
                f"{sum(r < 0.95 for r in ours) / len(ours):.1%}, oracle "
                f"{sum(r < 0.95 for r in theirs) / max(1, len(theirs)):.1%}",
                file=out,
            )


# ---------------------------------------------------------------------------------------------
# Tuning inside the real run (``loadertune run --tune``, ``tuned()``)

RUN_LENGTHS_S = (120.0, 600.0, 3600.0)  # runs, in seconds at the run's own setting


@dataclass
class LiveScore:
    """One live tuning: what it cost and gained against the run's own setting."""

    index: int
    own: float  # the own setting's true epoch rate
    best: float  # the best true rate at the run's batch size
    winner: float  # the winner's true rate (the own one if the winner would fail)
    tuning_s: float  # simulated seconds of trials
    tuning_samples: float  # samples trained during them (see :func:`_trained`)
    n_trials: int

    def time_ratio(self, run_s: float) -> float:
        """Time to train ``run_s`` seconds' worth of the own setting's samples with tuning,
        over ``run_s`` (below 1: tuning made the run shorter)."""
        total = self.own * run_s
        if self.tuning_samples >= total:  # the run ends during the tuning
            return total / (self.tuning_samples / self.tuning_s) / run_s
        return (self.tuning_s + (total - self.tuning_samples) / self.winner) / run_s

    def ideal_ratio(self) -> float:
        return self.own / self.best


def run_live(
    w: Workload, *, seed: int, budget_s: float, policy: SearchSettings
) -> LiveScore | None:
    """A live search on ``w`` at its own batch size, scored as :class:`LiveScore` (None when the
    own setting itself would fail: no run to tune)."""
    if failure_kind(w, w.baseline, "inline"):
        return None
    clock = FakeClock()
    runner = SimRunner(w, "inline", clock, np.random.default_rng([seed, w.index, 7]))
    runner.replays = False  # one batch fed again is no training batch
    settings = dataclasses.replace(
        policy,
        budget_s=budget_s,
        storage=optuna.storages.InMemoryStorage(),  # type: ignore[arg-type]
        study_name="sim",
        seed=(seed * 1_000_003 + w.index) % 2**31,
        resume=False,
    )
    bs = w.baseline.batch_size
    search = new_search(runner, w, baseline=w.baseline, batch_sizes=[bs], settings=settings)
    own = epoch_rate(w, w.baseline)
    winner = own
    try:
        pick = search.run().winner
        if not failure_kind(w, pick, "inline"):
            winner = epoch_rate(w, pick)
    except LoadertuneError:
        pass  # the run goes on with its own setting
    trials = runner.trace
    best = grid_best(w, dataclasses.replace(true_grid(w), batch_sizes=(bs,)), "inline")[0]
    return LiveScore(
        index=w.index,
        own=own,
        best=max(best, own),
        winner=winner,
        tuning_s=sum(t.result.wall_s for t in trials),
        tuning_samples=sum(map(_trained, trials)),
        n_trials=len(trials),
    )


def _trained(t: TraceLine) -> float:
    """Samples a live trial trains: none while its workers start and make the first batch (the
    loop waits), nor while the previous setting's stop; its warm-up and window at its rate."""
    m = t.result.measurement
    if not t.result.ok or m is None:
        return 0.0
    return t.true_epoch * (m.warmup_s + m.window_s)


LIVE_POLICIES = {"search's": SearchSettings(), "live": SearchSettings(live=True)}


def report_live(n: int, seed: int, budget_s: float, out: Any) -> None:
    """Each policy on the same workloads: run time with tuning / without, per run length."""
    p = lambda *a: print(*a, file=out)  # noqa: E731
    workloads = [draw_workload(seed, i) for i in range(n)]
    p(f"\n=== live tuning (run --tune): {n} workloads, budget {budget_s:g} s, own batch size ===")
    p("time with tuning / time with the run's own setting (below 1: tuning paid off)")
    ideal: list[float] = []
    for name, policy in LIVE_POLICIES.items():
        scores = [
            s
            for w in workloads
            if (s := run_live(w, seed=seed, budget_s=budget_s, policy=policy)) is not None
        ]
        ideal = [s.ideal_ratio() for s in scores]
        trials = [s.n_trials for s in scores]
        tuning = [s.tuning_s for s in scores]
        p(
            f"\npolicy {name}: trials median {statistics.median(trials):.0f}, "
            f"tuning s median {statistics.median(tuning):.1f} max {max(tuning):.1f}"
        )
        p(f"{'run':>8} {'median':>7} {'mean':>7} {'p95':>7} {'worst':>7} {'>1.02':>6} {'>1.10':>6}")
        for run_s in RUN_LENGTHS_S:
            r = np.asarray([s.time_ratio(run_s) for s in scores])
            p(
                f"{run_s:7.0f}s {np.median(r):7.3f} {r.mean():7.3f} {np.percentile(r, 95):7.3f} "
                f"{r.max():7.3f} {np.mean(r > 1.02):6.0%} {np.mean(r > 1.10):6.0%}"
            )
        flat = [s for s in scores if s.best <= 1.02 * s.own]
        if flat:
            r = np.asarray([s.time_ratio(600.0) for s in flat])
            p(
                f"  own already best (within 2%, {len(flat)} workloads), 600 s run: "
                f"median {np.median(r):.3f}, worst {r.max():.3f}"
            )
    if ideal:
        p(f"\nthe best setting from the start (no tuning): median {np.median(ideal):.3f}")


def _score_row(s: Score) -> dict[str, Any]:
    return {
        "mode": s.mode,
        "index": s.index,
        "ratio": s.ratio,
        "cause": s.cause,
        "stop": s.stop_reason,
        "sim_s": s.sim_s,
        "trials": s.n_trials,
    }


def report_paired(before_path: str, after_path: str, *, out: Any) -> int:
    """Two policies on the same workloads (two ``--scores-json`` files of one seed), workload
    by workload: how many picks each moved across 0.95, and the change in the share below it,
    in the 5th percentile and in the median, per mode. A difference of a few workloads in 300 is
    what noise alone makes: the paired counts say which workloads moved, both ways."""
    runs = []
    for path in (before_path, after_path):
        with open(path) as fh:
            runs.append(json.load(fh))
    if runs[0]["seed"] != runs[1]["seed"]:
        out.write(f"different seeds ({runs[0]['seed']} and {runs[1]['seed']}): not paired\n")
        return 2
    rows = [{(r["mode"], r["index"]): r for r in run["scores"]} for run in runs]
    for mode in sorted({m for m, _ in rows[0]}):
        keys = [k for k in rows[0] if k[0] == mode and k in rows[1]]
        a = np.array([rows[0][k]["ratio"] for k in keys])
        b = np.array([rows[1][k]["ratio"] for k in keys])
        up = [k[1] for k in keys if rows[0][k]["ratio"] < 0.95 <= rows[1][k]["ratio"]]
        down = [k[1] for k in keys if rows[1][k]["ratio"] < 0.95 <= rows[0][k]["ratio"]]
        out.write(
            f"{mode:7} n={len(keys)}  <0.95 {np.mean(a < 0.95):.1%} -> {np.mean(b < 0.95):.1%}"
            f"  p5 {np.percentile(a, 5):.3f} -> {np.percentile(b, 5):.3f}"
            f"  median {np.median(a):.3f} -> {np.median(b):.3f}"
            f"  mean {a.mean():.3f} -> {b.mean():.3f}\n"
            f"        rose past 0.95: {len(up)} {up[:20]}\n"
            f"        fell below 0.95: {len(down)} {down[:20]}\n"
            f"        sim s: median {np.median([rows[0][k]['sim_s'] for k in keys]):.1f}"
            f" -> {np.median([rows[1][k]['sim_s'] for k in keys]):.1f}\n"
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=300, help="workloads to draw")
    ap.add_argument("--seed", type=int, default=None, help="default: random (printed)")
    ap.add_argument(
        "--mode",
        choices=[*MODES, "both", "live"],
        default="both",
        help="live: tuning inside the real run, each policy's cost and gain against the "
        "run's own setting",
    )
    ap.add_argument("--budget", type=float, default=60.0, help="simulated seconds per search")
    ap.add_argument("--workload-json", help="write the drawn workloads to this file")
    ap.add_argument("--one", type=int, help="trace the search of workload INDEX, trial by trial")
    ap.add_argument(
        "--scores-json",
        help="write each search's score (mode, index, ratio, cause, stop reason) to this file",
    )
    ap.add_argument(
        "--paired",
        nargs=2,
        metavar=("BEFORE", "AFTER"),
        help="compare two --scores-json files of the same seed workload by workload, and exit",
    )
    ap.add_argument(
        "--oracle",
        action="store_true",
        help="also: how often a policy told the best setting and its closest rival below 0.95 "
        "still picks the rival under this noise (a floor under the share below 0.95)",
    )
    ap.add_argument(
        "--no-fork-server",
        action="store_true",
        help="every launch of a script starts a fresh interpreter (as before the fork server)",
    )
    ap.add_argument(
        "--ablate",
        default="",
        help="switch these rules of the search off (comma-separated; 'list' names them)",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a SearchSettings field, or a constant of loadertune.search as module.NAME "
        "(e.g. confirm.TIE_Z=1), for this run",
    )
    args = ap.parse_args(argv)
    for item in args.set:
        _set(item)
    ablations = _ablations()
    if args.ablate == "list":
        for name, (what, _) in ablations.items():
            print(f"{name:18} {what}")
        return 0
    for name in filter(None, args.ablate.split(",")):
        if name not in ablations:
            ap.error(f"--ablate: no rule {name!r} (--ablate list names them)")
        ablations[name][1]()
    if args.paired:
        return report_paired(*args.paired, out=sys.stdout)
    SimRunner.fork_server = not args.no_fork_server
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(3), "big")
    modes = list(MODES) if args.mode == "both" else [args.mode]
    print(f"seed {seed}, budget {args.budget:g} s (simulated), modes {', '.join(modes)}")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if args.mode == "live":
        report_live(args.n, seed, args.budget, sys.stdout)
        return 0
    if args.one is not None:
        w = draw_workload(seed, args.one)
        for mode in modes:
            trace: list[TraceLine] = []
            score, outcome = run_one(w, mode, seed=seed, budget_s=args.budget, trace=trace)
            print_trace(w, mode, score, outcome, trace)
        return 0
    workloads, scores = simulate(
        args.n, seed, modes, args.budget, progress=lambda m: print(m, file=sys.stderr)
    )
    if args.workload_json:
        with open(args.workload_json, "w") as fh:
            json.dump([w.to_dict() for w in workloads.values()], fh, indent=1)
    if args.scores_json:
        with open(args.scores_json, "w") as fh:
            json.dump(
                {"seed": seed, "scores": [_score_row(s) for m in modes for s in scores[m]]}, fh
            )
    for mode in modes:
        report(scores[mode], workloads, mode, args.budget, sys.stdout)
    every = [s.ratio for m in modes for s in scores[m]]
    print(
        f"\nall modes ({len(every)} searches{', ablated: ' + args.ablate if args.ablate else ''}): "
        f"below 0.90 {np.mean(np.less(every, 0.90)):.1%}, below 0.95 "
        f"{np.mean(np.less(every, 0.95)):.1%}, p5 {np.percentile(every, 5):.3f}"
    )
    if args.oracle:
        report_oracle(workloads, scores, seed, args.budget, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
