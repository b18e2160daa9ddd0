"""Do a trial's figures match what a plain loop's epochs run at, on one of the benchmark's
workloads?

For each setting, in interleaved rounds: ``tune_loader``'s in-process trial measured as a
window (``--window`` seconds after the warm-up the search uses) and as a whole epoch, each
figure the rate per epoch the search ranks (start-up included), set against the truth:
``benchlib.plain_epoch_rate``, the last of two epochs of ``for batch in loader: step(batch)``
timed from ``iter()`` to its end. It prints each figure as a share of the truth, median and
range over the rounds, and the trials' wall time.

``bench_epoch_edges.py`` asks the same of the image example's short epochs; this asks it of any
named or drawn workload of ``bench_workloads.py`` (``drawn_SEED_INDEX``), e.g. one whose
workers' buffer fills and drains over seconds::

    python scripts/bench_window_truth.py --workload drawn_20261127_2 \\
        --settings 14:4,18:4,30:1,30:4,41:8 [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from loadertune.config import Config
from loadertune.trials import Limits, window_for
from loadertune.trials.inline import InlineRunner

import benchlib
from bench_workloads import workload_named

LIMITS = Limits(timeout_s=120, startup_s=60, hang_s=20)


def setting(text: str, batch_size: int) -> Config:
    """``W:PF[:BS]``: workers, prefetch factor (ignored without workers), batch size; persistent
    workers wherever there are workers (as the search's picks mostly are)."""
    parts = [int(p) for p in text.split(":")]
    workers, prefetch = parts[0], parts[1] if len(parts) > 1 else 2
    size = parts[2] if len(parts) > 2 else batch_size
    if not workers:
        return Config(size)
    return Config(size, workers, prefetch, persistent_workers=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", required=True)
    ap.add_argument("--settings", required=True, help="W:PF[:BS],... (persistent workers)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--window", type=float, default=1.5, help="a window trial's seconds (1.5)")
    args = ap.parse_args()
    try:
        workload = workload_named(args.workload)
    except KeyError as e:
        ap.error(e.args[0])
    dataset, fixed = workload.make_dataset(), dict(workload.loader_kwargs)
    configs = [setting(s, workload.batch_size) for s in args.settings.split(",")]
    print(f"{workload.name}: {workload.description}", flush=True)
    runner = InlineRunner(dataset, step=workload.step, fixed=fixed)
    kinds = ("window", "whole epoch", "truth")
    figures: dict[tuple[Config, str], list[float]] = {(c, k): [] for c in configs for k in kinds}
    walls: dict[tuple[Config, str], list[float]] = {(c, k): [] for c in configs for k in kinds}
    epoch_s = {c: 10.0 for c in configs}  # a whole-epoch trial's expected length, then measured
    for r in range(args.rounds):
        for config in configs if r % 2 == 0 else configs[::-1]:
            for kind in kinds if r % 2 == 0 else kinds[::-1]:
                t0 = time.perf_counter()
                if kind == "truth":
                    value: float | None = benchlib.plain_epoch_rate(
                        dataset, workload.step, fixed, config
                    )
                    if value and runner.epoch_samples:
                        epoch_s[config] = runner.epoch_samples / value
                else:
                    window = window_for(
                        config,
                        window_s=epoch_s[config] if kind == "whole epoch" else args.window,
                        whole_epoch=kind == "whole epoch",
                    )
                    result = runner.run(config, window=window, limits=LIMITS)
                    value = result.epoch_samples_per_s
                walls[(config, kind)].append(time.perf_counter() - t0)
                figures[(config, kind)].append(value or 0.0)
                print(f"  {config.label()}, {kind}: {value or 0:,.0f} samples/s", flush=True)
    runner.close()
    print("\nshare of the truth (plain-loop epochs): median (range), and each trial's wall time\n")
    print("| setting | window trial | whole-epoch trial | truth, samples/s |\n|---|---:|---:|---:|")
    for config in configs:
        truth = statistics.median(figures[(config, "truth")])
        cells = []
        for kind in kinds[:2]:
            shares = [v / truth for v in figures[(config, kind)]] if truth else [0.0]
            cells.append(
                f"{statistics.median(shares):.2f} ({min(shares):.2f}..{max(shares):.2f}), "
                f"{statistics.median(walls[(config, kind)]):.1f} s"
            )
        print(f"| {config.label()} | {' | '.join(cells)} | {truth:,.0f} |")


if __name__ == "__main__":
    main()
