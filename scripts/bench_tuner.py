"""Is the tuner's pick as fast as the best of a grid, and faster than defaults and folklore?

For each workload in ``bench_workloads.py`` (each with a different optimum):

1. **tuner**: ``tune_loader(dataset, batch_size=<the batch sizes the workload offers>,
   baseline={"batch_size": <the user's>}, step=..., budget_s=60)``; its wall time is recorded.
2. **grid**: the space the tuner searched (with every batch size offered, should the search
   have left one out), each setting measured once by a window trial: the candidates. Up to
   ``--grid-max`` settings (100) the grid is exhaustive. A wider space (loading that waits on
   I/O gets dozens to hundreds of workers; four batch sizes multiply it) is measured coarse to
   fine
   (``benchlib.coarse_to_fine``): a ladder of worker counts, every prefetch factor and
   persistence on it where they fit, then the settings around the coarse grid's best. The
   ``grid:`` line and the JSON say which settings were measured.
3. **side by side**: the grid's three best, the tuner's pick, PyTorch's defaults
   (``num_workers=0``) and the folklore setting (``num_workers=4, pin_memory=True``) re-measured
   in ``--rounds`` interleaved rounds (each round in a rotated order). The table reports medians
   and, for the tuner, its median as a percentage of the grid's best median.

The side by side is the judge: by default (``--truth epoch``) it times whole epochs of a plain
loop (``benchlib.plain_epoch_rate``: the second of two epochs of ``for batch in loader:
step(batch)``, from ``iter()`` to its end), measured by nothing of loadertune's, wherever an
epoch at the grid's best takes ``--epoch-max`` seconds (30) or less; longer ones, and
``--truth window``, by ``--window`` trials. The grid, by 1-s window trials, only finds the
candidates. A window is no truth where the workers' buffer fills and drains over seconds: on
``drawn_20261127_2`` (27-MB batches, 252 an epoch) window trials read 0.52 to 1.85 of the plain
loop's epochs (``scripts/bench_window_truth.py``), and an earlier run of this benchmark, judged
by windows, had put its pick at 85% of a grid best that plain-loop epochs do not bear out. The
machine is shared and noisy: only ratios within one run are compared.

How long: per workload, the tuner's 60 s; a grid of 25 settings (CPU-bound loading, one batch
size) to about 105 (I/O waits, or four batch sizes), each 2-4 s, or 5-10 s with dozens of
workers (their start-up, and a warm-up that drains ``num_workers x prefetch_factor`` batches);
and 5 rounds of up to 6 settings, about 2 minutes by windows, two epochs of each setting a
round by whole epochs (on ``drawn_20261127_2``, 3 rounds took about 18 minutes, most of them
PyTorch's defaults' epochs of 75 s; before the judge timed epochs, the full run of all ten
workloads took 39 minutes on the 2-CPU machine, more when a probe on a busy machine takes
loading for I/O-bound and widens the worker range, of which ``io_latency_5ms`` took about 8
(its grid alone 320 s)).
``--quick`` is a smoke test (a 15 s budget, 8 grid settings plus a few around the best, one
round of 0.5 s): about a minute a workload, 10 minutes for all ten; its figures mean nothing.

``--drawn N`` runs N workloads drawn at random instead (``bench_workloads.draw_workload``: a
wait, CPU work and a size per sample, a CPU step or none, one batch size or five offered), from
``--draw-seed`` or the clock: fresh workloads, which no rule of the search was written against.

    python scripts/bench_tuner.py                      # all workloads, about 40 minutes
    python scripts/bench_tuner.py --drawn 6 --draw-seed 20261127       # six drawn ones
    python scripts/bench_tuner.py --workloads drawn_20261127_2         # one of them again
    python scripts/bench_tuner.py --workloads tiny_tensors,io_latency --budget 60
    python scripts/bench_tuner.py --quick --workloads python_dicts     # does it run?
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from torch.utils.data import DataLoader

from loadertune import hardware, tune_loader
from loadertune.config import Config
from loadertune.search import SearchSettings
from loadertune.search.space import SearchSpace
from loadertune.trials import Limits, window_for
from loadertune.trials.inline import InlineRunner
from loadertune.trials.loader import bytes_per_sample

import benchlib
from bench_workloads import WORKLOADS, workload_named

LIMITS = Limits(timeout_s=120, startup_s=60, hang_s=20)
FULL = {"budget": 60.0, "grid_window": 1.0, "grid_max": 100, "window": 1.5, "rounds": 5}
QUICK = {"budget": 15.0, "grid_window": 0.3, "grid_max": 8, "window": 0.5, "rounds": 1}


def within_shm(space: SearchSpace, dataset: Any, fixed: dict[str, Any]) -> SearchSpace:
    """``space`` with the tuner's bound on the bytes of batches in flight (a share of free
    ``/dev/shm``) and a sample's bytes, which ``rec.search`` leaves out: the grid keeps to the
    space the tuner searched."""
    shm_free = hardware.detect().shm_free_bytes
    if not shm_free:
        return space
    first = next(iter(DataLoader(dataset, batch_size=2, **fixed)))
    return dataclasses.replace(
        space,
        max_in_flight_bytes=SearchSettings().shm_fraction * shm_free,
        bytes_per_sample=bytes_per_sample(first),
    )


def bench(workload: Any, args: argparse.Namespace) -> dict[str, Any]:
    dataset = workload.make_dataset()
    fixed = dict(workload.loader_kwargs)
    print(f"\n## {workload.name}: {workload.description}", flush=True)

    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        rec = tune_loader(
            dataset,
            batch_size=list(workload.batch_sizes),
            baseline={"batch_size": workload.batch_size},
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

    def measure_with(window_s: float) -> benchlib.Measure:
        def measure(config: Config) -> float | None:
            window = window_for(config, window_s=window_s)
            return runner.run(config, window=window, limits=LIMITS).epoch_samples_per_s

        return measure

    space = within_shm(benchlib.space_from(rec.search), dataset, fixed)
    missing = sorted(set(workload.batch_sizes) - set(space.batch_sizes))
    if missing:  # the grid spans every batch size offered, searched or not
        print(f"note: the search's space left out batch sizes {missing}; the grid has them")
        space = dataclasses.replace(
            space, batch_sizes=tuple(sorted({*space.batch_sizes, *missing}))
        )
    t0 = time.monotonic()
    result = benchlib.coarse_to_fine(
        measure_with(args.grid_window),
        space.configs(),
        max_settings=args.grid_max,
        max_refine=max(1, args.grid_max // 8),
    )
    grid = result.values
    grid_s = time.monotonic() - t0
    best = max(grid, key=lambda c: grid[c])
    print(
        f"grid: {result.describe()} in {grid_s:.0f} s; best {best.label()} "
        f"{grid[best]:,.0f} samples/s",
        flush=True,
    )
    named = {
        "tuner": pick,
        "defaults": Config(workload.batch_size),
        "folklore": Config(workload.batch_size, 4, 2, pin_memory=True),
    }
    judge, truth = measure_with(args.window), f"{args.window:g} s windows"
    epoch_s = runner.epoch_samples / grid[best] if runner.epoch_samples and grid[best] else None
    if args.truth == "epoch" and epoch_s is not None and epoch_s <= args.epoch_max:
        judge = functools.partial(benchlib.plain_epoch_rate, dataset, workload.step, fixed)
        truth = f"whole epochs of a plain loop (about {epoch_s:.1f} s each)"
    print(f"side by side: {truth}", flush=True)
    rows = benchlib.compare(judge, grid, named, args.rounds)
    runner.close()
    return {
        "workload": workload.name,
        "description": workload.description,
        **rows,
        "tuner_wall_s": tuner_s,
        "tuner_trials": len(rec.trials),
        "tuner_stop": rec.search["stop_reason"],
        "batch_sizes": list(workload.batch_sizes),
        "grid_settings": len(grid),
        "grid": {c.label(): v for c, v in sorted(grid.items(), key=lambda kv: -kv[1])},
        "grid_space_settings": result.space_settings,
        "grid_thinned": result.thinned,
        "grid_refined": [c.label() for c in result.refined],
        "grid_s": grid_s,
        "truth": truth,
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
    ap.add_argument("--budget", type=float, help="the tuner's budget_s (60)")
    ap.add_argument("--grid-window", type=float, help="seconds per grid setting (1.0)")
    ap.add_argument(
        "--grid-max",
        type=int,
        help="the largest space measured in full; a larger one coarse to fine (100)",
    )
    ap.add_argument("--window", type=float, help="seconds per side-by-side round (1.5)")
    ap.add_argument("--rounds", type=int, help="side-by-side rounds (5)")
    ap.add_argument(
        "--truth",
        choices=["epoch", "window"],
        default="epoch",
        help="what the side by side times: whole epochs of a plain loop (the default, where an "
        "epoch at the grid's best takes --epoch-max seconds at most) or --window trials",
    )
    ap.add_argument("--epoch-max", type=float, default=30.0, help="(seconds; 30)")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="a smoke test, about a minute a workload: "
        + ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in QUICK.items())
        + " (flags given win); its figures mean nothing",
    )
    ap.add_argument(
        "--drawn",
        type=int,
        default=0,
        help="N workloads drawn at random (bench_workloads.draw_workload) instead of the named",
    )
    ap.add_argument("--draw-seed", type=int, default=None, help="their seed (fresh: the clock)")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--out", default=None, help="(bench-results/bench_tuner[-quick].json)")
    args = ap.parse_args()
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.out is None:
        args.out = f"bench-results/bench_tuner{'-quick' if args.quick else ''}.json"
    for key in ("budget", "grid_window", "window", "grid_max", "rounds"):
        if getattr(args, key) <= 0:
            ap.error(f"--{key.replace('_', '-')} must be positive, but got {getattr(args, key)}")
    if args.drawn and args.draw_seed is None:
        args.draw_seed = time.time_ns() % 2**31
    wanted = (
        [f"drawn_{args.draw_seed}_{i}" for i in range(args.drawn)]
        if args.drawn
        else args.workloads.split(",")
    )
    try:
        workloads = [workload_named(name) for name in wanted]
    except KeyError as e:
        ap.error(e.args[0])
    hw = hardware.detect()
    print(f"machine: {hw.describe()}\ncommand: python {' '.join(sys.argv)}", flush=True)
    if args.drawn:
        print(f"drawn workloads, seed {args.draw_seed}", flush=True)
    results = [bench(w, args) for w in workloads]
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
