"""What loadertune's measurement costs the loop it measures (the bar: under 1%).

Runs the same loop bare and under measurement, interleaved, many rounds:

    bare:     for batch in loader: step(batch)
    metered:  for batch in meter.wrap(loader): step(batch)   # with the Supervisor as its sink
              and the resource sampler thread running, as in a real trial

and prints the median time ratio (metered / bare) with its spread, per workload. Fast batches
are the worst case: the per-batch cost (two clock reads and a little bookkeeping) is fixed.

Each measurement lasts about ``--seconds`` (a trial's window is 0.5 to 3 s), so the fixed costs
of a window (snapshots of the process tree at its start) weigh as they do in a real trial. The
last line gives the hot path's own cost per batch, on an iterator that costs nothing.

    python scripts/bench_overhead.py [--rounds 15] [--seconds 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from torch.utils.data import DataLoader, Dataset

from loadertune.measure.meter import Meter, WindowSpec
from loadertune.trials import Limits
from loadertune.trials import loader as dl
from loadertune.trials.supervisor import Supervisor


class Rows(Dataset):
    def __init__(self, n: int = 3_000_000, dim: int = 32) -> None:  # epochs outlast the loops
        self.data = torch.randn(n, dim)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.data[i]


def step(batch: torch.Tensor) -> None:
    batch.sum()


def bare(loader: DataLoader, n: int) -> float:
    it = iter(loader)
    next(it)  # start-up is not what is compared
    t0 = time.perf_counter()
    for _ in range(n):
        step(next(it))
    return time.perf_counter() - t0


def metered(loader: DataLoader, n: int) -> float:
    with Supervisor(os.getpid(), limits=Limits(timeout_s=1e9, startup_s=1e9, hang_s=1e9)) as sup:
        # A window far longer than the run: every batch goes through the window's hot path.
        meter = Meter(
            WindowSpec(warmup_batches=0, window_s=1e9), sink=sup, count=dl.sample_counter(loader)
        )  # the counter a real trial uses
        it = iter(meter.wrap(loader))
        next(it)
        t0 = time.perf_counter()
        for _ in range(n):
            step(next(it))
        elapsed = time.perf_counter() - t0
        sup.window_ended()
    return elapsed


def hot_path_us(n: int = 300_000) -> float:
    """The meter's own cost per batch, in microseconds, on a free iterator."""

    def loop(it) -> float:  # type: ignore[no-untyped-def]
        next(it)
        t0 = time.perf_counter()
        for _ in range(n):
            next(it)
        return time.perf_counter() - t0

    costs = []
    for _ in range(5):
        bare_s = loop(iter(range(n + 1)))
        meter = Meter(WindowSpec(warmup_batches=0, window_s=1e9), count=dl.FixedCount(64))
        costs.append((loop(meter.wrap(range(n + 2))) - bare_s) / n * 1e6)
    return statistics.median(costs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--seconds", type=float, default=2.0, help="length of one measurement")
    args = ap.parse_args()
    data = Rows()
    workloads = {
        "in-memory rows, num_workers=0, batch 64": DataLoader(data, batch_size=64, shuffle=True),
        "in-memory rows, num_workers=2, batch 64": DataLoader(
            data, batch_size=64, shuffle=True, num_workers=2, persistent_workers=True
        ),
    }
    print(f"{'workload':<42} {'bare ms/batch':>14} {'ratio (median)':>15} {'ratio min..max':>16}")
    for name, loader in workloads.items():
        n = max(100, int(args.seconds / (bare(loader, 500) / 500)))
        ratios, per_batch = [], []
        for r in range(args.rounds):  # interleaved, alternating which goes first
            if r % 2:
                m, b = metered(loader, n), bare(loader, n)
            else:
                b, m = bare(loader, n), metered(loader, n)
            ratios.append(m / b)
            per_batch.append(1e3 * b / n)
        med_batch, med_ratio = statistics.median(per_batch), statistics.median(ratios)
        print(
            f"{name:<42} {med_batch:>14.3f} {med_ratio:>15.4f} "
            f"{min(ratios):>7.3f}..{max(ratios):<7.3f}"
        )
    print(f"the meter's hot path alone: {hot_path_us():.2f} us per batch")


if __name__ == "__main__":
    main()
