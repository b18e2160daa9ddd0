"""The cheap first probe: per-sample costs and stage ceilings (its seeds: :mod:`.seeds`).

Three measurements feed it (per sample, so the batch sizes they ran at need not match):

- ``num_workers=0``: loading runs inside ``next()`` in the main thread, so the blocked time per
  sample is the cost of producing a sample, and its CPU share tells computing from waiting (I/O).
- ``num_workers=1``: the cost of a sample in a worker, inter-process transfer included, and a
  worker's memory.
- replay: one cached batch fed to the step again and again: the consumer's rate with loading
  taken away (and its CPU use). With several batch sizes offered, a second replay at another
  batch size tells the step's fixed cost per batch (a step takes ``a + b·batch`` seconds), so
  the ceilings, and the workers needed, are known at every batch size (:meth:`Estimates.at`).

From these, the barrel principle gives the ceilings (loader, consumer, the CPUs they share) and
the number of workers needed to reach the lowest one; the seeds start around it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass
from typing import Any

from loadertune.hardware import Hardware
from loadertune.search.settings import SearchSettings
from loadertune.search.space import SearchSpace, worker_cap
from loadertune.trials import TrialResult

IO_BOUND_CPU_FRACTION = 0.5  # loading that computes less than half the time it takes waits on I/O


@dataclass(frozen=True)
class Estimates:
    """Per-sample costs and the ceilings they imply (rates in samples/s).

    Attributes:
        load_s_per_sample: wall time to produce one sample in the main process (``num_workers=0``).
        load_cpu_fraction: CPU time / wall time of that loading; low means it waits on I/O.
        worker_s_per_sample: wall time per sample with one worker, transfer included.
        step_s_per_sample: the consumer's time per sample (replay).
        step_cpu_per_sample: CPU seconds per sample the main process spends in the step.
        usable_cpus: CPUs the process tree can use.
        max_workers: the space's cap.
        consumer_ceiling: the step's rate with data already in memory.
        loader_ceiling: the most the loader can produce with ``max_workers`` on these CPUs.
        cpu_ceiling: the rate at which loading and step together use every usable CPU.
        transfer_ceiling: host-to-device rate (GPU only), or None.
        in_process_samples_per_s: the measured rate with ``num_workers=0``; no estimate of what
            is achievable can be below a rate already measured.
        step_per_batch_s: the step's fixed cost per batch (``a`` of ``a + b·batch``), from two
            replays at different batch sizes; 0: unknown (one replay), the step's cost per
            sample is then taken to be the same at every batch size.
        step_batch_size: the batch size the step's figures above are for (0: unknown).
        load_wait_fraction: the share of that loading's wall time it was ready to run while
            the CPUs ran other work (other processes): with the CPU share, what tells loading
            that computes from loading that waits on I/O.
        step_floored: the replay measured the step slower than a loop that also loaded (noise:
            another process took the CPUs), so ``consumer_ceiling`` is that loop's rate, a
            floor under the step's, not a bound on anything.
    """

    load_s_per_sample: float
    load_cpu_fraction: float
    worker_s_per_sample: float
    step_s_per_sample: float
    step_cpu_per_sample: float
    usable_cpus: int
    max_workers: int
    consumer_ceiling: float
    loader_ceiling: float
    cpu_ceiling: float
    transfer_ceiling: float | None = None
    in_process_samples_per_s: float = 0.0
    step_per_batch_s: float = 0.0
    step_batch_size: int = 0
    step_floored: bool = False
    load_wait_fraction: float = 0.0

    def at(self, batch_size: int) -> Estimates:
        """These estimates at ``batch_size``: the step's cost per sample is
        ``a / batch + b``, its CPU use scales with it, and the consumer's and the CPUs' ceilings
        follow; loading costs the same per sample at any batch. Unchanged without a fixed cost."""
        a, ref = self.step_per_batch_s, self.step_batch_size
        if a <= 0 or ref <= 0 or batch_size == ref or self.step_s_per_sample <= 0:
            return self
        step = a / batch_size + max(0.0, self.step_s_per_sample - a / ref)
        step_cpu = self.step_cpu_per_sample * step / self.step_s_per_sample
        per_sample_cpu = self.load_s_per_sample * self.load_cpu_fraction + step_cpu
        return dataclasses.replace(
            self,
            step_s_per_sample=step,
            step_cpu_per_sample=step_cpu,
            consumer_ceiling=1.0 / step if step > 0 else math.inf,
            cpu_ceiling=self.usable_cpus / per_sample_cpu if per_sample_cpu > 0 else math.inf,
            step_batch_size=batch_size,
        )

    @property
    def io_bound(self) -> bool:
        """Loading waits on I/O: it neither ran nor waited for a CPU most of its time."""
        return self.load_cpu_fraction + self.load_wait_fraction < IO_BOUND_CPU_FRACTION

    def _ceilings(self) -> dict[str, float]:
        named = {
            "consumer": self.consumer_ceiling,
            "loader": self.loader_ceiling,
            "cpu": self.cpu_ceiling,
        }
        if self.transfer_ceiling:
            named["transfer"] = self.transfer_ceiling
        return {k: v for k, v in named.items() if v > 0}

    @property
    def achievable(self) -> float:
        """The lowest ceiling of the worker pipeline, or the measured ``num_workers=0`` rate when
        that is higher (loading in the main process can beat workers whose transfer costs more
        than the loading itself)."""
        return max(self.in_process_samples_per_s, min(self._ceilings().values()))

    @property
    def limiting_stage(self) -> str:
        """The stage that sets :attr:`achievable`: ``"consumer"``, ``"loader"``, ``"cpu"``,
        ``"transfer"``, or ``"main_process"`` when loading in the loop's own process is best."""
        ceilings = self._ceilings()
        lowest = min(ceilings, key=lambda k: ceilings[k])
        return "main_process" if self.in_process_samples_per_s > ceilings[lowest] else lowest

    def _hard_ceilings(self) -> dict[str, float]:
        """The ceilings no worker count can lift: all but the loader's."""
        return {k: v for k, v in self._ceilings().items() if k != "loader"}

    @property
    def hard_ceiling(self) -> float:
        """The lowest ceiling no worker count can lift (step, CPUs, transfer)."""
        return min(self._hard_ceilings().values())

    def workers_needed(self) -> int:
        """Workers that feed the worker pipeline's lowest ceiling (at least 1)."""
        return max(1, math.ceil(min(self._ceilings().values()) * self.worker_s_per_sample * 1.05))

    def predicted_samples_per_s(self, num_workers: int) -> float:
        """The barrel model's rate for ``num_workers`` (0: loading and step take turns)."""
        if num_workers == 0:
            return 1.0 / (self.load_s_per_sample + self.step_s_per_sample)
        loader = num_workers / self.worker_s_per_sample
        cpu_for_loading = self.load_cpu_fraction * self.worker_s_per_sample
        if cpu_for_loading > 0:
            loader = min(loader, self.usable_cpus / cpu_for_loading)
        return min(loader, min(self._ceilings().values()))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(
            io_bound=self.io_bound,
            achievable=self.achievable,
            limiting_stage=self.limiting_stage,
            workers_needed=self.workers_needed(),
        )
        return data


def _per_sample(result: TrialResult, fraction: float) -> float:
    m = result.measurement
    assert m is not None and m.n_samples > 0
    return fraction * m.window_s / m.n_samples


def step_fixed_cost(replay: TrialResult, other: TrialResult | None) -> float:
    """The step's fixed seconds per batch, ``a`` of ``a + b·batch``, from two replays at
    different batch sizes (0 when there is one, or the two show no fixed cost)."""
    if other is None or not other.ok or not replay.ok:
        return 0.0
    b1, b2 = replay.config.batch_size, other.config.batch_size
    r1, r2 = replay.samples_per_s or 0.0, other.samples_per_s or 0.0
    if b1 == b2 or r1 <= 0 or r2 <= 0:
        return 0.0
    t1, t2 = b1 / r1, b2 / r2  # seconds per batch
    per_sample = max(0.0, (t2 - t1) / (b2 - b1))
    return max(0.0, t1 - per_sample * b1)


def _loop_floor(replay: TrialResult, w0: TrialResult, w1: TrialResult | None) -> float:
    """The least the step's own rate can be: what the probe's whole loops made (loading
    included, a loop runs no faster than its step), at a batch size no larger than the
    replay's (a larger batch spreads the step's fixed cost thinner). A replay measured below it
    was disturbed (a machine busy with other work). (Not the loop's time outside ``next()``: a GPU
    step's kernels run on while the next batch loads.)"""
    loops = [t for t in (w0, w1) if t is not None and t.ok]
    return max(
        (t.samples_per_s or 0.0 for t in loops if t.config.batch_size <= replay.config.batch_size),
        default=0.0,
    )


def estimate(
    *,
    w0: TrialResult,
    w1: TrialResult | None,
    replay: TrialResult,
    usable_cpus: int,
    max_workers: int,
    pinned: bool = True,
    replay2: TrialResult | None = None,
) -> Estimates:
    """Estimates from the probe's trials (each must have succeeded). ``pinned``: the transfer
    ceiling is the pinned copy rate (pin_memory is in the space) rather than the pageable one.
    ``replay2``: a replay at another batch size (see :func:`step_fixed_cost`)."""
    assert w0.measurement is not None and replay.measurement is not None
    load = _per_sample(w0, w0.measurement.blocked_fraction)
    cpu_fraction = w0.measurement.blocked_cpu_fraction
    cpu_fraction = 1.0 if cpu_fraction is None else min(1.0, cpu_fraction)
    floor = _loop_floor(replay, w0, w1)
    consumer = max(replay.measurement.samples_per_s, floor)
    step = 1.0 / consumer if consumer > 0 else 0.0
    main_cpu = (replay.resources.cpu_percent_main if replay.resources else None) or 100.0
    step_cpu = min(step * usable_cpus, step * main_cpu / 100.0)
    worker = load
    # Input-bound with its workers (one, or a baseline's own), their rate is theirs: each took
    # its count over that rate per sample; otherwise they kept up, and the in-process cost is
    # the better estimate of what a worker spends per sample.
    w1_rate = w1.samples_per_s if w1 is not None else None
    if w1_rate and w1 is not None and w1.measurement and w1.measurement.blocked_fraction > 0.2:
        worker = max(load, max(1, w1.config.num_workers) / w1_rate)
    load_cpu = load * cpu_fraction
    loader_ceiling = max_workers / worker if worker > 0 else math.inf
    if load_cpu > 0:
        loader_ceiling = min(loader_ceiling, usable_cpus / load_cpu)
    transfer_ceiling = None
    if replay.transfer:
        transfer_ceiling = replay.transfer[
            "pinned_samples_per_s" if pinned else "pageable_samples_per_s"
        ]
    per_sample_cpu = load_cpu + step_cpu
    cpu_ceiling = usable_cpus / per_sample_cpu if per_sample_cpu > 0 else math.inf
    return Estimates(
        load_s_per_sample=load,
        load_cpu_fraction=cpu_fraction,
        worker_s_per_sample=worker,
        step_s_per_sample=step,
        step_cpu_per_sample=step_cpu,
        usable_cpus=usable_cpus,
        max_workers=max_workers,
        consumer_ceiling=consumer,
        loader_ceiling=loader_ceiling,
        cpu_ceiling=cpu_ceiling,
        transfer_ceiling=transfer_ceiling,
        in_process_samples_per_s=w0.samples_per_s or 0.0,
        step_per_batch_s=step_fixed_cost(replay, replay2),
        step_batch_size=replay.config.batch_size,
        step_floored=floor > replay.measurement.samples_per_s,
        load_wait_fraction=w0.measurement.blocked_wait_fraction or 0.0,
    )


def workers_to_feed(w0: TrialResult, replay: TrialResult | None, usable_cpus: int) -> int | None:
    """Workers that keep the step fed, each waiting as loading waits in ``num_workers=0``:
    the rate to reach (the step's, or what the CPUs can load if lower) × wall time per sample.
    None when the probe cannot tell."""
    m0 = w0.measurement
    if m0 is None or m0.n_samples <= 0 or replay is None or not replay.ok:
        return None
    wall = _per_sample(w0, m0.blocked_fraction)
    cpu = wall * min(1.0, m0.blocked_cpu_fraction if m0.blocked_cpu_fraction is not None else 1.0)
    target = replay.samples_per_s or 0.0
    if cpu > 0:
        target = min(target, usable_cpus / cpu)
    return max(1, math.ceil(target * wall))


def main_bytes(w1: TrialResult | None) -> int:
    """The trial's main processes' memory in ``w1`` (its tree's less its workers'); 0 unknown."""
    usage = w1.resources if w1 is not None else None
    if usage is None or not usage.pss_bytes or not usage.worker_pss_bytes:
        return 0
    return max(0, usage.pss_bytes - usage.n_workers * usage.worker_pss_bytes)


def space_for(
    w0: TrialResult,
    w1: TrialResult | None,
    replay: TrialResult | None,
    *,
    hw: Hardware,
    settings: SearchSettings,
    batch_sizes: tuple[int, ...],
    uses_cuda: bool,
    epoch_samples: int | None,
    bytes_per_sample: float | None,
    persistent_workers: bool,
    ram_budget_bytes: int | None,
) -> SearchSpace:
    """The space the probe's trials call for: the worker range from what loading waits for
    (see :func:`~loadertune.search.space.worker_cap`), pinning only with CUDA,
    ``persistent_workers`` only with a known epoch length, batches in flight within the share of
    ``/dev/shm`` the settings allow. With several ranks (``settings.ranks``), each rank's loader
    gets its share of the CPUs, the RAM budget and ``/dev/shm``."""
    m0 = w0.measurement
    busy = m0.blocked_busy_fraction if m0 is not None else None
    io_bound = (busy if busy is not None else 1.0) < IO_BOUND_CPU_FRACTION
    ranks = settings.ranks
    cpus = max(1, hw.usable_cpus // ranks)
    # A worker's memory as seen: torch's batches in flight sit in /dev/shm, not in it (with
    # 32 MiB batches, prefetch 1 -> 4 added 192 MiB to /dev/shm and at most 34 MiB to a
    # worker: python scripts/bench_worker_memory.py).
    usage = w1.resources if w1 is not None else None
    own = usage.worker_pss_bytes if usage is not None and usage.worker_pss_bytes else None
    workers_ram = (ram_budget_bytes - main_bytes(w1)) / ranks if ram_budget_bytes else None
    if workers_ram is not None and workers_ram <= 0:  # a quirk of the figures: no rule from them
        workers_ram = None
    # the cap: workers at the least demanding setting (one batch of the smallest in flight)
    least = own + (bytes_per_sample or 0.0) * min(batch_sizes) if own else None
    cap, limits = worker_cap(
        usable_cpus=cpus,
        io_bound=io_bound,
        workers_needed=workers_to_feed(w0, replay, cpus),
        ram_budget_bytes=int(workers_ram) if workers_ram is not None else None,
        worker_pss_bytes=int(least) if least else None,
        open_files_limit=hw.open_files_limit,
        user_max=settings.max_workers,
    )
    return SearchSpace(
        batch_sizes=batch_sizes,
        max_workers=cap,
        pin_memory=(False, True) if uses_cuda else (False,),
        persistent_workers=(False, True) if epoch_samples else (persistent_workers,),
        max_in_flight_bytes=settings.shm_fraction * hw.shm_free_bytes / ranks
        if hw.shm_free_bytes
        else None,
        bytes_per_sample=bytes_per_sample,
        epoch_samples=epoch_samples,
        worker_bytes=own,
        workers_ram_bytes=workers_ram,
        limits=limits,
    )
