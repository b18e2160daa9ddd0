"""Settings measured per minute by `loadertune search` on a script: this tree against other commits.

Issue 10's figure: ``loadertune search SCRIPT --budget B [--batch-sizes ...] -- ARGS`` run by
each version in turn (interleaved rounds, the order alternating: the machine's drift falls on
both), each with a fresh study in a temporary storage and its own recommendation file; the count
is that file's trials (every setting measured, failed ones too, a confirmation round's again),
per minute of the search's own ``elapsed_s``; each run's line also says how many distinct
settings those trials measured. An older commit runs from ``git archive`` of it, with this
environment's packages (``PYTHONPATH``).

    python scripts/bench_settings_rate.py [--against a20c851] [--rounds 2] [--budget 60]
        [--batch-sizes 16,32,64,128] [-- SCRIPT_ARGS (--epochs 5)]

Prints one line per run (trials, seconds, per minute, the pick and its rate) and, per version,
the median per minute with its range and the ratio of medians to the first commit named.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HERE = "this tree"


def checkout(commit: str, into: Path) -> Path:
    """``commit``'s files under ``into`` (no ``.git``: only its code runs there)."""
    tar = into / f"{commit}.tar"
    with tar.open("wb") as out:
        subprocess.run(["git", "-C", str(ROOT), "archive", commit], stdout=out, check=True)
    tree = into / commit
    with tarfile.open(tar) as archive:
        archive.extractall(tree, filter="data")
    return tree


def search_once(
    tree: Path, args: argparse.Namespace, script_args: list[str], tmp: Path, tag: str
) -> dict[str, Any]:
    """One search by the code under ``tree``: what its recommendation file says."""
    out, db = tmp / f"{tag}.json", tmp / f"{tag}.db"
    cmd = [sys.executable, "-m", "loadertune", "search", args.script, "--budget", str(args.budget)]
    cmd += ["--fresh", "--storage", f"sqlite:///{db}", "--out", str(out)]
    if args.batch_sizes:
        cmd += ["--batch-sizes", args.batch_sizes]
    cmd += ["--", *script_args]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp)
    if proc.returncode != 0 or not out.exists():
        tail = (proc.stdout + proc.stderr)[-2000:]
        raise SystemExit(f"{tag}: the search failed (exit {proc.returncode}):\n{tail}")
    data = json.loads(out.read_text())
    (entry,) = [w for m in data["machines"].values() for w in m["workloads"].values()]
    trials = [t for t in entry["trials"] if not t.get("kept")]
    elapsed = float(entry["search"]["elapsed_s"])
    distinct = {json.dumps(t.get("params"), sort_keys=True) for t in trials}
    return {
        "trials": len(trials),
        "distinct": len(distinct),
        "elapsed_s": elapsed,
        "per_minute": 60.0 * len(trials) / elapsed,
        "pick": entry["loader_kwargs"],
        "pick_samples_per_s": entry.get("samples_per_s"),
        "stop_reason": entry["search"].get("stop_reason"),
    }


def label(kwargs: dict[str, Any]) -> str:
    short = {"batch_size": "bs", "num_workers": "w", "prefetch_factor": "pf"}
    parts = [f"{short[k]}={v}" for k, v in kwargs.items() if k in short]
    parts += [k.split("_")[0] for k in ("pin_memory", "persistent_workers") if kwargs.get(k)]
    return " ".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--script", default=str(ROOT / "examples" / "train_images.py"))
    ap.add_argument("--against", default="a20c851", help="commits to compare, comma-separated")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--budget", type=float, default=60.0)
    ap.add_argument("--batch-sizes", default="16,32,64,128")
    ap.add_argument("--out", default="bench-results/bench_settings_rate.json")
    ap.add_argument("script_args", nargs="*", default=["--epochs", "5"])
    args = ap.parse_args()
    args.script = str(Path(args.script).resolve())

    runs: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        trees = {c: checkout(c, tmp) for c in args.against.split(",") if c}
        trees[HERE] = ROOT
        names = list(trees)
        for r in range(args.rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                got = search_once(trees[name], args, args.script_args, tmp, f"r{r}-{len(runs)}")
                runs.setdefault(name, []).append(got)
                print(
                    f"round {r + 1}  {name:>10}: {got['trials']:3d} trials "
                    f"({got['distinct']} settings) in "
                    f"{got['elapsed_s']:5.1f} s = {got['per_minute']:5.1f} per minute; pick "
                    f"{label(got['pick'])} at {got['pick_samples_per_s'] or 0:,.0f} samples/s "
                    f"(stopped: {got['stop_reason']})",
                    flush=True,
                )
    first = statistics.median(r["per_minute"] for r in runs[names[0]])
    print(f"\nsettings per minute, {args.rounds} interleaved rounds:")
    for name in names:
        rates = [r["per_minute"] for r in runs[name]]
        med = statistics.median(rates)
        print(
            f"  {name:>10}: median {med:5.1f}  range {min(rates):.1f}..{max(rates):.1f}  "
            f"{med / first:.2f}x of {names[0]}"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
