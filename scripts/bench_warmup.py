"""How long must a trial's warm-up be: every batch in flight, one round of the workers, or a
single batch?

A trial's workers start afresh, so its buffer starts empty. This measures the same real
multi-worker DataLoader (a dataset that burns ``--sample-ms`` of CPU per sample, ``--workers``
workers, ``prefetch_factor`` 8) with the meter's window after each warm-up, interleaved, per step
time:

* ``drain``: ``workers x prefetch_factor + 1`` batches;
* ``round``: ``workers + 1`` batches (:func:`loadertune.trials.contract.window_for` for a
  process's first setting);
* ``one``: 1 batch (for a setting that takes over a loop already running);
* ``steady``: 120 batches, far past any start-up: the reference.

The step times sit around the loader's pace (2 workers / (16 samples x 2 ms) = one batch per 16 ms):
40 ms (the step sets the pace), 18 ms (about even), 8 ms (the loader sets it). ``--busy`` makes
the step burn CPU instead of sleeping, so the workers and the step share the CPUs, as a training
step does::

    python scripts/bench_warmup.py --rounds 5 --workers 2 --busy
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.utils.data import DataLoader, Dataset

from loadertune.measure.counting import structure_counter
from loadertune.measure.meter import Meter, WindowSpec


class Burn(Dataset[torch.Tensor]):
    """Every sample burns ``ms`` of CPU."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, i: int) -> torch.Tensor:
        burn(self.ms)
        return torch.zeros(8)


def burn(ms: float) -> None:
    end = time.thread_time() + ms / 1000
    while time.thread_time() < end:
        pass


def trial(
    *,
    step_ms: float,
    warmup: int,
    workers: int,
    prefetch: int,
    sample_ms: float,
    window_s: float,
    busy: bool,
) -> float:
    loader = DataLoader(
        Burn(sample_ms), batch_size=16, num_workers=workers, prefetch_factor=prefetch
    )
    spec = WindowSpec(
        warmup_batches=warmup,
        window_s=window_s,
        settled_after=max(2, workers),
        round_batches=workers,
        min_window_batches=max(4, workers),
    )
    meter = Meter(spec, count=structure_counter)
    for _ in meter.wrap(loader):  # the window ends the loop
        if busy:
            burn(step_ms)
        else:
            time.sleep(step_ms / 1000)
    return meter.result().samples_per_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--sample-ms", type=float, default=2.0)
    ap.add_argument("--window", type=float, default=0.75)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--busy", action="store_true", help="the step burns CPU (else it sleeps)")
    args = ap.parse_args()
    workers, prefetch = args.workers, 8
    warmups = {"drain": workers * prefetch + 1, "round": workers + 1, "one": 1, "steady": 120}
    print(f"samples/s, median [min-max] of {args.rounds} rounds, interleaved")
    for step_ms in (40.0, 18.0, 8.0):
        rates: dict[str, list[float]] = {k: [] for k in warmups}
        for _ in range(args.rounds):
            for name, warmup in warmups.items():
                rates[name].append(
                    trial(
                        step_ms=step_ms,
                        warmup=warmup,
                        workers=workers,
                        prefetch=prefetch,
                        sample_ms=args.sample_ms,
                        window_s=args.window,
                        busy=args.busy,
                    )
                )
        ref = statistics.median(rates["steady"])
        cells = [
            f"{k} {statistics.median(v):.0f} [{min(v):.0f}-{max(v):.0f}] "
            f"({statistics.median(v) / ref:.3f})"
            for k, v in rates.items()
        ]
        print(f"step {step_ms:4.0f} ms: " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
