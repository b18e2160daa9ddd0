"""JSON messages, one per line, over a socket shared by the search and a script's trial process.

JSON rather than pickle: the trial process runs the user's code, and nothing it sends should be
able to run code in the search. The child never blocks on the parent: it sends, and polls for
the parent's rare replies (``{"t": "stop"}`` when a trial is pruned). What script trials send is
in :mod:`loadertune.trials.messages`.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any


class Channel:
    """One end of a connected stream socket."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._sending = threading.Lock()  # one message at a time: a loader iterated in a thread
        self._buf = b""
        self.closed = False

    @classmethod
    def pair(cls) -> tuple[Channel, socket.socket]:
        """This end, and the other end's socket (to pass to a child with ``pass_fds``)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        theirs.set_inheritable(True)
        return cls(ours), theirs

    @classmethod
    def from_fd(cls, fd: int) -> Channel:
        return cls(socket.socket(fileno=fd))

    @classmethod
    def connect(cls, path: str) -> Channel:
        """Connect to a :class:`Listener` at ``path`` (a rank of a distributed trial, which
        torch's launcher starts without inherited descriptors)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        return cls(sock)

    def send(self, msg: Mapping[str, Any]) -> bool:
        """Send ``msg``; False if the other end is gone."""
        data = (json.dumps(msg, default=str, allow_nan=True) + "\n").encode()
        try:
            with self._sending:  # (sendall may write a message in parts)
                self._sock.sendall(data)
            return True
        except OSError:
            self.closed = True
            return False

    def _fill(self, timeout: float | None) -> bool:
        """Read what is available (waiting up to ``timeout``); False on timeout."""
        ready, _, _ = select.select([self._sock], [], [], timeout)
        if not ready:
            return False
        try:
            chunk = self._sock.recv(65536)
        except OSError:
            chunk = b""
        if not chunk:
            self.closed = True
            return False
        self._buf += chunk
        return True

    def recv(self, timeout: float | None = None) -> dict[str, Any] | None:
        """The next message, or None if none came within ``timeout`` or the other end closed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if self.closed or not self._fill(left):
                return None
        line, _, self._buf = self._buf.partition(b"\n")
        msg = json.loads(line)
        return msg if isinstance(msg, dict) else None

    def drain(self) -> list[dict[str, Any]]:
        """Every message already available, without waiting."""
        out = []
        while (msg := self.recv(timeout=0)) is not None:
            out.append(msg)
        return out

    def fileno(self) -> int:
        return self._sock.fileno()

    def close(self) -> None:
        self.closed = True
        self._sock.close()


class Listener:
    """A Unix socket in ``folder`` that the ranks of a distributed trial connect to."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(path)
        self._sock.listen(64)

    def accept(self, timeout: float) -> Channel | None:
        """A new connection, or None if none came within ``timeout``."""
        ready, _, _ = select.select([self._sock], [], [], timeout)
        if not ready:
            return None
        conn, _ = self._sock.accept()
        return Channel(conn)

    def fileno(self) -> int:
        return self._sock.fileno()

    def close(self) -> None:
        self._sock.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
