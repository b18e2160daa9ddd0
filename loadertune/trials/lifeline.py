"""Every process of a trial dies with its parent, however the parent dies (SIGKILL included).

A script's trial process asks the kernel for SIGKILL when the search dies (``PR_SET_PDEATHSIG``,
:func:`die_with_parent`). Its DataLoader workers would not die with it: when the trial process is
SIGKILLed they are re-parented to init, and torch's own check of the parent (every 5 s, between
samples) never runs in a worker stuck in ``__getitem__``. So every loader a trial creates gets a
``worker_init_fn`` wrapper, :class:`DieWithTrial`, that does the same in each worker before it
calls the user's own ``worker_init_fn``. ``loadertune run``
(:mod:`loadertune.trials.inside.apply_saved`) wraps every loader of the script it runs the same
way: there the run's own process is the one the workers die with.

Why not a subreaper: ``PR_SET_CHILD_SUBREAPER`` in the trial process adopts orphans only while the
trial process lives, and it is the trial process that dies here. Why not have the search kill the
group: a SIGKILLed search runs no code.

The kernel's "parent" is the *thread* that started the worker, not its process: a worker started
by a short-lived thread (a prefetcher that iterates a ``persistent_workers`` loader in a new thread
each epoch) would be killed when that thread ends, in the middle of training. And a worker that
multiprocessing's fork server started is the server's child, which does not end with the trial
process: every such worker holds the server's liveness pipe open. So the signal is asked for only
when the trial's main thread (which lives as long as the process) started the worker; any other
worker watches the trial process from a thread of its own (a pidfd: no wake-ups until it ends).
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import threading
from collections.abc import Callable
from typing import Any

from loadertune.trials import leftovers

PR_SET_PDEATHSIG = 1
WATCH_INTERVAL_S = 0.2

# In a forked worker: whether the thread that forked it was its parent's main thread. Set just
# before every fork by a hook that :class:`DieWithTrial` registers in the trial process.
_forked_from_main: bool | None = None
_hook_registered = False


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _before_fork() -> None:
    global _forked_from_main
    _forked_from_main = _on_main_thread()


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Ask Linux to send ``sig`` to this process when the thread that started it ends."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        return int(libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0
    except (OSError, AttributeError):  # not Linux
        return False


def die_with_parent(parent_pid: int) -> None:
    """Be SIGKILLed when ``parent_pid`` (this process's parent) dies; end now if it already has."""
    if set_parent_death_signal() and os.getppid() != parent_pid:
        os._exit(1)  # the parent died before prctl took effect


def _parent_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return int(fh.read().rpartition(b")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _descends_from(ancestor: int) -> bool:
    pid = os.getppid()
    for _ in range(64):
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
        pid = _parent_of(pid)
    return False


def _watch(trial_pid: int) -> None:
    """From a daemon thread: SIGKILL this process once ``trial_pid`` has ended."""

    def watch() -> None:
        try:
            fd: int | None = os.pidfd_open(trial_pid)  # Linux 5.3
        except (AttributeError, OSError):
            fd = None
        if fd is not None:
            if _descends_from(trial_pid):  # so the pidfd is the trial's, not a reused pid's
                select.select([fd], [], [])  # readable once the process has ended
        else:
            while _descends_from(trial_pid):
                threading.Event().wait(WATCH_INTERVAL_S)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="loadertune-lifeline", daemon=True).start()


class DieWithTrial:
    """A DataLoader ``worker_init_fn`` that makes the worker die with the trial process, then
    calls the user's own ``worker_init_fn`` (kept as it is; picklable when it is).

    Created in the trial process, which it remembers (``trial_pid``).
    """

    def __init__(self, user_fn: Callable[[int], Any] | None = None) -> None:
        global _hook_registered
        self.user_fn = user_fn
        self.trial_pid = os.getpid()
        self.from_main_thread: bool | None = None  # set when pickled for a spawned worker
        if not _hook_registered:
            os.register_at_fork(before=_before_fork)
            _hook_registered = True

    def __getstate__(self) -> dict[str, Any]:
        # Pickled (spawn, forkserver) by the thread that starts the worker.
        return {**self.__dict__, "from_main_thread": _on_main_thread()}

    def __call__(self, worker_id: int) -> None:
        self.guard()
        leftovers.own_temp_dir()  # found and removed by its pid, should it be killed
        if self.user_fn is not None:
            self.user_fn(worker_id)

    def guard(self) -> None:
        """In a worker: arrange to die with the trial process; end at once if it is gone."""
        if not _descends_from(self.trial_pid):
            os._exit(1)  # the trial process died before this worker got here
        parent = os.getppid()
        if parent == self.trial_pid:  # fork, spawn: the trial process started this worker
            from_main = (
                self.from_main_thread if self.from_main_thread is not None else _forked_from_main
            )
            if from_main and set_parent_death_signal():
                if os.getppid() != parent:
                    os._exit(1)  # the trial process died before prctl took effect
                return
        _watch(self.trial_pid)  # started by another thread, a fork server, or the script's process

    def __repr__(self) -> str:
        return f"DieWithTrial({self.user_fn!r})"


def users_worker_init(worker_init_fn: Any) -> Any:
    """The user's own ``worker_init_fn`` of a loader's (None: they gave none), not ours."""
    return worker_init_fn.user_fn if isinstance(worker_init_fn, DieWithTrial) else worker_init_fn


def wrap_worker_init(arguments: dict[str, Any]) -> dict[str, Any]:
    """DataLoader keyword ``arguments`` with :class:`DieWithTrial` around their
    ``worker_init_fn`` (once)."""
    user_fn = arguments.get("worker_init_fn")
    if isinstance(user_fn, DieWithTrial):
        return arguments
    return {**arguments, "worker_init_fn": DieWithTrial(user_fn)}
