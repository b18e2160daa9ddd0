"""Ctrl-C and SIGTERM held over a few steps that must not be cut: a write to the study, and the
start of a loader's workers.

A worker start is a ``fork()``, and Python runs the at-fork callbacks of the modules loaded
(``logging``'s, which takes its lock before the fork and frees it after) where an exception
cannot leave: a Ctrl-C that lands in one is printed as "Exception ignored" and lost. Lost in
logging's, it also leaves logging's lock held by the main thread, and the tuner's thread waits
for it for ever at its next Optuna call: ``run --tune`` neither stops nor tunes. Held, the
signal waits for the block's end, then the handler that was in place runs as it would have.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

_HELD = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait for the block's end (in the main thread; elsewhere, where no
    handler can be set, the block runs as it is). A process forked inside the block (a worker)
    gets the handlers that were in place at its first such signal."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    owner = os.getpid()
    caught: list[int] = []
    previous: dict[int, Any] = {}

    def hold(signum: int, frame: Any) -> None:
        if os.getpid() != owner:  # a worker forked in the block: nothing holds it
            _restore(previous)
            _act(previous[signum], signum, frame)
        else:
            caught.append(signum)

    for sig in _HELD:
        handler = signal.getsignal(sig)
        if handler is not None:  # None: set outside Python, left alone
            previous[sig] = signal.signal(sig, hold)
    try:
        yield
    finally:
        _restore(previous)
        if caught:
            _act(previous[caught[0]], caught[0], None)


def _restore(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def _act(handler: Any, signum: int, frame: Any) -> None:
    """What ``signum`` would have done, with ``handler`` (back) in place."""
    if callable(handler):
        handler(signum, frame)  # Ctrl-C's own: raises KeyboardInterrupt
    elif handler == signal.SIG_DFL:
        os.kill(os.getpid(), signum)  # its default action, now
