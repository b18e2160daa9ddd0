"""A fork server for a script's trial processes: Python and torch started once per search, a
fork of them per launch.

A fresh ``python -m loadertune.trials.inside.child`` spends its first seconds starting the
interpreter and importing torch (over a second on a small machine), before the script's own
line runs; a search starts a launch at every failure, every time the script runs out of epochs,
and for every setting of a loader that cannot change setting mid-epoch. The server is started
once (``python -m loadertune.trials.script.forkserver``, in a session of its own, dying with the
search: :func:`loadertune.trials.lifeline.die_with_parent`), imports what every trial process
imports, and then forks a trial process for each launch. The fork becomes what
:func:`loadertune.trials.script.processes.start_child` would have started: its own process group,
its output in the launch's log, no standard input, the search's environment with the trial's spec,
its channel the descriptor the search passed over the server's socket. What differs from a fresh
process, and why it does not matter:

- modules already imported (torch, loadertune's own): the fresh process imports the same ones
  before the script's first line;
- ``random`` and numpy's global generator would be the server's state in every fork: both are
  seeded again from the OS, as a fresh interpreter's are (both reseed themselves after a fork
  today; this does it too, for numpy versions that do not). torch's default generator is never
  drawn from in the server: it holds the fixed seed every fresh process starts with;
- its memory shares the server's pages: the trial's PSS counts half of them, not all (the
  server's objects are frozen, ``gc.freeze``, before each fork, so that the fork's collections
  leave their pages shared rather than copying them mid-trial);
- the server is single-threaded in Python and has initialised neither CUDA nor torch's OpenMP
  pool (a fork after either breaks the child); numpy's OpenBLAS pool, which ``import torch``
  starts, is re-created by OpenBLAS's own fork handler, as in every forked DataLoader worker.

The server is this process's child; its forks are not, so the server reaps them and reports each
exit status over the socket (:class:`Forked` stands in for a :class:`subprocess.Popen`).
When the server cannot be started, or dies, launches fall back to fresh processes.

The protocol, on a ``SOCK_SEQPACKET`` socket pair (one JSON message per packet): the search
sends ``{"env": ..., "log": ...}`` with the channel's descriptor attached (``SCM_RIGHTS``); the
server answers ``{"pid": N}``, and later ``{"exit": N, "code": C}`` (``C`` as
:attr:`subprocess.Popen.returncode`: negative for a signal).
"""

from __future__ import annotations

import ast
import contextlib
import gc
import importlib
import importlib.util
import json
import os
import random
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import psutil

SERVER_ENV = "LOADERTUNE_FORKSERVER"
MAX_MESSAGE = 1 << 20  # one request: the environment and a log path
POLL_S = 0.05  # how often the server reaps its forks while no request comes


def start_module(
    python: str, module: str, env: dict[str, str], log: Path, fd: int
) -> subprocess.Popen[bytes]:
    """``python -m module`` in a session of its own (its process group, away from the
    terminal's Ctrl-C), no standard input, its output in ``log``, inheriting descriptor ``fd``."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [python, "-m", module],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            pass_fds=(fd,),
            start_new_session=True,
        )


class ForkServerError(OSError):
    """The server did not answer: launches start fresh processes instead."""


class ForkServer:
    """The search's end of the server (see the module docstring).

    Args:
        python: the interpreter (the one a fresh trial process would run).
        log: where the server's own output goes.
        preload: a script whose installed packages the server imports too (the ones it
            imports at its top level: :func:`installed_imports`), or None.
    """

    def __init__(self, python: str, log: Path, *, preload: str | None = None) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        spec = {"fd": theirs.fileno(), "parent_pid": os.getpid(), "preload": preload}
        self.preload = preload
        env = {**os.environ, SERVER_ENV: json.dumps(spec)}
        self.proc = start_module(
            python, "loadertune.trials.script.forkserver", env, log, theirs.fileno()
        )
        theirs.close()
        self._sock = ours
        self._exits: dict[int, int] = {}
        self.lost: set[int] = set()  # forks whose end the server, gone, could not report
        self.n_forks = 0

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None and self._sock.fileno() >= 0

    def fork(self, env: dict[str, str], log: Path, channel_fd: int, *, timeout_s: float) -> Forked:
        """A trial process, forked by the server: ``env`` its environment, ``log`` its output,
        ``channel_fd`` (this process's descriptor; the fork gets its own copy) its channel.
        Raises ForkServerError when the server does not answer within ``timeout_s`` (the first
        answer waits for the server's imports: give it what a fresh process would get to start)."""
        request = json.dumps({"env": env, "log": str(log)}).encode()
        try:
            socket.send_fds(self._sock, [request], [channel_fd])
        except OSError as exc:
            raise ForkServerError(f"the fork server took no request: {exc}") from exc
        deadline = time.monotonic() + timeout_s
        while True:
            msg = self._receive(max(0.0, deadline - time.monotonic()))
            if msg is None:
                raise ForkServerError("the fork server did not answer")
            if "pid" in msg:
                self.n_forks += 1
                return Forked(self, int(msg["pid"]))

    def returncode(self, pid: int) -> int | None:
        """The fork's exit status once the server has reaped it (None while it runs). A fork
        the server can no longer report was SIGKILLed with it (its parent-death signal)."""
        while pid not in self._exits and self._receive(0.0) is not None:
            pass
        if pid not in self._exits and not self.alive and not psutil.pid_exists(pid):
            self._exits[pid] = -signal.SIGKILL
            self.lost.add(pid)
        return self._exits.get(pid)

    def _receive(self, timeout_s: float) -> dict[str, Any] | None:
        """The next message (exit reports are kept), or None when none comes in time."""
        if self._sock.fileno() < 0:
            return None
        ready, _, _ = select.select([self._sock], [], [], timeout_s)
        if not ready:
            return None
        try:
            data = self._sock.recv(MAX_MESSAGE)
        except OSError:
            data = b""
        if not data:  # the server has gone
            self._sock.close()
            return None
        msg: dict[str, Any] = json.loads(data)
        if "exit" in msg:
            self._exits[int(msg["exit"])] = int(msg["code"])
        return msg

    def close(self) -> None:
        """End the server (its forks die with it: their parent-death signal)."""
        self._sock.close()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)


class Forked:
    """A fork of the server, as much of :class:`subprocess.Popen` as a launch uses."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._server = server

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.returncode(self.pid)
        return self.returncode

    @property
    def died_with_server(self) -> int | None:
        """The server's own exit status when this fork's end was not reported but inferred:
        the server ended first, and the fork died of its parent-death signal. None otherwise."""
        return self._server.proc.returncode if self.pid in self._server.lost else None

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode


# -- the server's side -----------------------------------------------------------------------------


def installed_imports(script: str | os.PathLike[str]) -> list[str]:
    """The top-level packages ``script`` imports in its module body (also under a top-level
    ``if`` or ``try``) that are installed packages: found in a ``site-packages`` or
    ``dist-packages`` folder. Not the standard library (quick to import), and never the user's
    own modules beside the script: importing those runs the user's code, which belongs to each
    trial process."""
    try:
        tree = ast.parse(Path(script).read_bytes())
    except (OSError, SyntaxError, ValueError):
        return []
    names: list[str] = []
    body = list(tree.body)
    while body:
        node = body.pop(0)
        if isinstance(node, ast.Import):
            names += [alias.name.partition(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module.partition(".")[0])
        elif isinstance(node, (ast.If, ast.Try)):
            body += [*node.body, *node.orelse]
            if isinstance(node, ast.Try):
                body += [*node.finalbody, *(s for h in node.handlers for s in h.body)]
    installed = []
    for name in dict.fromkeys(names):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        where = spec and (spec.origin or next(iter(spec.submodule_search_locations or []), ""))
        if where and any(part in ("site-packages", "dist-packages") for part in Path(where).parts):
            installed.append(name)
    return installed


def _unsafe_to_fork(cuda_mapped_before: bool) -> str | None:
    """Why this process may not fork trial processes, or None: a thread (its locks would stay
    held in every fork) or CUDA (a fork cannot use it) that an import started."""
    if threading.active_count() > 1:
        names = ", ".join(t.name for t in threading.enumerate() if t is not threading.main_thread())
        return f"an import started a thread ({names})"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "an import initialised CUDA"
    if _cuda_mapped() and not cuda_mapped_before:
        return "an import loaded the CUDA driver"
    return None


def _cuda_mapped() -> bool:
    try:
        with open("/proc/self/maps", "rb") as fh:
            return b"libcuda.so" in fh.read()
    except OSError:
        return False


def _preload(script: str) -> None:
    """Import the script's installed packages (:func:`installed_imports`); one that fails is
    left to the trial process, which reports it as the script's own error."""
    for name in installed_imports(script):
        try:
            importlib.import_module(name)
        except BaseException as exc:  # SystemExit too: a package's, not ours
            print(f"loadertune fork server: not preloaded: {name}: {exc!r}", flush=True)


def _become_trial(server: socket.socket, request: dict[str, Any], channel_fd: int) -> None:
    """In the fork: set up as a fresh trial process would be, then run it. Never returns."""
    from loadertune.trials.inside import child

    try:
        server.close()
        os.setpgid(0, 0)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        out = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(null)
        os.close(out)
        env: dict[str, str] = request["env"]
        spec = json.loads(env[child.SPEC_ENV])
        spec.update(fd=channel_fd, parent_pid=os.getppid())  # the server: it dies with the search
        env[child.SPEC_ENV] = json.dumps(spec)
        os.environ.clear()
        os.environ.update(env)
        random.seed()  # from the OS, as a fresh interpreter's
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            numpy.random.seed()
        child.main()  # ends the process
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
    finally:
        os._exit(1)


def _reap(server: socket.socket, forks: set[int]) -> None:
    """Report every fork that has ended."""
    while forks:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            forks.clear()
            return
        if pid == 0:
            return
        forks.discard(pid)
        with contextlib.suppress(OSError):
            code = os.waitstatus_to_exitcode(status)
            server.send(json.dumps({"exit": pid, "code": code}).encode())


def serve() -> None:
    """The server: import what every trial process imports, then fork one per request until
    the search closes its end (or dies: then so does this process, and with it every fork)."""
    from loadertune.trials import lifeline

    spec = json.loads(os.environ.pop(SERVER_ENV))
    lifeline.die_with_parent(spec["parent_pid"])
    server = socket.socket(fileno=spec["fd"])
    import loadertune.trials.inside.child  # noqa: F401  (torch, the patch, the controller)

    if spec.get("preload"):
        cuda_before = _cuda_mapped()
        _preload(spec["preload"])
        why = _unsafe_to_fork(cuda_before)
        if why is not None:  # the search starts one without the preload
            print(f"loadertune fork server: cannot fork after the preload: {why}", flush=True)
            return
    forks: set[int] = set()
    while True:
        ready, _, _ = select.select([server], [], [], POLL_S)
        _reap(server, forks)
        if not ready:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(server, MAX_MESSAGE, 1)
        except OSError:
            break
        if not data:  # the search closed its end
            break
        sys.stdout.flush()
        sys.stderr.flush()
        # What the server holds stays shared: a collection in the fork would otherwise write
        # to every object's GC header, copying the imports' pages in the middle of a trial.
        gc.freeze()
        pid = os.fork()
        if pid == 0:
            _become_trial(server, json.loads(data), fds[0])
        with contextlib.suppress(OSError):  # the fork does it too: either may come first
            os.setpgid(pid, pid)
        for fd in fds:
            os.close(fd)
        forks.add(pid)
        try:
            server.send(json.dumps({"pid": pid}).encode())
        except OSError:
            break
    for pid in forks:  # the search has gone: so do the trials
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)


if __name__ == "__main__":
    serve()
