"""What a killed DataLoader worker leaves in shared memory, removed once it is dead.

A worker hands each batch over in shared memory: torch creates a file ``/dev/shm/torch_<pid>_…``
named after the worker's pid, sizes and maps it, and (under the default ``file_descriptor``
sharing strategy) unlinks it at once, passing the open descriptor on. A worker SIGKILLed between
the create and the unlink leaves the file behind, a whole batch in size, for good: no process
knows its name any more. Trials kill busy workers as a matter of course (a script's launch ends
with its process group SIGKILLed; a hung or over-budget in-process trial has its workers
killed), and did leave such files: ``python scripts/bench_shm_leftovers.py`` killed a loader of
16-MB batches 15 times with one ``killpg`` and found 9 files, 144 MB, after 8 of the kills; 15
times with :func:`~loadertune.trials.processes.kill_group`, which removes them, none. On a
container's 64-MB ``/dev/shm`` a few searches would fill it, and every DataLoader with workers
would then fail.

Only files named after processes a trial started and killed are removed, and only once those
processes are dead (a zombie is dead): a live process's files, or anyone else's, are never
touched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from pathlib import Path

import psutil

SHM_DIR = Path("/dev/shm")


def _dead(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False


def remove_leftovers(pids: Iterable[int], folder: Path = SHM_DIR) -> int:
    """Remove torch's shared-memory files named after those of ``pids`` that are dead; return
    the bytes freed."""
    freed = 0
    for pid in sorted(set(pids)):
        if pid <= 0 or not _dead(pid):
            continue
        for path in folder.glob(f"torch_{pid}_*"):
            with contextlib.suppress(OSError):
                size = path.stat().st_size
                path.unlink()
                freed += size
    return freed
