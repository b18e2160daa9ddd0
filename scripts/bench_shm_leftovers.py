"""What killing a busy DataLoader leaves in /dev/shm, with and without loadertune's clean-up.

Each round starts a process in a session of its own that iterates a DataLoader with workers
making large batches (the shape of a script trial), lets it run a moment, and ends its group:
``plain`` with one ``os.killpg(SIGKILL)`` (what a trial's end did before
:mod:`loadertune.trials.leftovers`), ``kill_group`` with
:func:`loadertune.trials.script.processes.kill_group`.
The two alternate, round by round. Counted: files ``/dev/shm/torch_<pid>_*`` named after any
process of the killed group that are still there a moment later, and their bytes. A ``plain``
round's files are removed by this script after counting.

    python scripts/bench_shm_leftovers.py [--rounds 15] [--mb 16] [--workers 2]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from loadertune.trials import leftovers  # noqa: E402
from loadertune.trials.script.processes import group_members, kill_group  # noqa: E402

CHILD = """
import sys, torch
from torch.utils.data import DataLoader, Dataset
class Big(Dataset):
    def __len__(self): return 10**6
    def __getitem__(self, i): return torch.zeros({floats})
loader = DataLoader(Big(), batch_size=16, num_workers={workers}, prefetch_factor=4)
print("ready", flush=True)
for _ in loader:
    pass
"""


def one_round(how: str, mb: float, workers: int, run_s: float) -> tuple[int, int]:
    """Files and bytes left in /dev/shm by the killed group's processes."""
    import subprocess

    floats = int(mb * 2**20 / 4 / 16)
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD.format(floats=floats, workers=workers)],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdout is not None
    proc.stdout.readline()
    time.sleep(run_s)
    pids = set(group_members(proc.pid))
    if how == "plain":
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and any(
            psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
            for p in pids - {proc.pid}
        ):
            time.sleep(0.05)
    else:
        kill_group(proc.pid)
        proc.wait()
    time.sleep(0.3)
    left = [f for pid in pids for f in leftovers.SHM_DIR.glob(f"torch_{pid}_*")]
    size = sum(f.stat().st_size for f in left if f.exists())
    if how == "plain":
        leftovers.remove_leftovers(pids)  # do not leave this benchmark's own mess behind
    return len(left), size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15, help="rounds per way")
    ap.add_argument("--mb", type=float, default=16.0, help="MB per batch")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    if not leftovers.SHM_DIR.is_dir():
        sys.exit(f"{leftovers.SHM_DIR} does not exist on this machine: nothing to measure")
    found: dict[str, list[tuple[int, int]]] = {"plain": [], "kill_group": []}
    for i in range(args.rounds):
        for how in ("plain", "kill_group") if i % 2 == 0 else ("kill_group", "plain"):
            run_s = 1.0 + (i % 7) * 0.037  # the kill lands at a different point of a batch
            found[how].append(one_round(how, args.mb, args.workers, run_s))
    print(f"{args.rounds} rounds per way, batches of {args.mb:g} MB, {args.workers} workers")
    for how, rows in found.items():
        files = [n for n, _ in rows]
        total = sum(b for _, b in rows)
        print(
            f"{how:>10}: rounds leaving files {sum(n > 0 for n in files)}/{len(rows)}, "
            f"files {sum(files)}, {total / 2**20:.0f} MB; per round median "
            f"{statistics.median(files):g}, most {max(files)}"
        )


if __name__ == "__main__":
    main()
