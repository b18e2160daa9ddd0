"""`loadertune search` on the image example, against an exhaustive grid of the same space.

1. ``loadertune search examples/train_images.py --budget 60 --json -- ARGS``: the tuner, through
   the CLI, every trial a fresh run of the unmodified script; its wall time is recorded.
2. The grid: every setting of the space that search explored (coarse to fine above
   ``--grid-max`` settings: ``benchlib.coarse_to_fine``), each a script trial (the script's own
   loop measured), once. A trial here measures a whole epoch, start to end (``--truth
   epoch``, the default): a window's rate is no truth for a short epoch
   (``scripts/bench_epoch_edges.py --images``). An epoch that takes over a minute ends as a
   window; ``--truth window`` measures windows of ``--window`` seconds, as before.
3. Side by side: the grid's three best, the tuner's pick, the script's own settings and the
   folklore setting (``num_workers=4, pin_memory=True``), in interleaved rounds; medians.

    python scripts/bench_script.py [--budget 60] [--rounds 5] [--batch-sizes 16,32,64,128]
        [-- SCRIPT ARGS]

``--compare BS:W[:PF][:persist],...`` skips the search and the grid: those settings alone, whole
epochs, side by side in ``--rounds`` interleaved rounds (medians and ranges).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from loadertune import hardware
from loadertune.config import Config
from loadertune.trials import Limits, window_for
from loadertune.trials.script.runner import ScriptRunner

import benchlib

ROOT = Path(__file__).resolve().parent.parent
LIMITS = Limits(timeout_s=120, startup_s=90, hang_s=20)


def epoch_rate(runner: ScriptRunner, config: Config) -> float | None:
    """``config``'s samples/s over a whole epoch of the script (a window for an epoch of over
    30 s)."""
    window = window_for(config, window_s=30.0, whole_epoch=True)
    return runner.run(config, window=window, limits=LIMITS).epoch_samples_per_s


def parse_setting(text: str) -> Config:
    """``BS:W[:PF][:persist]`` (prefetch 2 when left out)."""
    parts = text.split(":")
    persist = parts[-1] == "persist"
    numbers = [int(p) for p in (parts[:-1] if persist else parts)]
    bs, workers, pf = (*numbers, 2)[:3]
    return Config(bs, workers, pf if workers else None, False, persist and workers > 0)


def compare_only(args: argparse.Namespace) -> None:
    configs = [parse_setting(t) for t in args.compare.split(",")]
    runner = ScriptRunner(args.script, args.script_args, loader=1)
    try:
        measured = benchlib.side_by_side(lambda c: epoch_rate(runner, c), configs, args.rounds)
    finally:
        runner.close()
    print(f"\nsamples/s per epoch (whole epochs), {args.rounds} interleaved rounds\n")
    for config, values in measured.items():
        print(
            f"{config.label():<28} median {statistics.median(values):>8,.0f}  "
            f"({min(values):,.0f}..{max(values):,.0f})  {[round(v) for v in values]}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--script", default=str(ROOT / "examples" / "train_images.py"))
    ap.add_argument("--budget", type=float, default=60.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--window", type=float, default=1.5)
    ap.add_argument("--truth", choices=["epoch", "window"], default="epoch")
    ap.add_argument(
        "--batch-sizes", default=None, help="offered to the search, e.g. 16,32,64,128 (its own)"
    )
    ap.add_argument(
        "--grid-max",
        type=int,
        default=100,
        help="above this many settings the grid is measured coarse to fine (benchlib)",
    )
    ap.add_argument("--compare", help="BS:W[:PF][:persist],...: only these settings, side by side")
    ap.add_argument("--out", default="bench-results/bench_script.json")
    ap.add_argument("script_args", nargs="*", default=["--epochs", "5"])
    args = ap.parse_args()
    hw = hardware.detect()
    print(f"machine: {hw.describe()}\ncommand: python {' '.join(sys.argv)}", flush=True)
    if args.compare:
        compare_only(args)
        return

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.monotonic()
        command = [
            sys.executable,
            "-m",
            "loadertune",
            "search",
            args.script,
            "--json",
            "--fresh",
            "--budget",
            str(args.budget),
            "--out",
            f"{tmp}/rec.json",
            *(["--batch-sizes", args.batch_sizes] if args.batch_sizes else []),
            "--",
            *args.script_args,
        ]
        proc = subprocess.run(command, capture_output=True, text=True, check=True)
        wall = time.monotonic() - t0
    rec = json.loads(proc.stdout)
    pick = Config.from_kwargs(rec["loader_kwargs"])
    own = Config.from_kwargs(rec["baseline"]["loader_kwargs"])
    print(
        f"loadertune search: {pick.label()} in {wall:.0f} s (budget {args.budget:.0f} s), "
        f"{len(rec['trials'])} trials, stopped: {rec['search']['stop_reason']}",
        flush=True,
    )

    runner = ScriptRunner(args.script, args.script_args, loader=rec["workload"]["loader_index"])

    def measure(config: Config) -> float | None:
        if args.truth == "epoch":
            return epoch_rate(runner, config)
        window = window_for(config, window_s=args.window)
        return runner.run(config, window=window, limits=LIMITS).epoch_samples_per_s

    space = benchlib.space_from(rec["search"])
    t0 = time.monotonic()
    result = benchlib.coarse_to_fine(
        measure, space.configs(), max_settings=args.grid_max, max_refine=max(1, args.grid_max // 8)
    )
    grid = result.values
    print(f"grid: {result.describe()} in {time.monotonic() - t0:.0f} s", flush=True)
    folklore = Config(own.batch_size, 4, 2, pin_memory=True)
    rows = benchlib.compare(
        measure, grid, {"tuner": pick, "script's own": own, "folklore": folklore}, args.rounds
    )
    runner.close()
    what = "whole epochs" if args.truth == "epoch" else f"{args.window} s windows"
    print(f"\nsamples/s per epoch ({what}), medians of {args.rounds} interleaved rounds\n")
    print("| | setting | samples/s | range | % of grid best |\n|---|---|---:|---:|---:|")
    for name, r in rows.items():
        print(
            f"| {name} | {r['setting']} | {r['median']:,.0f} | {r['min']:,.0f}..{r['max']:,.0f} "
            f"| {r['percent_of_grid']:.1f}% |"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "machine": hw.describe(),
                "command": " ".join(sys.argv),
                "search_wall_s": wall,
                "truth": args.truth,
                "grid_settings": len(grid),
                "grid": result.describe(),
                "rows": rows,
                "grid_values": [
                    {"setting": c.label(), "loader_kwargs": c.loader_kwargs(), "samples_per_s": v}
                    for c, v in sorted(grid.items(), key=lambda cv: -cv[1])
                ],
                "search": rec["search"],
                "trials": rec["trials"],
            },
            indent=2,
            default=str,
        )
    )
    print(f"\nwritten to {out}")


if __name__ == "__main__":
    main()
