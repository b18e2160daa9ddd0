"""Many back-to-back trials: the driver's memory and open files must not grow.

Runs trials in a loop (in-process trials over a real multi-worker loader, a share of them
failing with a killed worker, plus script trials in fresh process groups) and prints, every
--every trials, the driver process's USS, open file descriptors, threads and live children.
The last line compares the end with the first checkpoint (taken after a warm-up, since the
first trials load libraries and fill caches).

    python scripts/soak.py [--trials 300] [--script-trials 40]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import psutil
import torch
from torch.utils.data import Dataset, get_worker_info

from loadertune.config import Config
from loadertune.trials import Limits, window_for
from loadertune.trials.inline import InlineRunner
from loadertune.trials.script.runner import ScriptRunner

ROOT = Path(__file__).resolve().parent.parent


class Flaky(Dataset):
    """Cheap samples; a worker SIGKILLs itself when there are 3 or more workers."""

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int) -> torch.Tensor:
        info = get_worker_info()
        if info is not None and info.num_workers >= 3 and i > 200:
            os.kill(os.getpid(), signal.SIGKILL)
        return torch.full((16,), float(i))


def torch_probe_files() -> int:
    """Open files left by torch's own open-files probe in ``_try_get_data``: after a failed
    get it opens ten ``NamedTemporaryFile``s; a worker's SIGCHLD raising in between leaks one
    (an empty ``/tmp/tmpXXXXXXXX``, still open). Counted apart: loadertune does not open them."""
    prefix = os.path.join(tempfile.gettempdir(), "tmp")
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            n += os.readlink(f"/proc/self/fd/{fd}").startswith(prefix)
    return n


def snapshot() -> dict[str, float]:
    me = psutil.Process()
    probe = torch_probe_files()
    return {
        "uss_mib": me.memory_full_info().uss / 2**20,
        "fds": me.num_fds() - probe,
        "probe": probe,
        "threads": me.num_threads(),
        "children": len(me.children(recursive=True)),
    }


def show(label: str, snap: dict[str, float]) -> None:
    print(
        f"{label:>22} {snap['uss_mib']:>9.1f} {snap['fds']:>6.0f} {snap['probe']:>12.0f} "
        f"{snap['threads']:>8.0f} {snap['children']:>9.0f}",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--script-trials", type=int, default=40)
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=20)
    args = ap.parse_args()
    limits = Limits(timeout_s=60, startup_s=30, hang_s=5)
    configs = [
        Config(32),
        Config(32, 1, 2),
        Config(32, 2, 4, persistent_workers=True),
        Config(32, 4, 2),
    ]  # the last one fails: a worker is killed
    runner = InlineRunner(Flaky())
    print(
        f"{'after trial':>22} {'USS MiB':>9} {'fds':>6} {'torch probe':>12} {'threads':>8} "
        f"{'children':>9}"
    )
    first = None
    failed = 0
    t0 = time.monotonic()
    for i in range(1, args.trials + 1):
        config = configs[i % len(configs)]
        result = runner.run(config, window=window_for(config, window_s=0.05), limits=limits)
        failed += result.failure is not None
        if i == args.warmup:
            first = snapshot()
            show(f"{i} (reference)", first)
        elif i % args.every == 0:
            show(str(i), snapshot())
    script = ScriptRunner(ROOT / "tests" / "scripts" / "style_alias.py", loader=1)
    for i in range(1, args.script_trials + 1):
        config = configs[i % 3]
        result = script.run(config, window=window_for(config, window_s=0.05), limits=limits)
        failed += result.failure is not None
    script.close()
    last = snapshot()
    show(f"+{args.script_trials} script trials", last)
    assert first is not None
    grew = {k: last[k] - first[k] for k in first}
    print(
        f"\n{args.trials} in-process + {args.script_trials} script trials in "
        f"{time.monotonic() - t0:.0f} s, {failed} failed as designed; from trial "
        f"{args.warmup} to the end: USS {grew['uss_mib']:+.1f} MiB, fds {grew['fds']:+.0f} "
        f"(plus {grew['probe']:+.0f} left open by torch's own open-files probe), "
        f"threads {grew['threads']:+.0f}, children now {last['children']:.0f}"
    )
    sys.exit(0 if last["children"] == 0 and last["fds"] <= first["fds"] + 2 else 1)


if __name__ == "__main__":
    main()
