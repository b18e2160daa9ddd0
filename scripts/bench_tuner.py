"""Is the tuner's pick as fast as an exhaustive grid, and faster than defaults and folklore?

For each workload in ``bench_workloads.py`` (each with a different optimum):

1. **tuner**: ``tune_loader(dataset, batch_size=<the workload's>, step=..., budget_s=60)``; its
   wall time is recorded.
2. **grid**: every setting of the same space (the one the tuner searched), measured once; the
   ground truth.
3. **side by side**: the grid's three best, the tuner's pick, PyTorch's defaults
   (``num_workers=0``) and the folklore setting (``num_workers=4, pin_memory=True``) re-measured
   in ``--rounds`` interleaved rounds (each round in a rotated order). The table reports medians
   and, for the tuner, its median as a percentage of the grid's best median.

Rates are samples/s over an epoch, start-up included (what the tuner maximises); with these
datasets' epochs, that is within a few percent of the steady rate. The machine is shared and
noisy: only ratios within one run are compared.

    python scripts/bench_tuner.py                      # all workloads, about 25 minutes
    python scripts/bench_tuner.py --workloads tiny_tensors,io_latency --budget 60
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from loadertune import hardware, tune_loader
from loadertune.config import Config
from loadertune.trials import Limits, window_for
from loadertune.trials.inline import InlineRunner

import benchlib
from bench_workloads import WORKLOADS

LIMITS = Limits(timeout_s=120, startup_s=60, hang_s=20)


def bench(workload: Any, args: argparse.Namespace) -> dict[str, Any]:
    dataset = workload.make_dataset()
    fixed = dict(workload.loader_kwargs)
    print(f"\n## {workload.name}: {workload.description}", flush=True)

    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        rec = tune_loader(
            dataset,
            batch_size=workload.batch_size,
            step=workload.step,
            budget_s=args.budget,
            storage=f"sqlite:///{tmp}/bench.db",
            resume=False,
            verbose=False,
            seed=args.seed,
            **fixed,
        )
    tuner_s = time.monotonic() - t0
    pick = Config.from_kwargs(rec.loader_kwargs)
    print(
        f"tuner: {pick.label()} in {tuner_s:.0f} s, {len(rec.trials)} trials "
        f"(stopped: {rec.search['stop_reason']})",
        flush=True,
    )

    runner = InlineRunner(dataset, step=workload.step, fixed=fixed)

    def measure_with(window_s: float):  # type: ignore[no-untyped-def]
        def measure(config: Config) -> float | None:
            window = window_for(config, window_s=window_s)
            return runner.run(config, window=window, limits=LIMITS).epoch_samples_per_s

        return measure

    t0 = time.monotonic()
    grid = benchlib.grid(measure_with(args.grid_window), benchlib.space_from(rec.search).configs())
    grid_s = time.monotonic() - t0
    best = max(grid, key=lambda c: grid[c])
    print(
        f"grid: {len(grid)} settings in {grid_s:.0f} s; best {best.label()} "
        f"{grid[best]:,.0f} samples/s",
        flush=True,
    )
    named = {
        "tuner": pick,
        "defaults": Config(workload.batch_size),
        "folklore": Config(workload.batch_size, 4, 2, pin_memory=True),
    }
    rows = benchlib.compare(measure_with(args.window), grid, named, args.rounds)
    runner.close()
    return {
        "workload": workload.name,
        "description": workload.description,
        **rows,
        "tuner_wall_s": tuner_s,
        "tuner_trials": len(rec.trials),
        "tuner_stop": rec.search["stop_reason"],
        "grid_settings": len(grid),
        "grid_s": grid_s,
        "bottleneck": rec.diagnosis.get("bottleneck"),
        "limiting_stage": rec.diagnosis.get("ceilings", {}).get("limiting_stage"),
        "ceiling_samples_per_s": rec.diagnosis.get("ceiling_samples_per_s"),
        "tuner_samples_per_s": rec.samples_per_s,
        "percent_of_ceiling": rec.diagnosis.get("percent_of_ceiling"),
    }


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| workload | grid best (ground truth) | tuner's pick | tuner % of grid "
        "| tuner time, trials | PyTorch defaults | folklore w=4 pin |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for r in results:
        g, t, d, f = r["grid_best"], r["tuner"], r["defaults"], r["folklore"]
        lines.append(
            f"| {r['workload']} | {g['setting']}: {g['median']:,.0f} | {t['setting']}: "
            f"{t['median']:,.0f} | **{t['percent_of_grid']:.1f}%** | {r['tuner_wall_s']:.0f} s, "
            f"{r['tuner_trials']} | {d['median']:,.0f} ({d['percent_of_grid']:.0f}%) | "
            f"{f['median']:,.0f} ({f['percent_of_grid']:.0f}%) |"
        )
    return "\n".join(lines)


def ceiling_table(results: list[dict[str, Any]]) -> str:
    """The diagnosis of each pick: its bottleneck, the estimated achievable rate and how close
    the pick gets (the tuner's own confirmed rate, and the side-by-side median of this run)."""
    lines = [
        "| workload | bottleneck | limiting stage | estimated ceiling | tuner's confirmed rate "
        "| % of ceiling | side-by-side median, % of ceiling |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for r in results:
        ceiling = r.get("ceiling_samples_per_s")
        if not ceiling:
            continue
        side = r["tuner"]["median"]
        lines.append(
            f"| {r['workload']} | {r['bottleneck']} | {r['limiting_stage']} | {ceiling:,.0f} "
            f"| {r['tuner_samples_per_s']:,.0f} | {r['percent_of_ceiling']:.0f}% "
            f"| {side:,.0f}, {100 * side / ceiling:.0f}% |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", default=",".join(w.name for w in WORKLOADS))
    ap.add_argument("--budget", type=float, default=60.0, help="the tuner's budget_s")
    ap.add_argument("--grid-window", type=float, default=1.0, help="seconds per grid setting")
    ap.add_argument("--window", type=float, default=1.5, help="seconds per side-by-side round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--out", default="bench-results/bench_tuner.json")
    args = ap.parse_args()
    wanted = args.workloads.split(",")
    unknown = set(wanted) - {w.name for w in WORKLOADS}
    if unknown:
        ap.error(f"unknown workloads {sorted(unknown)}; known: {[w.name for w in WORKLOADS]}")
    hw = hardware.detect()
    print(f"machine: {hw.describe()}\ncommand: python {' '.join(sys.argv)}", flush=True)
    results = [bench(w, args) for w in WORKLOADS if w.name in wanted]
    print("\nsamples/s per epoch, medians of", args.rounds, "interleaved rounds\n")
    print(table(results))
    print("\nthe diagnosis of each pick: how close it gets to the estimated ceiling\n")
    print(ceiling_table(results))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "machine": hw.describe(),
                "command": " ".join(sys.argv),
                "args": vars(args),
                "results": results,
            },
            indent=2,
        )
    )
    print(f"\nwritten to {out}")


if __name__ == "__main__":
    main()
