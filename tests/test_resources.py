"""The resource sampler watches a real process tree without loading the loop it measures: PSS
costs milliseconds of this process's CPU per process read, so a window reads a few workers and
a budget breach is confirmed once, not at every check."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from multiprocessing import resource_tracker
from typing import Any

import psutil
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from loadertune.measure import resources
from loadertune.measure.resources import ResourceSampler, process_tree, tree_pss


def started(workers: int) -> Iterator[Any]:
    loader = DataLoader(TensorDataset(torch.zeros(10_000, 8)), batch_size=8, num_workers=workers)
    it = iter(loader)
    next(it)  # every worker has started
    return it


def spy_on_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many processes each PSS read covered."""
    reads: list[int] = []
    real = resources._memory_full

    def counting(procs: list[psutil.Process]) -> dict[int, tuple[int, int]]:
        reads.append(len(procs))
        return real(procs)

    monkeypatch.setattr(resources, "_memory_full", counting)
    return reads


def test_a_window_reads_a_few_workers_memory_and_scales_it_to_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    resource_tracker.ensure_running()  # multiprocessing's helper: a child, not a worker
    it = started(12)
    full = tree_pss(os.getpid())  # every process, read before the spy
    reads = spy_on_reads(monkeypatch)
    with ResourceSampler(os.getpid()) as sampler:
        sampler.window_started()
        time.sleep(0.5)  # the sampler's thread takes the start's snapshot
        usage = sampler.window_ended()
    del it
    assert len(reads) == 2 and max(reads) == 1 + resources.SAMPLED_WORKERS, reads
    assert usage.n_workers == 12
    assert usage.pss_bytes is not None and 0.75 * full < usage.pss_bytes < 1.25 * full
    assert usage.worker_pss_bytes is not None and usage.worker_pss_bytes > 0


def test_a_breach_the_rss_suggests_is_confirmed_once_while_the_rss_holds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The RSS sum counts the pages workers share once per process: above a budget the PSS is
    well below. One full read shows the room left; the next waits for the RSS to grow by it
    (before, every check read every process: 0.4 s of CPU each at 108 workers)."""
    it = started(8)
    tree = process_tree(psutil.Process(os.getpid()))
    rss = resources._sum_rss(tree)
    pss = tree_pss(os.getpid())
    assert rss > 1.5 * pss, (rss, pss)
    reads = spy_on_reads(monkeypatch)
    with ResourceSampler(os.getpid(), budget_bytes=(rss + pss) // 2) as sampler:
        time.sleep(6 * ResourceSampler.INTERVAL_S + 0.1)
    del it
    assert sampler.budget_hit is None
    assert reads == [len(tree)], reads  # one read, of every process


def test_a_budget_hit_counts_the_workers_not_multiprocessing_s_helper() -> None:
    """The back-off sizes the next worker count by what each worker held at the hit."""
    resource_tracker.ensure_running()
    it = started(3)
    with ResourceSampler(os.getpid(), budget_bytes=1) as sampler:
        deadline = time.monotonic() + 10
        while sampler.budget_hit is None and time.monotonic() < deadline:
            time.sleep(0.05)
    del it
    assert sampler.budget_hit is not None
    assert sampler.usage.n_workers == 3


def test_a_window_tells_what_other_processes_kept_busy() -> None:
    """A process outside the tree spinning on a CPU shows as others' load: the share of the
    machine that moved the trial's figures; the tree's own CPU is not counted as others'."""
    import subprocess
    import sys

    cpus = sorted(os.sched_getaffinity(0))
    pin = f"import os; os.sched_setaffinity(0, {{{cpus[0]}}}); "
    spin = subprocess.Popen([sys.executable, "-c", pin + "exec('while True: pass')"])
    root = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    spinner = psutil.Process(spin.pid)
    try:
        time.sleep(0.5)  # both started
        with ResourceSampler(root.pid) as sampler:
            spun = sum(spinner.cpu_times()[:2])
            sampler.window_started()
            time.sleep(1.5)
            busy = sampler.window_ended()
            spun = sum(spinner.cpu_times()[:2]) - spun
    finally:
        spin.kill()
        spin.wait()
    try:
        with ResourceSampler(os.getpid()) as sampler:  # this process rests: others' load alone
            sampler.window_started()
            time.sleep(1.5)
            quiet = sampler.window_ended()
        with ResourceSampler(os.getpid()) as sampler:  # this process spins: its own CPU
            sampler.window_started()
            t0, cpu0 = time.monotonic(), time.process_time()
            while time.monotonic() - t0 < 1.5:
                pass
            own = sampler.window_ended()
            used = (time.process_time() - cpu0) / (time.monotonic() - t0)
    finally:
        root.kill()
        root.wait()
    # What each process was given, however loaded the machine is, not a fixed share of a CPU.
    assert busy.cpu_percent_others is not None
    assert busy.cpu_percent_others > 0.7 * 100 * spun / 1.5
    assert own.cpu_percent_main is not None and own.cpu_percent_main > 0.7 * 100 * used
    # Its own spin (a whole CPU, 100) is not others': what others take is as when it rested
    # (a loaded machine's other processes, such as another test run, count in both).
    assert own.cpu_percent_others is not None and quiet.cpu_percent_others is not None
    assert own.cpu_percent_others < quiet.cpu_percent_others + 50


def test_cpu_figures_need_a_start_snapshot_that_covers_the_window() -> None:
    """A window's start heard late (a script without an optimizer sends its loader's events
    only once the window is full) leaves a snapshot interval of a moment: no CPU figures then,
    rather than a busy worker read as idle. The workers are still counted."""
    it = started(2)
    with ResourceSampler(os.getpid()) as sampler:
        sampler.window_started()
        time.sleep(0.5)  # the start's snapshot is taken
        covered = sampler.window_ended(window_s=0.6)
    with ResourceSampler(os.getpid()) as sampler:
        sampler.window_started()
        time.sleep(0.5)
        late = sampler.window_ended(window_s=3.0)  # the window ran 3 s; the snapshot saw 0.5
    del it
    assert covered.cpu_percent_main is not None and covered.cpu_percent_workers is not None
    assert late.cpu_percent_main is None and late.cpu_percent_workers is None
    assert covered.n_workers == late.n_workers == 2


class Spin(torch.utils.data.Dataset):
    """Each item keeps a CPU busy for 10 ms."""

    def __len__(self) -> int:
        return 200

    def __getitem__(self, i: int) -> torch.Tensor:
        t0 = time.process_time()
        while time.process_time() - t0 < 0.01:
            pass
        return torch.zeros(8)


def test_workers_an_epoch_end_shut_down_are_counted_as_they_ran() -> None:
    """A whole epoch's window ends with the epoch, and a non-persistent loader has shut its
    workers down by then: their CPU (the kernel adds an ended child's to its parent) and their
    memory at the window's start still count. Before, 2 busy workers read 0 workers at 0%."""
    it = iter(DataLoader(Spin(), batch_size=2, num_workers=2))
    next(it)  # every worker has started
    pids = [w.pid for w in it._workers]  # type: ignore[attr-defined]
    with ResourceSampler(os.getpid()) as sampler:
        sampler.window_started()
        time.sleep(0.3)  # the start's snapshot is taken
        for _ in it:  # to the epoch's end: the workers are joined
            pass
        assert len(pids) == 2 and not any(psutil.pid_exists(p) for p in pids)
        usage = sampler.window_ended()
    assert usage.n_workers == 2
    assert usage.cpu_percent_workers is not None and usage.cpu_percent_workers > 30
    assert usage.worker_pss_bytes is not None and usage.worker_pss_bytes > 0


def test_a_worker_gone_before_its_cpu_was_read_is_left_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker found in the tree may end before its CPU time is read (the start snapshot
    then holds no figure for it): the window's end leaves it out rather than raising."""
    it = started(2)
    real = resources._cpu_seconds
    missed = max(w.pid for w in it._workers)  # type: ignore[attr-defined]

    def misses_one(procs: list[psutil.Process]) -> dict[int, float]:
        return {pid: s for pid, s in real(procs).items() if pid != missed}

    monkeypatch.setattr(resources, "_cpu_seconds", misses_one)
    with ResourceSampler(os.getpid()) as sampler:
        sampler.window_started()
        time.sleep(0.5)
        usage = sampler.window_ended()  # (raised KeyError)
    del it
    assert usage.n_workers == 1 and usage.cpu_percent_workers is not None


def test_polled_gpu_readings_count_from_a_whole_period_into_the_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where the device keeps no samples, the busy figure is polled; each poll covers the
    period before it, so those within a period of the window's start are left out."""
    monkeypatch.setattr(resources.nvml, "utilization_within", lambda *a: None)
    monkeypatch.setattr(resources.nvml, "utilization_now", lambda index: 70)
    monkeypatch.setattr(resources.nvml, "SAMPLE_PERIOD_MAX_US", 400_000)
    with ResourceSampler(os.getpid(), gpu_index=0) as sampler:
        sampler.window_started()
        time.sleep(0.3)
        assert sampler.window_ended().gpu_util_percent == []  # shorter than a period
        sampler.window_started()
        time.sleep(1.2)
        polled = sampler.window_ended().gpu_util_percent
    assert polled and set(polled) == {70}
    assert len(polled) <= (1.2 - 0.4) / ResourceSampler.INTERVAL_S + 1
