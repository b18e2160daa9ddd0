"""What a fresh launch of a script's trial costs, with the fork server and without it.

A search starts a launch (a trial process) at the first trial, after a failure, when the script
runs out of epochs, and for every setting of a loader that cannot change setting mid-epoch. This
times one trial of the script's own settings in a fresh launch, end to end (the process started
or forked, the script's set-up, its first batches, a 0.3 s window, the group killed), both ways
in interleaved rounds (the order alternating), after a first launch that starts the server:

    python scripts/bench_launch.py [--rounds 4] [--launches 2] SCRIPT [-- SCRIPT_ARGS]
    python scripts/bench_launch.py examples/train_images.py -- --epochs 5

Prints the median, the range and the ratio of medians. With ``--rates BS:W,...`` it checks
instead that a forked launch measures what a fresh one does: each setting (batch size, workers;
persistent workers, prefetch 2, when W > 0) is measured in a launch of its own, both ways, in
interleaved rounds, and the medians of samples/s are printed side by side.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from loadertune.config import Config  # noqa: E402
from loadertune.trials import Limits, window_for  # noqa: E402
from loadertune.trials.script.runner import ScriptRunner  # noqa: E402

LIMITS = Limits(timeout_s=120, startup_s=60, hang_s=10)


def relaunches(script: str, args: list[str], *, fork_server: bool, n: int) -> list[float]:
    """Seconds of ``n`` trials, each in a fresh launch, after a first one (not timed)."""
    runner = ScriptRunner(script, args, fork_server=fork_server)
    window = window_for(Config(1), window_s=0.3)
    times = []
    try:
        first = runner.run(None, window=window, limits=LIMITS)
        if not first.ok:
            raise SystemExit(f"the script's own settings failed: {first.failure}")
        for _ in range(n):
            runner._end_launch()
            t0 = time.monotonic()
            result = runner.run(None, window=window, limits=LIMITS)
            times.append(time.monotonic() - t0)
            if not result.ok:
                raise SystemExit(f"a relaunched trial failed: {result.failure}")
    finally:
        runner.close()
    return times


def rates(
    script: str, args: list[str], configs: list[Config], *, fork_server: bool
) -> dict[Config, float]:
    """Samples/s of each of ``configs``, each in a fresh launch (after the script's own)."""
    runner = ScriptRunner(script, args, fork_server=fork_server, loader=1)
    got = {}
    try:
        runner.run(None, window=window_for(Config(1), window_s=1.0), limits=LIMITS)
        for config in configs:
            runner._end_launch()
            result = runner.run(config, window=window_for(config, window_s=1.5), limits=LIMITS)
            if not result.ok or result.samples_per_s is None:
                raise SystemExit(f"{config.label()} failed: {result.failure}")
            got[config] = result.samples_per_s
    finally:
        runner.close()
    return got


def compare_rates(args: argparse.Namespace) -> None:
    configs = []
    for item in args.rates.split(","):
        bs, workers = (int(x) for x in item.split(":"))
        configs.append(Config(bs, workers, 2, False, True) if workers else Config(bs))
    got: dict[tuple[bool, Config], list[float]] = {}
    for r in range(args.rounds):
        for way in (True, False) if r % 2 == 0 else (False, True):
            for config, rate in rates(
                args.script, args.script_args, configs, fork_server=way
            ).items():
                got.setdefault((way, config), []).append(rate)
    for config in configs:
        fork, fresh = got[(True, config)], got[(False, config)]
        print(
            f"{config.label():<28} fresh {statistics.median(fresh):>9,.0f} "
            f"({min(fresh):,.0f}..{max(fresh):,.0f})  forked {statistics.median(fork):>9,.0f} "
            f"({min(fork):,.0f}..{max(fork):,.0f})  "
            f"forked / fresh {statistics.median(fork) / statistics.median(fresh):.3f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("script")
    ap.add_argument("script_args", nargs="*")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--launches", type=int, default=2, help="timed launches per round and way")
    ap.add_argument("--rates", help="BS:W,...: compare the rates measured, not the launch time")
    args = ap.parse_args()
    if args.rates:
        compare_rates(args)
        return
    got: dict[bool, list[float]] = {True: [], False: []}
    for r in range(args.rounds):
        for way in (True, False) if r % 2 == 0 else (False, True):
            got[way] += relaunches(args.script, args.script_args, fork_server=way, n=args.launches)
    med = {way: statistics.median(v) for way, v in got.items()}
    for way, label in ((False, "fresh interpreter"), (True, "fork server")):
        v = got[way]
        print(
            f"{label:>17}: a trial in a fresh launch takes median {med[way]:.2f} s "
            f"(range {min(v):.2f}..{max(v):.2f}, n={len(v)})"
        )
    print(f"fork server / fresh: {med[True] / med[False]:.2f}x the time")


if __name__ == "__main__":
    main()
