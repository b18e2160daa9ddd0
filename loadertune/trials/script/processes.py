"""The processes of a script's trials: started in a session of their own, their output in a log,
killed as a group however a trial ends.

A *launch* is one trial process (``python -m loadertune.trials.inside.child`` or a fork of the
search's fork server, :mod:`loadertune.trials.script.forkserver`; or torch's launcher and its ranks:
:mod:`loadertune.trials.script.ranks`) that may run many trials in turn; a :class:`Trial` is one of
them, supervised from the search's side (:mod:`loadertune.trials.script.runner`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import psutil

from loadertune.errors import ConfigError
from loadertune.measure import failures
from loadertune.measure.resources import multiprocessing_helper
from loadertune.trials import leftovers, messages
from loadertune.trials.channel import Channel
from loadertune.trials.contract import TrialResult
from loadertune.trials.inside.child import SPEC_ENV
from loadertune.trials.script.forkserver import Forked, ForkServer, ForkServerError, start_module
from loadertune.trials.supervisor import Supervisor

OUTPUT_TAIL_BYTES = 8192


def check_script(script: str | os.PathLike[str]) -> Path:
    """The script's path, or a ConfigError saying why it cannot be run."""
    path = Path(script)
    if not path.exists():
        raise ConfigError(f"script {str(path)!r} does not exist.")
    if not path.is_file():
        raise ConfigError(f"{str(path)!r} is not a file; pass the training script itself.")
    try:
        source = path.read_bytes()
        compile(source, str(path), "exec")
    except SyntaxError as exc:
        raise ConfigError(f"{path} is not valid Python: {exc.msg} (line {exc.lineno}).") from exc
    except ValueError as exc:  # source with NUL bytes: a binary
        raise ConfigError(f"{path} is not a Python script ({exc}).") from exc
    return path


HELPER_CLEANUP_S = 2.0  # how long multiprocessing's resource tracker may take to clean up


def kill_group(pgid: int, grace_s: float = 3.0) -> int:
    """SIGKILL every process in group ``pgid``, and remove what its dead processes left in shared
    memory and ``/tmp`` (:mod:`loadertune.trials.leftovers`); return how many were still alive.

    multiprocessing's resource tracker (started by a ``spawn`` or ``forkserver`` context: the
    named semaphores of the loader's queues, ``/dev/shm/sem.mp-*``, are shared by name and
    unlinked only by it) is killed last: once every other process is dead it unlinks what they
    left and ends by itself. Killed with them, it leaves every killed trial's semaphores
    behind for good (``tests/test_leftovers.py`` checks none is left).

    The group's leader is one of them even when it is gone: a trial process that ended by
    itself (its script ran out of epochs) is reaped at once (by the fork server, or a ``poll``)
    and no longer listed in its group, and a folder named after it that its own exit did not
    empty (its workers' sockets are made there too) would be left in ``/tmp``."""
    members = set(group_members(pgid)) | {pgid}
    helpers = {pid for pid in members if _helper(pid)}
    if helpers:
        for pid in members - helpers:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + grace_s
        while set(group_members(pgid, living=True)) - helpers and time.monotonic() < deadline:
            time.sleep(0.05)
        deadline = time.monotonic() + HELPER_CLEANUP_S
        while set(group_members(pgid, living=True)) & helpers and time.monotonic() < deadline:
            time.sleep(0.05)  # it sees its users gone, cleans up and ends
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + grace_s
    survivors: list[int] = []
    while time.monotonic() < deadline:
        survivors = group_members(pgid, living=True)
        members.update(survivors)
        if not survivors:
            break
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        time.sleep(0.05)
    leftovers.remove_leftovers(members)
    return len(survivors)


def group_members(pgid: int, *, living: bool = False) -> list[int]:
    """The processes of group ``pgid`` (``living``: zombies left out)."""
    return [
        p.pid
        for p in psutil.process_iter(["status"])
        if _pgid(p.pid) == pgid and not (living and p.info["status"] == psutil.STATUS_ZOMBIE)
    ]


def _helper(pid: int) -> bool:
    try:
        return multiprocessing_helper(psutil.Process(pid))
    except psutil.Error:
        return False


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def tail(path: Path) -> str:
    """The end of a launch's log (its last ``OUTPUT_TAIL_BYTES``), as text."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - OUTPUT_TAIL_BYTES))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


class TrialProcess(Protocol):
    """What a launch uses of its process: a :class:`subprocess.Popen`, or a fork server's
    :class:`~loadertune.trials.script.forkserver.Forked`."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


@dataclass
class Launch:
    """One trial process: its process, its channel, its log, and what it said of its loader."""

    proc: TrialProcess
    chan: Channel
    log: Path
    loader: messages.LoaderMsg | None = None  # what it said of its loader
    n_trials: int = 0  # trials started in it
    batch_size: int | None = None  # what its loader ran with last (ResultMsg["ran"])
    epochs_begun: int | None = None  # of the tuned loader, at its last result

    @property
    def swaps(self) -> bool:
        """It runs further trials (it said its loader can change setting mid-epoch)."""
        return self.loader is not None and self.loader.get("one_setting_only") is None

    def training_pids(self) -> list[int]:
        """The process(es) that run the script's loop: where a trial's batches are made."""
        return [self.proc.pid]

    def close(self) -> int:
        """End it: kill the group; how many were still alive."""
        self.chan.close()
        left = kill_group(self.proc.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)
        return left


def start_child(
    python: str,
    spec: dict[str, Any],
    log: Path,
    server: ForkServer | None = None,
    *,
    startup_s: float = 120.0,
) -> Launch:
    """A fresh trial process (``python -m loadertune.trials.inside.child``) in a session of its own,
    its channel an inherited descriptor, given its spec; its output goes to ``log``. With a
    fork ``server``, a fork of it instead (:mod:`loadertune.trials.script.forkserver`); a server
    that does not answer within ``startup_s`` (the trial's own start-up limit) is closed, and the
    process is started afresh."""
    if server is not None and server.alive:
        chan, theirs = Channel.pair()
        try:
            env = _env(spec, theirs.fileno())
            forked = server.fork(env, log, theirs.fileno(), timeout_s=startup_s)
        except ForkServerError:
            server.close()  # a fork it may still make dies with it
            chan.close()
        else:
            return Launch(forked, chan, log)
        finally:
            theirs.close()
    chan, theirs = Channel.pair()
    env = _env(spec, theirs.fileno())
    proc = start_module(python, "loadertune.trials.inside.child", env, log, theirs.fileno())
    theirs.close()
    return Launch(proc, chan, log)


def _env(spec: dict[str, Any], channel_fd: int) -> dict[str, str]:
    """A trial process's environment: ours, and its spec with its channel's descriptor."""
    return {**os.environ, SPEC_ENV: json.dumps({**spec, "fd": channel_fd})}


@dataclass
class Trial:
    """One running trial: its launch, its supervisor, its result."""

    launch: Launch
    sup: Supervisor
    result: TrialResult
    reusable: bool = False  # ended well: its launch may run the next trial
    own: bool = False  # runs the script's own settings (config=None)

    @property
    def proc(self) -> TrialProcess:
        return self.launch.proc

    @property
    def chan(self) -> Channel:
        return self.launch.chan

    @property
    def log(self) -> Path:
        return self.launch.log


def exited(
    trial: Trial,
    late: Callable[[], Iterable[tuple[dict[str, Any], Channel]]],
    handle: Callable[[dict[str, Any], Channel], bool],
) -> bool:
    """Whether the launch's process has exited (asked of the process, not only told by an EOF:
    orphans hold the socket open). If it has, its ``late`` messages (each with its channel) go
    to ``handle`` until one ends the trial; else the exit itself is the trial's failure."""
    code = trial.proc.poll()
    if code is None:
        return False
    for msg, chan in late():
        if handle(msg, chan):
            return True
    server_code = trial.proc.died_with_server if isinstance(trial.proc, Forked) else None
    trial.result.failure = failures.classify_exit(
        code, output=tail(trial.log), server_code=server_code
    )
    return True
