"""Does measuring a trial change what it measures? A trial's rate against a bare loop's.

The same loader and step (``--workload``'s, default ``io_latency_5ms``: 5 ms of waiting per
sample, dozens of workers to fill 2 CPUs) run, interleaved, per worker count:

* ``bare``: a plain ``for batch in loader: step(batch)``, timed by the clock over the same
  warm-up (a round of the workers and one more batch) and window length as a trial;
* ``trial``: :class:`~loadertune.trials.inline.InlineRunner`, as the search runs it: the meter,
  the supervisor and its resource sampler, with the memory budget the search sets
  (:attr:`SearchSettings.memory_budget_fraction` of the RAM budget, above this process's PSS).

The ratio trial / bare, median over rounds, is the cost of being measured: it should be 1 at
every worker count. ::

    python scripts/bench_meter_cost.py [--workers 8,36,108] [--rounds 3] [--window 2.0]

To compare another commit's meter, run the same command with ``PYTHONPATH`` set to its tree.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

from torch.utils.data import DataLoader

from loadertune import hardware
from loadertune.config import Config
from loadertune.measure.counting import structure_counter
from loadertune.measure.resources import tree_pss
from loadertune.search import SearchSettings
from loadertune.trials import Limits, window_for
from loadertune.trials.inline import InlineRunner

from bench_workloads import WORKLOAD_BY_NAME


def bare(dataset: Any, step: Any, config: Config, window_s: float) -> float:
    loader = DataLoader(dataset, **config.loader_kwargs())
    it = iter(loader)
    for _ in range(config.num_workers + 1):  # the trial's warm-up: a round and one more
        step(next(it))
    samples, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < window_s:
        batch = next(it)
        step(batch)
        samples += structure_counter(batch, 0)  # as the meter counts
    rate = samples / (time.perf_counter() - t0)
    del it
    return rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="io_latency_5ms")
    ap.add_argument("--workers", default="8,36,108")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--window", type=float, default=2.0)
    args = ap.parse_args()
    wl = WORKLOAD_BY_NAME[args.workload]
    dataset = wl.make_dataset()
    budget = tree_pss(os.getpid()) + int(
        SearchSettings().memory_budget_fraction * hardware.detect().ram_budget_bytes
    )
    limits = Limits(timeout_s=120, startup_s=60, hang_s=20, memory_budget_bytes=budget)
    runner = InlineRunner(dataset, step=wl.step, fixed=dict(wl.loader_kwargs))
    print(f"{args.workload}: samples/s, {args.rounds} interleaved rounds, {args.window} s windows")
    ratios: dict[int, list[float]] = {}
    for r in range(args.rounds):
        for w in (int(x) for x in args.workers.split(",")):
            config = Config(wl.batch_size, w, 4 if w else None, persistent_workers=w > 0)
            window = window_for(config, window_s=args.window)
            pair: dict[str, float] = {}
            for kind in ("bare", "trial") if r % 2 == 0 else ("trial", "bare"):
                if kind == "bare":
                    pair[kind] = bare(dataset, wl.step, config, args.window)
                else:
                    result = runner.run(config, window=window, limits=limits)
                    pair[kind] = result.samples_per_s or 0.0
            ratios.setdefault(w, []).append(pair["trial"] / pair["bare"])
            print(
                f"round {r}: w={w:3d} bare {pair['bare']:7,.0f}  trial {pair['trial']:7,.0f}"
                f"  ratio {ratios[w][-1]:.2f}",
                flush=True,
            )
    runner.close()
    for w, vals in ratios.items():
        print(
            f"w={w:3d}: trial / bare median {statistics.median(vals):.2f} "
            f"[{min(vals):.2f}-{max(vals):.2f}]"
        )


if __name__ == "__main__":
    main()
