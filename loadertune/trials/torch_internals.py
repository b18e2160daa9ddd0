"""Every private name of torch and multiprocessing that loadertune relies on, in one place.

This is the riskiest code in the project and the first to break on a torch upgrade: each name
below is checked by ``tests/test_torch_internals.py`` (``missing()`` must be empty), and
``loadertune doctor``-style checks can call :func:`missing` at run time. Checked on torch 2.1 to
2.13 (CPU and CUDA builds) and CPython 3.10 to 3.12.

Each name, what it is used for, and what happens if it changes:

- ``torch.utils.data.dataloader._BaseDataLoaderIter``: recognise a loader's iterator (in a
  traceback, to shut it down). If gone: iterators held by a failure linger until GC.
- ``_MultiProcessingDataLoaderIter._shutdown_workers`` and ``._shutdown``: stop an iterator's
  workers now. If gone: workers stop only at GC.
- ``_MultiProcessingDataLoaderIter._index_queues`` and ``._worker_result_queue``: close the
  queues after a failed shutdown. If gone: a feeder thread may block interpreter exit.
- ``_MultiProcessingDataLoaderIter._workers``: dead workers' exit codes (the killing signal),
  and how many workers a trial's loader really started. If gone: a killed worker is reported
  without its signal (a vaguer cause), and a trial reports no workers started (it fails as
  "settings not applied": loudly, not wrongly).
- ``_MultiProcessingDataLoaderIter._try_get_data`` (a frame name): where torch waits for a
  batch, the one safe place to raise a dead worker's report. If renamed: reports are put off to
  the next safe place (slower failure detection).
- ``torch.utils.data._utils.signal_handling._set_SIGCHLD_handler``: install torch's SIGCHLD
  handler before wrapping it. If gone: deaths are found by torch's 5 s status check instead.
- ``DataLoader._iterator``: a persistent-workers loader's live iterator, to shut it down. If
  gone: persistent workers of a failed trial linger until GC.
- ``DataLoader._get_iterator``, ``._index_sampler`` and ``._auto_collation``: how a loader makes
  its iterator; a subclass overriding one is not hot-swapped
  (:mod:`loadertune.trials.hotswap.swap`). If gone: every loader is taken for such a subclass, and
  gets a fresh process per setting.
- ``_BaseDataLoaderIter._sampler_iter``: the batches an epoch's iterator has not asked its
  workers for yet, taken over by a :class:`~loadertune.trials.hotswap.swap.HotSwap` mid-epoch
  (:func:`take_rest`). If gone: the first setting's epoch runs to its end before the swap starts
  (slower, not wrong).
- ``_MultiProcessingDataLoaderIter._pin_memory_thread`` and ``._pin_memory_thread_done_event``
  (set only where batches are pinned, on a GPU): stop the pin-memory thread before the workers
  are killed (:func:`stop_pin_thread`). If gone: a batch half-received from a killed worker
  raises in that thread, which prints its traceback (nothing is lost).
- ``multiprocessing.Process._popen.returncode``: tell multiprocessing about workers we reaped.
  If gone: two fds and a Process object leak per killed worker.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import re
import signal
import sysconfig
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
import torch.utils.data._utils.signal_handling as _signal_handling
from torch.utils.data import DataLoader
from torch.utils.data.dataloader import _BaseDataLoaderIter, _MultiProcessingDataLoaderIter

from loadertune.measure.failures import raised_in_worker

# (owner, attribute): each must exist in the installed torch (see missing()).
REQUIRED: tuple[tuple[object, str], ...] = (
    (_MultiProcessingDataLoaderIter, "_try_get_data"),
    (_MultiProcessingDataLoaderIter, "_shutdown_workers"),
    (_signal_handling, "_set_SIGCHLD_handler"),
)
# How a DataLoader makes its iterator (a subclass overriding one of them is not hot-swapped).
ITERATOR_HOOKS = ("_get_iterator", "_index_sampler", "_auto_collation")
REQUIRED += tuple((DataLoader, name) for name in ITERATOR_HOOKS)
# Set on instances in __init__ (not visible on the class): checked on a live iterator.
INSTANCE_ATTRIBUTES = (
    "_index_queues",
    "_worker_result_queue",
    "_workers",
    "_shutdown",
    "_sampler_iter",
)


def missing(iterator: object | None = None) -> list[str]:
    """The private names this module uses that the installed torch lacks (empty: all there).
    Pass a live multi-worker iterator to check the attributes set on instances too."""
    gone = [
        f"{getattr(owner, '__name__', owner)}.{name}"
        for owner, name in REQUIRED
        if not hasattr(owner, name)
    ]
    if not hasattr(DataLoader([0]), "_iterator"):  # type: ignore[arg-type]
        gone.append("DataLoader._iterator")
    if not hasattr(multiprocessing.Process(), "_popen"):
        gone.append("multiprocessing.Process._popen")
    if iterator is not None:
        gone += [
            f"{type(iterator).__name__}.{name}"
            for name in INSTANCE_ATTRIBUTES
            if not hasattr(iterator, name)
        ]
    return gone


def missing_live() -> list[str]:
    """:func:`missing`, with the instance attributes checked on a real iterator: one worker is
    started, read once, and shut down before this returns (``loadertune doctor``)."""
    loader: DataLoader[int] = DataLoader(list(range(4)), batch_size=2, num_workers=1)  # type: ignore[arg-type]
    iterator = iter(loader)
    try:
        next(iterator)
        return missing(iterator)
    finally:
        shut_down(iterator)


def live_iterator(loader: DataLoader[Any]) -> object | None:
    """The iterator a ``persistent_workers`` loader keeps between epochs (None if none)."""
    return getattr(loader, "_iterator", None)


_WORKER_DEATH = re.compile(r"DataLoader worker \(pid")


@contextlib.contextmanager
def worker_deaths_ignored() -> Iterator[None]:
    """Silence DataLoader's SIGCHLD handler while a failed loader is taken down.

    When one worker dies, the handler raises in the main thread; while that failure is being
    handled, its siblings die too and the handler would raise again, anywhere. The loader's
    workers are shut down explicitly meanwhile, so nothing is missed. Main thread only (where
    signal handlers live); elsewhere a no-op.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGCHLD, previous)


def is_worker_death(exc: BaseException) -> bool:
    """Whether ``exc`` is DataLoader's report of a dead worker (from next() or SIGCHLD)."""
    return isinstance(exc, RuntimeError) and bool(_WORKER_DEATH.search(str(exc)))


# The frames of DataLoader's main thread waiting for a batch: a multiprocessing queue's poll, or
# a pin-memory thread's queue (Condition.wait). Only there does torch expect its SIGCHLD handler
# to raise.
_WAITING = {
    ("selectors.py", "select"),
    ("connection.py", "wait"),
    ("connection.py", "_poll"),
    ("connection.py", "poll"),
    ("queues.py", "get"),
    ("queue.py", "get"),
    ("threading.py", "wait"),
}
_LIBRARIES = (sysconfig.get_paths()["stdlib"], os.path.dirname(torch.__file__))


def raising_is_safe(frame: Any, *, only_while_waiting: bool = False) -> bool:
    """Whether an exception raised by a signal handler in ``frame`` (the innermost Python frame
    it interrupted) leaves nothing half done: outside the standard library and torch, or where
    torch waits for a batch. Elsewhere inside them it can leak what they were opening (torch's
    open-files probe leaves a temporary file open) or leave a queue half set up (a feeder thread
    interrupted while starting is never told to stop). ``only_while_waiting``: only where torch
    waits for a batch (a real training run: its own code must never see the error)."""
    if frame is None:
        return not only_while_waiting
    caller = frame
    while caller is not None and _place(caller) in _WAITING:
        caller = caller.f_back
    if caller is not frame:  # a wait: torch's wait for a batch, or one inside other work
        return caller is not None and caller.f_code.co_name == "_try_get_data"
    return not only_while_waiting and not frame.f_code.co_filename.startswith(_LIBRARIES)


def _place(frame: Any) -> tuple[str, str]:
    return os.path.basename(frame.f_code.co_filename), frame.f_code.co_name


class _DeferredDeaths:
    """DataLoader's SIGCHLD handler, made to report a dead worker only where that is safe: in
    an unsafe frame the report is kept, and the signal sent again a moment later to raise it."""

    def __init__(
        self,
        handler: Callable[[int, Any], Any],
        *,
        delay_s: float = 0.005,
        send: Callable[[], object] | None = None,
        only_while_waiting: bool = False,
    ) -> None:
        self._handler = handler
        self._delay_s = delay_s
        self._only_while_waiting = only_while_waiting
        main = threading.main_thread().ident
        assert main is not None
        # To the main thread itself: a process-wide signal sent from the timer's thread goes to
        # that thread, and the main thread's wait would not be interrupted until its timeout.
        self._send = send or (lambda: signal.pthread_kill(main, signal.SIGCHLD))
        self._active = True
        self._pending: RuntimeError | None = None
        self._timer: threading.Timer | None = None

    def __call__(self, signum: int, frame: Any) -> None:
        try:
            self._handler(signum, frame)
        except RuntimeError as exc:
            if not is_worker_death(exc):
                raise
            # Kept, not re-detected later: by then the dead worker may have been reaped (each
            # Process.start() reaps its siblings) and torch's check would find nothing.
            self._pending = exc
        if self._pending is None:
            return
        if raising_is_safe(frame, only_while_waiting=self._only_while_waiting):
            pending, self._pending = self._pending, None
            raise pending
        if self._timer is None or not self._timer.is_alive():
            self._timer = threading.Timer(self._delay_s, self._again)
            self._timer.daemon = True
            self._timer.start()

    def _again(self) -> None:
        if self._active:
            self._send()

    def close(self) -> None:
        self._active = False
        if self._timer is not None:
            self._timer.cancel()


@contextlib.contextmanager
def worker_deaths_deferred(*, only_while_waiting: bool = False) -> Iterator[None]:
    """Within this block, a dead worker is reported (raised by DataLoader's SIGCHLD handler)
    only where raising leaves nothing half done; see :func:`raising_is_safe`. Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    install = getattr(_signal_handling, "_set_SIGCHLD_handler", None)
    if callable(install):
        install()  # torch's own handler, set once per process; wrapped below
    handler = signal.getsignal(signal.SIGCHLD)
    if not callable(handler):
        yield
        return
    global _deferred
    deferred = _deferred = _DeferredDeaths(handler, only_while_waiting=only_while_waiting)
    signal.signal(signal.SIGCHLD, deferred)
    try:
        yield
    finally:
        deferred.close()
        _deferred = None
        signal.signal(signal.SIGCHLD, handler)


_deferred: _DeferredDeaths | None = None


def forget_deaths() -> None:
    """A failed loader has been taken down: a report of its dead worker that is still kept
    (raised elsewhere first, by torch's own check) must not fail the next loader."""
    if _deferred is not None:
        _deferred._pending = None


def contained(fn: Callable[[], Any]) -> BaseException | None:
    """Run ``fn`` and return what it raised (None if nothing), including a sibling worker's
    death that DataLoader's SIGCHLD handler reports while the first failure is being caught."""
    try:
        try:
            fn()
        except BaseException as exc:
            return exc
    except RuntimeError as echo:  # raised inside the handler above, before it returned
        if not is_worker_death(echo):
            raise
        return echo.__context__ or echo
    return None


def settle(fn: Callable[[], Any], attempts: int = 5) -> Any:
    """Run ``fn`` with worker deaths ignored, again if an echo of a worker's death (raised by
    DataLoader's SIGCHLD handler before it was silenced) interrupts it. ``fn`` must be safe to
    run twice."""
    for _ in range(attempts - 1):
        try:
            with worker_deaths_ignored():
                return fn()
        except RuntimeError as exc:
            if not is_worker_death(exc):
                raise
    with worker_deaths_ignored():
        return fn()


def shut_down(iterator: object, timeout_s: float = 5.0) -> bool:
    """Stop a DataLoader iterator's workers now rather than whenever it is collected.

    Torch's shutdown puts a message on each worker's queue; should a queue's lock be left held
    (a report of a dead worker raised inside torch's code, which ``worker_deaths_deferred``
    exists to prevent), that put would block forever: so it runs in a helper thread, abandoned
    after ``timeout_s`` (it marks the iterator shut down on entry, so a later ``__del__`` does
    nothing). The queues are closed whatever happened, also for an iterator whose construction
    was interrupted. Kill the workers first: joining dead workers is immediate. Returns False
    when abandoned.
    """
    if not isinstance(iterator, _BaseDataLoaderIter):
        return True
    shutdown = getattr(iterator, "_shutdown_workers", None)
    started = hasattr(iterator, "_shutdown")  # False: iter() was interrupted mid-construction

    def shutdown_and_close() -> None:
        try:
            if started and callable(shutdown):
                shutdown()
        finally:  # torch skips this when a dead worker left it inconsistent; close is idempotent
            queues = [
                *getattr(iterator, "_index_queues", ()),
                getattr(iterator, "_worker_result_queue", None),
            ]
            for q in queues:
                with contextlib.suppress(Exception):
                    q.cancel_join_thread()
                    q.close()

    thread = threading.Thread(target=shutdown_and_close, name="loadertune-shutdown", daemon=True)
    thread.start()
    thread.join(timeout_s)
    return not thread.is_alive()


def stop_pin_thread(iterator: object, timeout_s: float = 1.0) -> None:
    """Stop a DataLoader iterator's pin-memory thread, as torch's own shutdown does before it
    stops the workers: that thread receives each batch from a worker (a tensor's file
    descriptor, over a connection to it), and a worker killed meanwhile makes it raise
    (``ConnectionResetError``) and print a traceback. Waits ``timeout_s`` at most; a thread
    that reads nothing (no pinning, no workers) is left alone."""
    thread = getattr(iterator, "_pin_memory_thread", None)
    done = getattr(iterator, "_pin_memory_thread_done_event", None)
    if not isinstance(thread, threading.Thread) or not thread.is_alive() or done is None:
        return
    done.set()
    with contextlib.suppress(Exception):  # wakes it from its wait for the next batch
        iterator._worker_result_queue.put((None, None))  # type: ignore[attr-defined]
    thread.join(timeout_s)


def take_rest(iterator: object) -> Iterator[Any] | None:
    """Take from a DataLoader iterator the batches of its epoch it has not asked for yet (its
    batch sampler's iterator, which yields them in order): from then on it hands over only the
    batches in flight (``num_workers * prefetch_factor`` at most; none without workers), then
    ends its epoch. None: not a DataLoader iterator of this torch (the epoch runs to its end)."""
    if not isinstance(iterator, _BaseDataLoaderIter) or not hasattr(iterator, "_sampler_iter"):
        return None
    rest: Iterator[Any] = iterator._sampler_iter
    iterator._sampler_iter = iter(())
    return rest


def end_epoch_now(iterator: object | None) -> None:
    """End ``iterator``'s epoch here, as its natural end does: its workers are asked for no
    more batches, and those in flight are received (and dropped), so the workers sit idle.

    A persistent-workers loader's next ``iter()`` waits for every batch its workers still have
    queued (torch's resume throws them away): timed mid-epoch, that wait is no start-up of a
    new epoch, which a natural end leaves with none in flight. With large batches and many
    workers at a high prefetch it would add seconds to every epoch's measured start-up. Not a
    DataLoader iterator of this torch: nothing is done."""
    if iterator is None or take_rest(iterator) is None:
        return
    for _ in iterator:  # type: ignore[attr-defined]
        pass


def iterators_in(error: BaseException | None) -> list[object]:
    """The DataLoader iterators that ``error``'s tracebacks hold (through their frames)."""
    found: dict[int, object] = {}
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        tb = error.__traceback__
        while tb is not None:
            for value in tb.tb_frame.f_locals.values():
                if isinstance(value, _BaseDataLoaderIter):
                    found[id(value)] = value
            tb = tb.tb_next
        error = error.__cause__ or error.__context__
    return list(found.values())


def workers_started(iterator: object) -> int:
    """How many worker processes a DataLoader iterator started (0 without workers)."""
    if not isinstance(iterator, _MultiProcessingDataLoaderIter):
        return 0
    return len(getattr(iterator, "_workers", None) or ())


def dead_worker_signals(
    iterator: object, failure: BaseException | None = None, *, wait_s: float = 0.5
) -> tuple[int, ...]:
    """Signals that killed a DataLoader iterator's workers, read from their exit codes.

    A worker that is being killed closes its files before it becomes a zombie that ``waitpid``
    can see: the main process may fail on that first (a refused connection while receiving a
    tensor's file descriptor, "exited unexpectedly") while every exit code still reads None.
    So after ``failure``, unless it is a dataset's own error raised in a worker, wait up to
    ``wait_s`` for a worker to have died.
    """
    workers = getattr(iterator, "_workers", None) or ()
    wait = bool(workers) and failure is not None and not raised_in_worker(str(failure))
    deadline = time.monotonic() + (wait_s if wait else 0.0)
    while True:
        codes = [getattr(w, "exitcode", None) for w in workers]
        if any(code is not None for code in codes) or time.monotonic() >= deadline:
            return tuple(-code for code in codes if isinstance(code, int) and code < 0)
        time.sleep(0.02)


def tell_multiprocessing(reaped: Mapping[int, int | None]) -> None:
    """Record the exit of workers we reaped on their ``multiprocessing.Process`` objects.

    Once ``waitpid`` has collected a child, multiprocessing's own poll gets ECHILD and takes the
    process for alive forever: it stays in ``active_children()`` with its sentinel pipe open (two
    file descriptors per worker and trial, until the open-file limit is reached).
    """
    for proc in multiprocessing.active_children():
        popen = getattr(proc, "_popen", None)
        if proc.pid is not None and proc.pid in reaped and popen and popen.returncode is None:
            code = reaped[proc.pid]
            popen.returncode = code if code is not None else -signal.SIGKILL
    multiprocessing.active_children()  # forgets the ones now known to be dead
