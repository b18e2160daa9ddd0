"""`loadertune run --tune` against the script's own settings: time to finish N epochs, side by side.

Per round, interleaved (own, tune; then tune, own; ...):

* own: ``python SCRIPT --epochs N ARGS``, the script's own settings, no loadertune;
* tune: ``loadertune run --tune --budget B --file FRESH SCRIPT -- --epochs N ARGS``, tuning from
  scratch on the run itself (a fresh recommendation file each round, so nothing saved helps).

Each run must finish all N epochs (the script prints ``epoch k/N``); the table gives the median
wall time of each and the ratio. Run it once with the script's own settings already the best
(tuning must not cost more than it gains) and once with poor ones (``-- --num-workers 6`` on a
machine where fewer are better, or the reverse)::

    python scripts/bench_tune.py --rounds 3 --epochs 6 --budget 30
    python scripts/bench_tune.py --rounds 3 --epochs 6 --budget 30 -- --num-workers 6
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def timed(command: list[str], epochs: int) -> tuple[float, str]:
    """Wall seconds of ``command``, and its output; it must finish every epoch."""
    t0 = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    out = proc.stdout + proc.stderr
    done = re.findall(rf"epoch (\d+)/{epochs}\b", out)
    if proc.returncode != 0 or len(done) != epochs:
        raise SystemExit(f"{' '.join(command)} failed ({len(done)} epochs):\n{out[-3000:]}")
    return wall, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--script", default=str(ROOT / "examples" / "train_images.py"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--budget", type=float, default=30.0)
    ap.add_argument("script_args", nargs="*", default=[])
    args = ap.parse_args()
    print(f"command: python {' '.join(sys.argv)}", flush=True)
    script = [args.script, "--epochs", str(args.epochs), *args.script_args]
    walls: dict[str, list[float]] = {"own": [], "tune": []}
    picks: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = ["own", "tune"] if r % 2 == 0 else ["tune", "own"]
            for name in order:
                if name == "own":
                    wall, _ = timed([sys.executable, *script], args.epochs)
                else:
                    rec = f"{tmp}/rec-{r}.json"
                    tune = ["run", "--tune", "--budget", str(args.budget), "--file", rec]
                    command = [sys.executable, "-m", "loadertune", *tune, script[0], "--"]
                    wall, out = timed(command + script[1:], args.epochs)
                    found = re.search(r"loadertune: tuned in .*", out)
                    picks.append(found.group(0) if found else "(the run ended before the tuning)")
                walls[name].append(wall)
                print(f"round {r + 1}: {name:4} {wall:6.1f} s", flush=True)
    own, tuned = statistics.median(walls["own"]), statistics.median(walls["tune"])
    n, rounds = args.epochs, args.rounds
    print(f"\nseconds to finish {n} epochs, medians of {rounds} interleaved rounds\n")
    print("| | median s | range s |\n|---|---:|---:|")
    for name, vals in walls.items():
        print(f"| {name} | {statistics.median(vals):.1f} | {min(vals):.1f}..{max(vals):.1f} |")
    print(f"\ntune / own: {tuned / own:.3f} (below 1: tuning during the run finished sooner)")
    for line in picks:
        print(line)


if __name__ == "__main__":
    main()
