"""CPU, host memory and GPU use of a trial's process tree, sampled from outside the hot loop.

A :class:`ResourceSampler` runs in the supervising process (a thread beside an in-process trial,
or the parent of a script trial). It watches ``root_pid`` and all its descendants (the DataLoader
workers; under torch's launcher, the ranks too: they are main processes, not workers, once named
in :attr:`ResourceSampler.main_pids`). Reading PSS costs milliseconds of CPU per process, in
this process, where an in-process trial's loop runs; with a hundred workers, reading every one at
the window's start, and again every quarter second while the RSS sum (which counts shared pages
once per process, many times the PSS) stands above the memory budget, slows the measured loop
markedly (``python scripts/bench_meter_cost.py``). So the window's ends read the main processes
and :data:`SAMPLED_WORKERS` workers (the workers of a loader are alike; totals are scaled to the
count), and a breach the RSS suggests is confirmed by a read of every process only once the RSS
has grown, since the last such read, by more than the room that read left below the budget. GPU
utilization comes from NVML's own sample buffer over the window, with polling as a fallback for
devices that cannot report it.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import psutil

from loadertune.measure import nvml


@dataclass
class ResourceUsage:
    """Resources a trial used during its measured window. 100% CPU = one CPU busy."""

    cpu_percent_main: float | None = None  # the main processes': the trial's, or every rank's
    cpu_percent_workers: float | None = None
    n_workers: int = 0
    pss_bytes: int | None = None  # main + workers, at the window's end
    worker_pss_bytes: int | None = None  # mean per worker, at the window's end
    worker_uss_growth_bytes_per_s: float | None = None  # sum over workers; >0 = copy-on-read
    rss_peak_bytes: int = 0  # highest RSS sum seen (an upper bound of real use)
    max_open_files: int = 0  # most file descriptors one process of the tree held
    open_files_limit: int | None = None  # RLIMIT_NOFILE of the trial's main process
    gpu_index: int | None = None
    gpu_util_percent: list[int] = field(default_factory=list)  # NVML samples in the window
    # what other processes kept busy of the CPUs this process may run on, in the window (a
    # shared machine's load, which moves every figure); None where it cannot be told
    cpu_percent_others: float | None = None

    @property
    def gpu_util_mean(self) -> float | None:
        return statistics.fmean(self.gpu_util_percent) if self.gpu_util_percent else None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["gpu_util_mean"] = self.gpu_util_mean
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ResourceUsage:
        """The usage :meth:`to_dict` wrote (its derived figures are left out)."""
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


def _child_pids(pid: int) -> list[int] | None:
    """Children of ``pid`` from ``/proc/PID/task/*/children`` (Linux), or None if unreadable."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    pids: list[int] = []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                pids.extend(int(c) for c in fh.read().split())
        except OSError:
            if not os.path.exists(f"/proc/{pid}/task/{tid}"):
                continue  # the thread ended meanwhile
            return None  # the kernel does not provide the file
    return pids


def process_tree(root: psutil.Process | None) -> list[psutil.Process]:
    """``root`` and its live descendants (none without a root).

    Reads each process's own list of children where Linux provides it: cost proportional to
    the tree, where psutil's ``children()`` reads every process of the machine.
    """
    if root is None:
        return []
    procs, todo = [root], [root.pid]
    while todo:
        kids = _child_pids(todo.pop())
        if kids is None:
            break
        for pid in kids:
            with contextlib.suppress(psutil.Error):
                procs.append(psutil.Process(pid))
                todo.append(pid)
    else:
        return procs
    try:
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def _sum_rss(procs: list[psutil.Process]) -> int:
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total


# Workers whose memory is read at a window's ends (a loader's workers are alike).
SAMPLED_WORKERS = 4


def multiprocessing_helper(proc: psutil.Process) -> bool:
    """A process multiprocessing keeps for this process's lifetime (the resource tracker; the
    fork server, Python 3.14's default): not a worker, and killing it breaks multiprocessing."""
    try:
        cmdline = " ".join(proc.cmdline())
    except psutil.Error:
        return False
    return "multiprocessing.resource_tracker" in cmdline or "multiprocessing.forkserver" in cmdline


def _workers(procs: list[psutil.Process], mains: set[int]) -> list[psutil.Process]:
    """The processes of ``procs`` that are neither main processes nor multiprocessing's own."""
    return [p for p in procs if p.pid not in mains and not multiprocessing_helper(p)]


def _sampled(
    procs: list[psutil.Process], mains: set[int], workers: list[psutil.Process] | None = None
) -> list[psutil.Process]:
    """The main processes and at most :data:`SAMPLED_WORKERS` workers (``workers``, if already
    found), spread over the pids."""
    spread = sorted(_workers(procs, mains) if workers is None else workers, key=lambda p: p.pid)
    step = max(1, len(spread) // SAMPLED_WORKERS)
    return [p for p in procs if p.pid in mains] + spread[::step][:SAMPLED_WORKERS]


def _memory_full(procs: list[psutil.Process]) -> dict[int, tuple[int, int]]:
    """pid -> (pss, uss) for each process still alive."""
    out = {}
    for p in procs:
        try:
            info = p.memory_full_info()
            out[p.pid] = (int(getattr(info, "pss", info.rss)), int(info.uss))
        except psutil.Error:
            pass
    return out


def tree_pss(root_pid: int) -> int:
    """PSS summed over ``root_pid`` and its descendants (0 if it is gone)."""
    try:
        procs = process_tree(psutil.Process(root_pid))
    except psutil.Error:
        return 0
    return sum(pss for pss, _ in _memory_full(procs).values())


def _max_fds(procs: list[psutil.Process]) -> int:
    most = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            most = max(most, p.num_fds())
    return most


def _cpu_seconds(procs: list[psutil.Process]) -> dict[int, float]:
    out = {}
    for p in procs:
        try:
            t = p.cpu_times()
            out[p.pid] = t.user + t.system
        except psutil.Error:
            pass
    return out


def _busy_cpu_seconds() -> float | None:
    """Seconds the CPUs this process may run on have been busy, whoever kept them so (steal
    included: a virtual machine's host gave the time to another); None where it cannot be told.
    (Under a cgroup quota below those CPUs their load is not what slows this process: the
    diagnosis, which knows the quota, leaves the figure out there.)"""
    try:
        cpus = sorted(os.sched_getaffinity(0))
        per_cpu = psutil.cpu_times(percpu=True)
    except (AttributeError, OSError, psutil.Error):
        return None
    busy = 0.0
    for i in cpus:
        if i >= len(per_cpu):
            return None
        t = per_cpu[i]
        busy += t.user + t.nice + t.system
        busy += sum(getattr(t, name, 0.0) for name in ("irq", "softirq", "steal"))
    return busy


def _reaped_cpu_seconds(procs: list[psutil.Process], mains: set[int]) -> float:
    """The CPU seconds of the main processes' children that have ended and been waited for
    (their whole lives): the kernel adds them to the parent's ``children_*`` times. A
    DataLoader's workers are joined when their epoch ends, so they are counted there."""
    total = 0.0
    for p in procs:
        if p.pid in mains:
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                total += t.children_user + t.children_system
    return total


@dataclass
class _Snapshot:
    wall: float
    cpu: dict[int, float]
    memory: dict[int, tuple[int, int]] | None = None
    busy: float | None = None  # _busy_cpu_seconds()
    workers: frozenset[int] = frozenset()  # the pids of ``cpu`` that are workers
    reaped: float = 0.0  # _reaped_cpu_seconds()


class ResourceSampler:
    """Sample a process tree while a trial runs.

    Every :attr:`INTERVAL_S` it checks the memory budget (the PSS that crossed it is left in
    :attr:`budget_hit`, for the supervisor) and, in the window, polls the GPU's utilization (the
    fallback for a device that keeps no samples).

    Args:
        root_pid: the trial's main process (this one, for an in-process trial).
            :attr:`main_pids` names more main processes below it (the ranks under torch's
            launcher, whose root is the launcher); every other descendant is a worker.
        budget_bytes: the tree's PSS that ends the trial (None: no check).
        gpu_index: NVML index of the trial's GPU, or None without one.
        clock: seconds, monotonic: the wall time of each snapshot (tests pass a fake one).
    """

    INTERVAL_S = 0.25

    def __init__(
        self,
        root_pid: int,
        *,
        budget_bytes: int | None = None,
        gpu_index: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._root_pid = root_pid
        self._clock = clock  # the wall time the tree's CPU seconds are divided by
        try:
            self._root: psutil.Process | None = psutil.Process(root_pid)
        except psutil.NoSuchProcess:
            # Ended (and reaped, by the fork server) before it was watched: a script out of
            # epochs between two settings. Its tree is empty; the trial learns of the end from
            # the process's own channel and output, as of any other end.
            self._root = None
        self.main_pids: set[int] = set()
        self.seen_pids: set[int] = set()  # every process of the tree seen, while it lasts
        self._budget = budget_bytes
        self.gpu_index = gpu_index
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._want_start = threading.Event()
        self._thread = threading.Thread(target=self._run, name="loadertune-sampler", daemon=True)
        self._start: _Snapshot | None = None
        self._start_unix_us = 0
        self._polled: list[tuple[int, int]] = []  # (µs since the epoch, busy percent)
        self._window_open = False
        self.usage = ResourceUsage(gpu_index=gpu_index)
        self.budget_hit: int | None = None

    def __enter__(self) -> ResourceSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=5)

    def window_started(self) -> None:
        """Mark the window's start; the snapshot is taken by the sampler thread, not the caller."""
        self._start_unix_us = int(time.time() * 1e6)
        self._polled = []
        self._window_open = True
        self._want_start.set()
        self._wake.set()

    def window_ended(self, window_s: float | None = None) -> ResourceUsage:
        """Snapshot the tree now (workers must still be alive) and return the window's usage.

        ``window_s``: the window as the meter timed it. The CPU figures are left out (None) when
        the start snapshot came less than half of it before now: they would describe a moment,
        not the window. That happens when the window's start is heard late, as in a script
        without an optimizer, whose loader is known (and its events sent) only once its window
        is full: a short window's workers would then read 0% busy."""
        self._window_open = False
        end_unix_us = int(time.time() * 1e6)
        end, procs, found = self._snapshot()
        mains = self._mains()
        start = self._start
        u = self.usage
        workers = [p.pid for p in found if p.pid in end.cpu]
        # A whole epoch's non-persistent workers are shut down as it ends, before this
        # snapshot: the workers are then those of the start (else they would count as none).
        gone = [] if start is None else sorted((start.workers & start.cpu.keys()) - end.cpu.keys())
        u.n_workers = len(workers) or len(gone)
        if start is not None and end.wall - start.wall > 0.5 * (window_s or 0.0):
            wall = end.wall - start.wall
            # Processes that ended in the window, their whole lives (the workers of an epoch
            # that began and ended within it too), less what those alive at the start had used.
            reaped = max(0.0, end.reaped - start.reaped - sum(start.cpu[p] for p in gone))

            def busy(pids: list[int]) -> float:  # a process started in the window: its life
                return sum(end.cpu[p] - start.cpu.get(p, 0.0) for p in pids)

            main = [pid for pid in end.cpu if pid in mains]
            u.cpu_percent_main = 100.0 * busy(main) / wall if self._root_pid in end.cpu else None
            u.cpu_percent_workers = 100.0 * (busy(workers) + reaped) / wall
            if start.busy is not None and end.busy is not None:
                ours = busy(list(end.cpu)) + reaped  # the tree's own time
                u.cpu_percent_others = max(0.0, 100.0 * (end.busy - start.busy - ours) / wall)
            if start.memory is not None and end.memory is not None:
                common = [p for p in workers if p in start.memory and p in end.memory]
                if common:  # the sampled workers' mean, for every worker
                    growth = statistics.fmean(end.memory[p][1] - start.memory[p][1] for p in common)
                    u.worker_uss_growth_bytes_per_s = growth * len(workers) / wall
        if end.memory:
            worker_pss = [end.memory[p][0] for p in workers if p in end.memory]
            if not worker_pss and start is not None and start.memory:  # as they ran
                worker_pss = [start.memory[p][0] for p in gone if p in start.memory]
            u.worker_pss_bytes = int(statistics.fmean(worker_pss)) if worker_pss else None
            main_pss = sum(pss for pid, (pss, _) in end.memory.items() if pid in mains)
            u.pss_bytes = main_pss + (u.worker_pss_bytes or 0) * u.n_workers
        u.rss_peak_bytes = max(u.rss_peak_bytes, _sum_rss(procs))
        u.gpu_index = self.gpu_index  # found at the window's start, where the trial reports it
        if self.gpu_index is not None:
            within = nvml.utilization_within(self.gpu_index, self._start_unix_us, end_unix_us)
            if within is not None:
                u.gpu_util_percent = within
            else:  # polled, each over the period before it: those a whole period in
                inside = self._start_unix_us + nvml.SAMPLE_PERIOD_MAX_US
                u.gpu_util_percent = [v for at, v in self._polled if at >= inside]
        return u

    def _memory_at_hit(
        self, memory: dict[int, tuple[int, int]], procs: list[psutil.Process]
    ) -> None:
        """What each worker held when the budget was crossed: the search learns from a failed
        trial how many workers would fit."""
        u = self.usage
        pids = {p.pid for p in _workers(procs, self._mains())}
        workers = [pss for pid, (pss, _) in memory.items() if pid in pids]
        u.pss_bytes = sum(pss for pss, _ in memory.values())
        u.n_workers = len(workers)
        u.worker_pss_bytes = int(statistics.fmean(workers)) if workers else None

    @property
    def root(self) -> psutil.Process | None:
        """The tree's root (None: it had ended before it was watched)."""
        return self._root

    def _mains(self) -> set[int]:
        return {self._root_pid, *self.main_pids}

    def _snapshot(self) -> tuple[_Snapshot, list[psutil.Process], list[psutil.Process]]:
        """The tree now (its processes' CPU times, a few workers' memory, the CPUs' busy time,
        what ended children used), its processes, and its workers."""
        procs = self._tree()
        mains = self._mains()
        found = _workers(procs, mains)
        snapshot = _Snapshot(
            self._clock(),
            _cpu_seconds(procs),
            _memory_full(_sampled(procs, mains, found)),
            _busy_cpu_seconds(),
            frozenset(p.pid for p in found),
            _reaped_cpu_seconds(procs, mains),
        )
        return snapshot, procs, found

    def _tree(self) -> list[psutil.Process]:
        procs = process_tree(self._root)
        self.seen_pids.update(p.pid for p in procs)
        return procs

    def _run(self) -> None:
        # Finding the tree scans every process of the machine and counting descriptors lists
        # directories: both once a second. The budget check reads one small file per process.
        procs: list[psutil.Process] = []
        tick = 0
        confirmed_rss, room = 0, 0  # the RSS at the last full PSS read, and the PSS's room then
        while True:
            self._wake.wait(self.INTERVAL_S)
            self._wake.clear()
            if self._stop.is_set():
                return
            if self._want_start.is_set():
                self._want_start.clear()
                self._start, procs, _ = self._snapshot()
            slow = tick % max(1, round(1.0 / self.INTERVAL_S)) == 0
            tick += 1
            if slow or not procs:
                procs = self._tree()
                fds = _max_fds(_sampled(procs, self._mains()))
                self.usage.max_open_files = max(self.usage.max_open_files, fds)
                with contextlib.suppress(psutil.Error, AttributeError):  # a script may lower it
                    if self._root is not None:
                        self.usage.open_files_limit = self._root.rlimit(psutil.RLIMIT_NOFILE)[0]
            rss = _sum_rss(procs)
            self.usage.rss_peak_bytes = max(self.usage.rss_peak_bytes, rss)
            if (
                self._budget is not None
                and rss > self._budget
                and self.budget_hit is None
                and rss - confirmed_rss > room  # the PSS may have crossed since the last read
            ):
                memory = _memory_full(procs)
                pss = sum(p for p, _ in memory.values())  # RSS overcounts; confirm
                if pss > self._budget:
                    self.budget_hit = pss
                    self._memory_at_hit(memory, procs)
                # the tree's PSS grows by no more than its RSS does
                confirmed_rss, room = rss, self._budget - pss
            if self._window_open and self.gpu_index is not None:
                value = nvml.utilization_now(self.gpu_index)
                if value is not None:
                    self._polled.append((int(time.time() * 1e6), value))
