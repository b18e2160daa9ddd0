"""What a plain loop's epoch looks like inside, batch by batch, for a few settings of a workload.

For each setting (persistent workers), ``--epochs`` epochs of ``for batch in loader:
step(batch)``, nothing of loadertune's in the loop. Per epoch it prints:

- the epoch's rate (samples/s, from ``iter()`` to its end: ``benchlib.plain_epoch_rate``'s
  truth);
- the rate of a window like a trial's: the 50 batches after the workers' first round;
- the rate of the middle: from the first round to the last ``num_workers x prefetch_factor``
  batches (those in flight when the sampler runs out, which the loop then drains);
- the rate of the drained tail;
- ``held``: batches the workers had finished but the loop could not have yet, on average over
  the middle: torch hands batches over in order, so a finished batch waits behind an earlier one
  still being made (counted, after each ``next()``, from torch's private ``_data_queue`` and
  ``_task_info``: a benchmark's look inside, nothing the product relies on).

With ``--out-of-order``, each setting runs again with ``in_order=False`` (torch's
``DataLoader`` argument: finished batches are handed over as they come, so the order of batches
changes), side by side. With ``--file-system``, each setting runs again with its workers
started under ``torch.multiprocessing``'s ``file_system`` sharing strategy (a batch's shared
memory is opened by name; under the default ``file_descriptor``, the loop receives each tensor's
file descriptor from the worker that made it, through that worker's resource-sharer thread),
side by side.

    python scripts/bench_epoch_profile.py --workload drawn_20261128_0 \\
        --settings 16:4,15:1,12:8,10:4 [--epochs 3] [--out-of-order] [--file-system]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch.multiprocessing as tmp
from bench_window_truth import setting
from torch.utils.data import DataLoader

from bench_workloads import workload_named

WINDOW_BATCHES = 50


def held(iterator: Any) -> int:
    """Batches finished by the workers and not yet handed to the loop."""
    try:
        queued = iterator._data_queue.qsize()
    except (AttributeError, NotImplementedError):
        queued = 0
    return queued + sum(1 for info in iterator._task_info.values() if len(info) == 2)


def profile(loader: DataLoader, step: Any, batch_size: int, in_flight: int, workers: int) -> str:
    t0 = time.perf_counter()
    arrivals: list[float] = []
    levels: list[int] = []
    iterator = iter(loader)
    for batch in iterator:
        arrivals.append(time.perf_counter())
        levels.append(held(iterator))
        if step is not None:
            step(batch)
    end = time.perf_counter()
    n = len(arrivals)
    first, tail = workers + 1, max(workers + 2, n - in_flight - 1)

    def rate(a: int, b: int) -> float:
        b = min(b, n - 1)
        return (b - a) * batch_size / (arrivals[b] - arrivals[a]) if b > a else 0.0

    middle_held = statistics.mean(levels[first:tail]) if tail > first else 0.0
    return (
        f"epoch {n * batch_size / (end - t0):7,.0f}"
        f"  window {rate(first, first + WINDOW_BATCHES):7,.0f}"
        f"  middle {rate(first, tail):7,.0f}  tail {rate(tail, n - 1):7,.0f}"
        f"  held {middle_held:5.1f} of {in_flight}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", required=True)
    ap.add_argument("--settings", required=True, help="W:PF[:BS],... (persistent workers)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--out-of-order", action="store_true", help="also with in_order=False")
    ap.add_argument(
        "--file-system", action="store_true", help="also under the file_system sharing strategy"
    )
    args = ap.parse_args()
    try:
        workload = workload_named(args.workload)
    except KeyError as e:
        ap.error(e.args[0])
    dataset, fixed = workload.make_dataset(), dict(workload.loader_kwargs)
    print(f"{workload.name}: {workload.description}", flush=True)
    orders = (True, False) if args.out_of_order else (True,)
    strategies = ("file_descriptor", "file_system") if args.file_system else ("file_descriptor",)
    variants = list(itertools.product(orders, strategies))
    for text in args.settings.split(","):
        config = setting(text, workload.batch_size)
        if not config.num_workers:
            ap.error(f"{text}: a profile needs workers")
        in_flight = config.num_workers * (config.prefetch_factor or 2)
        loaders = {
            (order, strategy): DataLoader(
                dataset, **{**fixed, **config.loader_kwargs()}, in_order=order
            )
            for order, strategy in variants
        }
        for epoch in range(args.epochs):
            for (order, strategy), loader in loaders.items():  # interleaved, epoch by epoch
                # Persistent workers keep the strategy they were forked under (the first epoch's).
                tmp.set_sharing_strategy(strategy)
                figures = profile(
                    loader, workload.step, config.batch_size, in_flight, config.num_workers
                )
                label = (
                    config.label()
                    + ("" if order else " out of order")
                    + ("" if strategy == "file_descriptor" else " file_system")
                )
                print(f"{label}, epoch {epoch}: {figures}", flush=True)
        tmp.set_sharing_strategy("file_descriptor")
        del loaders


if __name__ == "__main__":
    main()
