"""What loadertune's measurement costs the loop it measures (the bar: under 1%).

Runs the same loop bare and under measurement, interleaved, many rounds:

    bare:     for batch in loader: step(batch)
    metered:  for batch in meter.wrap(loader): step(batch)   # with the Supervisor as its sink
              and the resource sampler thread running, as in a real trial

and prints the median time ratio (metered / bare) with its spread, per workload. Fast batches
are the worst case: the per-batch cost (two clock reads and a little bookkeeping) is fixed.

    python scripts/bench_overhead.py [--rounds 15] [--batches 3000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from torch.utils.data import DataLoader, Dataset

from loadertune import dataloader as dl
from loadertune.meter import Meter, WindowSpec
from loadertune.trial import Limits, Supervisor


class Rows(Dataset):
    def __init__(self, n: int = 1_000_000, dim: int = 32) -> None:
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--batches", type=int, default=3000)
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
        ratios, per_batch = [], []
        for r in range(args.rounds):  # interleaved, alternating which goes first
            if r % 2:
                m, b = metered(loader, args.batches), bare(loader, args.batches)
            else:
                b, m = bare(loader, args.batches), metered(loader, args.batches)
            ratios.append(m / b)
            per_batch.append(1e3 * b / args.batches)
        print(
            f"{name:<42} {statistics.median(per_batch):>14.3f} {statistics.median(ratios):>15.4f} "
            f"{min(ratios):>7.3f}..{max(ratios):<7.3f}"
        )


if __name__ == "__main__":
    main()
