"""The space of DataLoader settings worth trying on this machine.

The space comes from the hardware and from what the first probe measured: ``num_workers`` runs
from 0 to a cap set by the usable CPUs (higher when loading waits on I/O rather than computing),
by host RAM per worker and by ``/dev/shm``, which holds every batch in flight
(``num_workers * prefetch_factor`` of them). ``pin_memory`` is searched only with CUDA, and
``persistent_workers`` only when the epoch length is known (its benefit is a per-epoch saving).
With a known epoch length, ``num_workers`` stays within an epoch's batches at each batch size:
torch hands an epoch's batches to the workers in turn from the first at every epoch, so a worker
past the epoch's batch count gets none (on a 16-CPU machine a search had measured 24 and 34
workers for an epoch of 28 batches).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from loadertune.config import Config
from loadertune.units import MIB

DEFAULT_PREFETCH_FACTORS = (1, 2, 4, 8)
# The buffer a new worker setting starts with (the seeds, the climbs from in-process loading):
# torch's default of 2 is the shallow end. Workers and the step both vary batch to batch, and
# whichever runs ahead waits once the buffer is full or empty; where they share the CPUs a
# stalled worker's CPU goes to the step's spinning threads (docs/design.md has the measurement).
# The seeds still measure 2 (and 1) beside it, and the shared-memory budget lowers it where it
# must.
START_PREFETCH = 4
MAX_WORKERS_HARD = 256


@dataclass(frozen=True)
class SearchSpace:
    """The settings a search may try.

    Attributes:
        batch_sizes: candidates, ascending.
        max_workers: the highest ``num_workers``.
        prefetch_factors: candidates for ``prefetch_factor`` (with workers only).
        pin_memory: candidates (``(False,)`` without CUDA).
        persistent_workers: candidates (``(False,)`` or fixed when the epoch length is unknown).
        max_in_flight_bytes: bytes that batches in flight may take (shared memory and RAM); a
            setting over it is never tried. None: no limit known.
        bytes_per_sample: size of one collated sample, measured by the probe.
        worker_bytes: a worker's memory as measured (torch's batches in flight sit in
            ``/dev/shm``, apart from it; None: unknown).
        workers_ram_bytes: the RAM the budget leaves the workers and their batches in flight,
            beside the loop's own process; a setting over it is never tried (None: unknown).
        epoch_samples: samples per epoch, when known: ``num_workers`` stays within an epoch's
            batches.
        limits: why ``max_workers`` is what it is (for the report).
    """

    batch_sizes: tuple[int, ...]
    max_workers: int
    prefetch_factors: tuple[int, ...] = DEFAULT_PREFETCH_FACTORS
    pin_memory: tuple[bool, ...] = (False,)
    persistent_workers: tuple[bool, ...] = (False, True)
    max_in_flight_bytes: float | None = None
    bytes_per_sample: float | None = None
    epoch_samples: int | None = None
    worker_bytes: float | None = None
    workers_ram_bytes: float | None = None
    limits: dict[str, int] = field(default_factory=dict, compare=False)

    def batches_per_epoch(self, batch_size: int) -> int | None:
        return math.ceil(self.epoch_samples / batch_size) if self.epoch_samples else None

    def in_flight_bytes(self, config: Config) -> float | None:
        if self.bytes_per_sample is None:
            return None
        return config.in_flight_batches * config.batch_size * self.bytes_per_sample

    def rejects(self, config: Config) -> str | None:
        """Why ``config`` is outside the space, or None when it may be tried."""
        if config.batch_size not in self.batch_sizes:
            return f"batch_size {config.batch_size} is not a candidate {self.batch_sizes}"
        if config.num_workers > self.max_workers:
            return f"num_workers {config.num_workers} > max_workers {self.max_workers}"
        batches = self.batches_per_epoch(config.batch_size)
        if batches is not None and config.num_workers > max(1, batches):
            return (
                f"num_workers {config.num_workers} > the {batches} batches of an epoch at "
                f"batch_size {config.batch_size}: a worker past them gets none"
            )
        if config.num_workers:
            if config.prefetch_factor not in self.prefetch_factors:
                return f"prefetch_factor {config.prefetch_factor} is not a candidate"
            if config.persistent_workers not in self.persistent_workers:
                return f"persistent_workers={config.persistent_workers} is not searched"
        if config.pin_memory not in self.pin_memory:
            return (
                "pin_memory needs CUDA" if config.pin_memory else "pin_memory=False is not searched"
            )
        in_flight = self.in_flight_bytes(config)
        if (
            self.max_in_flight_bytes is not None
            and in_flight is not None
            and in_flight > self.max_in_flight_bytes
        ):
            return (
                f"{config.in_flight_batches} batches in flight need {in_flight / MIB:.0f} MiB, "
                f"over the {self.max_in_flight_bytes / MIB:.0f} MiB shared-memory budget"
            )
        if config.num_workers and self.worker_bytes and self.workers_ram_bytes is not None:
            need = config.num_workers * self.worker_bytes + (in_flight or 0.0)
            if need > self.workers_ram_bytes:
                return (
                    f"{config.num_workers} workers and their batches in flight need about "
                    f"{need / MIB:.0f} MiB, over the {self.workers_ram_bytes / MIB:.0f} MiB "
                    "of RAM the budget leaves them"
                )
        return None

    def configs(self) -> list[Config]:
        """Every setting in the space (the exhaustive grid)."""
        out = []
        for bs, pin in itertools.product(self.batch_sizes, self.pin_memory):
            out.append(Config(bs, 0, None, pin, False))
            for w, pf, pers in itertools.product(
                range(1, self.max_workers + 1), self.prefetch_factors, self.persistent_workers
            ):
                out.append(Config(bs, w, pf, pin, pers))
        return [c for c in out if self.rejects(c) is None]

    def nearest(self, config: Config) -> Config:
        """The setting in the space closest to ``config`` (used to seed from estimates)."""
        bs = min(self.batch_sizes, key=lambda b: abs(math.log2(b) - math.log2(config.batch_size)))
        w = min(config.num_workers, self.max_workers)
        pin = config.pin_memory if config.pin_memory in self.pin_memory else self.pin_memory[0]
        if w == 0:
            return Config(bs, 0, None, pin, False)
        pf = min(self.prefetch_factors, key=lambda p: abs(p - (config.prefetch_factor or 2)))
        pers = (
            config.persistent_workers
            if config.persistent_workers in self.persistent_workers
            else self.persistent_workers[0]
        )
        candidate = Config(bs, w, pf, pin, pers)
        while self.rejects(candidate) is not None and candidate.num_workers > 0:
            smaller_pf = [p for p in self.prefetch_factors if p < (candidate.prefetch_factor or 0)]
            if smaller_pf:
                candidate = Config(bs, candidate.num_workers, max(smaller_pf), pin, pers)
            elif candidate.num_workers > 1:
                candidate = Config(
                    bs, candidate.num_workers - 1, max(self.prefetch_factors), pin, pers
                )
            else:
                candidate = Config(bs, 0, None, pin, False)
        return candidate


FDS_PER_WORKER = 8  # the parent's pipes, queues and sentinels per worker, with room to spare


def worker_cap(
    *,
    usable_cpus: int,
    io_bound: bool,
    workers_needed: int | None = None,
    ram_budget_bytes: int | None = None,
    worker_pss_bytes: int | None = None,
    open_files_limit: int | None = None,
    user_max: int | None = None,
) -> tuple[int, dict[str, int]]:
    """The highest ``num_workers`` worth trying, and each limit that went into it.

    CPU-bound loading gains nothing past the usable CPUs (the training loop needs one too), so
    the cap is ``usable_cpus + 1`` to see the downturn. Loading that waits on I/O overlaps its
    waits: no rule of thumb bounds it, only what the wait needs. ``workers_needed`` (the probe's
    rate to reach × wall time per sample) sets the cap with 50% to spare, never below 8 per CPU.
    The machine bounds it: RAM per
    worker (``worker_pss_bytes``, in what the budget leaves the workers), the open-file limit,
    and a hard ceiling.
    """
    if io_bound:
        cpu = max(usable_cpus * 8, math.ceil(1.5 * (workers_needed or 0)))
    else:
        cpu = usable_cpus + 1
    limits = {"cpu": min(MAX_WORKERS_HARD, cpu)}
    if ram_budget_bytes and worker_pss_bytes:
        limits["ram"] = max(1, int(ram_budget_bytes // worker_pss_bytes))
    if open_files_limit:
        limits["fds"] = max(1, open_files_limit // FDS_PER_WORKER)
    if user_max is not None:
        limits["user"] = user_max
    return max(0, min(limits.values())), limits
