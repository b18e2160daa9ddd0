"""What a killed DataLoader worker leaves behind, removed once it is dead: shared memory, and
the folder multiprocessing made for it.

A worker hands each batch over in shared memory: torch creates a file ``/dev/shm/torch_<pid>_…``
named after the worker's pid, sizes and maps it, and (under the default ``file_descriptor``
sharing strategy) unlinks it at once, passing the open descriptor on. A worker SIGKILLed between
the create and the unlink leaves the file behind, a whole batch in size, for good: no process
knows its name any more. Trials kill busy workers as a matter of course (a script's launch ends
with its process group SIGKILLed; a hung or over-budget in-process trial has its workers
killed), so such files are left often (``python scripts/bench_shm_leftovers.py`` counts them
after a plain ``killpg`` and after :func:`~loadertune.trials.script.processes.kill_group`, which
removes them). On a container's 64-MB ``/dev/shm`` a few searches would fill it, and every
DataLoader with workers would then fail.

A worker also hands the descriptor over through a listening socket of its own (multiprocessing's
resource sharer), made on its first batch in a temporary folder, ``/tmp/pymp-…``, which the
worker removes when it ends normally. A killed worker leaves it, one folder per killed worker,
and ``/tmp`` fills with them. So a trial's process and each of its workers make that folder
inside one named after themselves (:func:`own_temp_dir`, ``/tmp/loadertune-mp-<pid>-…``), and it
goes with their shared memory.

Nobody is left to remove them when the search itself is SIGKILLed (an OOM killer, a CI job's
timeout): its trial processes and workers die with it (:mod:`loadertune.trials.lifeline`), and
their folders stay, with the search's own log folder. :func:`sweep` removes those the next
search or run finds, by the same rule: named after a process that is gone.

Only what is named after processes a trial started and killed is removed, and only once those
processes are dead (a zombie is dead): a live process's files, or anyone else's, are never
touched.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable
from multiprocessing import util
from pathlib import Path

import psutil

SHM_DIR = Path("/dev/shm")
TEMP_PREFIX = "loadertune-mp-"  # + the worker's pid, "-", a random suffix
LOG_PREFIX = "loadertune-logs-"  # a script search's trial logs: + the search's pid, "-", ...
# A socket's path is at most 107 bytes on Linux, 103 on macOS; multiprocessing's is its folder's,
# "/pymp-" and 8 characters, "/listener-" and 8. Where one level more would pass that (a long
# $TMPDIR), the workers made no socket and hung: then the folder is not nested.
SOCKET_PATH_MAX = 103
SOCKET_NAME_LEN = len("/pymp-12345678/listener-12345678")


def _dead(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False


def remove_leftovers(pids: Iterable[int], folder: Path = SHM_DIR, temp: Path | None = None) -> int:
    """Remove torch's shared-memory files (in ``folder``) and the temporary folders (in
    ``temp``, the default: the system's) named after those of ``pids`` that are dead; return
    the shared-memory bytes freed."""
    dead = {pid for pid in set(pids) if pid > 0 and _dead(pid)}
    if not dead:
        return 0
    freed = 0
    for pid in sorted(dead):
        for path in folder.glob(f"torch_{pid}_*"):
            with contextlib.suppress(OSError):
                size = path.stat().st_size
                path.unlink()
                freed += size
    _remove_folders(temp, lambda pid: pid in dead)
    return freed


def sweep(temp: Path | None = None) -> int:
    """Remove the folders in ``temp`` (the default: the system's) that this user's loadertune
    processes made and left when they were killed: those named after a process that is dead
    (gone, or a zombie; a pid reused since by another process keeps its folder, harmlessly);
    return how many. A search or run calls it once, as it starts."""
    return _remove_folders(temp, _dead)


def _remove_folders(temp: Path | None, remove: Callable[[int], bool]) -> int:
    """Remove this user's folders in ``temp`` named after a pid that ``remove`` accepts; return
    how many."""
    removed = 0
    uid = os.getuid()
    with contextlib.suppress(OSError), os.scandir(temp or tempfile.gettempdir()) as entries:
        for entry in entries:  # one pass: a busy /tmp holds many thousands of names
            pid = _pid_of(entry.name)
            with contextlib.suppress(OSError):
                if pid is None or not entry.is_dir(follow_symlinks=False):
                    continue
                if entry.stat(follow_symlinks=False).st_uid != uid or not remove(pid):
                    continue
                shutil.rmtree(entry.path, ignore_errors=True)
                removed += 1
    return removed


def _pid_of(name: str) -> int | None:
    prefix = next((p for p in (TEMP_PREFIX, LOG_PREFIX) if name.startswith(p)), None)
    if prefix is None:
        return None
    pid = name[len(prefix) :].partition("-")[0]
    return int(pid) if pid.isdigit() else None


def own_temp_dir() -> None:
    """In a script's trial process or a trial's worker, before its first batch:
    multiprocessing's temporary folder made inside one named after the process, so that
    :func:`remove_leftovers` finds it once the process is killed. A process that ends normally
    removes both (multiprocessing's finalizer, then this one's). A process whose parent made the
    folder already uses the parent's (it inherits the name; a script's workers, the trial
    process's), which goes with the parent: then nothing is made here."""
    mine = tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-")
    if len(mine) + SOCKET_NAME_LEN > SOCKET_PATH_MAX:  # the socket could not be made there
        os.rmdir(mine)
        return
    default, tempfile.tempdir = tempfile.tempdir, mine
    try:
        made = util.get_temp_dir()
    finally:
        tempfile.tempdir = default
    if os.path.dirname(made) != mine:
        os.rmdir(mine)
        return
    util.Finalize(
        None, shutil.rmtree, args=(mine,), kwargs={"ignore_errors": True}, exitpriority=-101
    )
