"""The torch helpers: sizes and counts of batches, settings read back from a loader, and taking a
failed loader down (worker deaths reported while another is being handled, shutdown)."""

from __future__ import annotations

import collections
import inspect
import selectors
import signal
import sys
import tempfile
import threading
import types
from collections.abc import Iterator

import numpy as np
import psutil
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from loadertune.config import Config
from loadertune.trials import loader as dl
from loadertune.trials import torch_internals as _internals

from workloads import TensorDataset

ECHO = "DataLoader worker (pid 4242) is killed by signal: Killed. "


def test_batch_nbytes_counts_tensors_and_arrays_in_any_structure() -> None:
    batch = {
        "x": torch.zeros(4, 8),  # 128 bytes
        "ids": [np.zeros(4, dtype=np.int64), "text"],  # 32 bytes, a string counts nothing
        "y": (torch.zeros(4, dtype=torch.uint8), 7),  # 4 bytes
    }
    assert dl.batch_nbytes(batch) == 128 + 32 + 4


def test_bytes_per_sample_divides_by_the_samples_in_the_batch() -> None:
    assert dl.bytes_per_sample((torch.zeros(16, 10), torch.zeros(16))) == (640 + 64) / 16


def test_settings_of_reads_the_tuned_settings_back() -> None:
    ds = TensorDataset(n=64)
    assert dl.settings_of(DataLoader(ds, batch_size=8)) == Config(8)
    loader = DataLoader(ds, batch_size=4, num_workers=2, prefetch_factor=3, persistent_workers=True)
    assert dl.settings_of(loader) == Config(4, 2, 3, persistent_workers=True)


def test_sample_counter_is_arithmetic_for_a_regular_sampler() -> None:
    loader = DataLoader(TensorDataset(n=10), batch_size=4)
    count = dl.sample_counter(loader)
    assert [count(batch, i) for i, batch in enumerate(loader)] == [4, 4, 2]


class _Stream(IterableDataset):
    def __init__(self, sharded: bool) -> None:
        self.sharded = sharded

    def __iter__(self) -> Iterator[torch.Tensor]:
        info = get_worker_info()
        start, step = (info.id, info.num_workers) if self.sharded and info else (0, 1)
        return (torch.tensor([float(i)]) for i in range(start, 64, step))


@pytest.mark.slow
def test_an_unsharded_stream_is_recognised() -> None:
    assert dl.duplicated_across_workers(_Stream(sharded=False), batch_size=4)
    assert not dl.duplicated_across_workers(_Stream(sharded=True), batch_size=4)


def test_is_worker_death() -> None:
    assert _internals.is_worker_death(RuntimeError(ECHO))
    assert not _internals.is_worker_death(RuntimeError("something else"))
    assert not _internals.is_worker_death(ValueError(ECHO))


def test_contained_returns_what_was_raised() -> None:
    def boom() -> None:
        raise ValueError("the dataset broke")

    assert _internals.contained(lambda: None) is None
    error = _internals.contained(boom)
    assert isinstance(error, ValueError)
    assert isinstance(_internals.contained(lambda: sys.exit(3)), SystemExit)


def _raise_in_contained_handler(exc: BaseException):  # type: ignore[no-untyped-def]
    """A trace function raising ``exc`` once, as a signal handler would, at the first line of
    contained()'s ``except`` clause: the bytecode boundary where a sibling's SIGCHLD lands."""
    lines, start = inspect.getsourcelines(_internals.contained)
    target = start + next(i for i, line in enumerate(lines) if line.strip() == "return exc")
    fired = []

    def local(frame, event, arg):  # type: ignore[no-untyped-def]
        if event == "line" and frame.f_lineno == target and not fired:
            fired.append(True)
            raise exc
        return local

    def tracer(frame, event, arg):  # type: ignore[no-untyped-def]
        return local if frame.f_code is _internals.contained.__code__ else None

    return tracer


def test_contained_keeps_the_first_failure_when_a_sibling_dies_while_it_is_caught() -> None:
    def first_death() -> None:
        raise RuntimeError("DataLoader worker (pid(s) 4241) exited unexpectedly")

    sys.settrace(_raise_in_contained_handler(RuntimeError(ECHO)))
    try:
        error = _internals.contained(first_death)
    finally:
        sys.settrace(None)
    assert isinstance(error, RuntimeError) and "4241" in str(error)


def test_contained_lets_other_errors_raised_while_catching_escape() -> None:
    def boom() -> None:
        raise ValueError("first")

    sys.settrace(_raise_in_contained_handler(KeyError("not a worker's death")))
    try:
        with pytest.raises(KeyError):
            _internals.contained(boom)
    finally:
        sys.settrace(None)


def test_settle_silences_worker_deaths_and_retries_an_echo() -> None:
    handler = signal.getsignal(signal.SIGCHLD)
    calls: collections.Counter[str] = collections.Counter()

    def take_down() -> str:
        calls["n"] += 1
        assert signal.getsignal(signal.SIGCHLD) == signal.SIG_DFL
        if calls["n"] == 1:
            raise RuntimeError(ECHO)  # arrived before the handler was silenced
        return "down"

    assert _internals.settle(take_down) == "down"
    assert calls["n"] == 2
    assert signal.getsignal(signal.SIGCHLD) == handler


def test_settle_raises_other_errors_and_gives_up_on_endless_echoes() -> None:
    def broken() -> None:
        raise ValueError("a bug")

    def echoes() -> None:
        raise RuntimeError(ECHO)

    with pytest.raises(ValueError):
        _internals.settle(broken)
    with pytest.raises(RuntimeError):
        _internals.settle(echoes, attempts=3)


def _iterator_failing_inside() -> None:
    it = iter(DataLoader(TensorDataset(n=64), batch_size=8, num_workers=2))
    next(it)
    raise ValueError("failed with the iterator in a local")


@pytest.mark.slow
def test_shut_down_stops_the_workers_an_error_s_traceback_holds() -> None:
    try:
        _iterator_failing_inside()
    except ValueError as exc:
        error = exc
    iterators = _internals.iterators_in(error)
    assert len(iterators) == 1
    workers = [psutil.Process(w.pid) for w in iterators[0]._workers]  # type: ignore[attr-defined]
    assert all(w.is_running() for w in workers)
    assert _internals.shut_down(iterators[0])
    _, alive = psutil.wait_procs(workers, timeout=10)
    assert alive == []
    assert _internals.shut_down(iterators[0])  # idempotent
    assert _internals.shut_down(None)  # not an iterator: nothing to do


def _frame(*codes: types.CodeType) -> types.SimpleNamespace | None:
    """A stack of frames, innermost first, as a signal handler is given it."""
    frame = None
    for code in reversed(codes):
        frame = types.SimpleNamespace(f_code=code, f_back=frame)
    return frame


def test_raising_is_safe_only_outside_library_internals_or_where_torch_waits() -> None:
    import multiprocessing.connection
    import multiprocessing.queues
    import queue

    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

    try_get_data = _MultiProcessingDataLoaderIter._try_get_data.__code__
    user = test_is_worker_death.__code__
    assert _internals.raising_is_safe(None)
    assert _internals.raising_is_safe(_frame(user))
    waiting_for_a_batch = _frame(
        selectors.DefaultSelector.select.__code__,
        multiprocessing.connection.wait.__code__,
        multiprocessing.queues.Queue.get.__code__,
        try_get_data,
    )
    assert _internals.raising_is_safe(waiting_for_a_batch)
    pinned = _frame(threading.Condition.wait.__code__, queue.Queue.get.__code__, try_get_data)
    assert _internals.raising_is_safe(pinned)  # the pin-memory thread's queue
    # A wait inside other work: a queue's feeder thread starting (Thread.start waits for it)
    starting = _frame(threading.Event.wait.__code__, threading.Thread.start.__code__, user)
    assert not _internals.raising_is_safe(starting)
    assert not _internals.raising_is_safe(
        _frame(tempfile.mkstemp.__code__)
    )  # torch's open-files probe
    assert not _internals.raising_is_safe(_frame(try_get_data))


def _torch_handler_reporting(error: BaseException):  # type: ignore[no-untyped-def]
    def handler(signum: int, frame: object) -> None:
        raise error

    return handler


def test_a_death_is_reported_at_once_in_a_safe_frame() -> None:
    sent = threading.Event()
    deferred = _internals._DeferredDeaths(
        _torch_handler_reporting(RuntimeError(ECHO)), send=sent.set
    )
    with pytest.raises(RuntimeError, match="killed by signal"):
        deferred(signal.SIGCHLD, _frame(test_is_worker_death.__code__))
    assert not sent.wait(0.1)


def test_a_death_in_library_internals_is_kept_and_raised_once_safe() -> None:
    sent = threading.Event()
    deferred = _internals._DeferredDeaths(
        _torch_handler_reporting(RuntimeError(ECHO)), delay_s=0.01, send=sent.set
    )
    deferred(signal.SIGCHLD, _frame(tempfile.mkstemp.__code__))  # no exception here
    assert sent.wait(5)
    # The signal again, now in a safe frame: the kept report is raised even though torch's
    # check finds nothing any more (the dead worker was reaped meanwhile).
    deferred._handler = lambda signum, frame: None
    with pytest.raises(RuntimeError, match="killed by signal"):
        deferred(signal.SIGCHLD, _frame(test_is_worker_death.__code__))
    deferred(signal.SIGCHLD, _frame(test_is_worker_death.__code__))  # reported once only
    other = _internals._DeferredDeaths(_torch_handler_reporting(KeyError("a bug")), send=sent.set)
    with pytest.raises(KeyError):  # anything but a worker's death goes through
        other(signal.SIGCHLD, _frame(tempfile.mkstemp.__code__))


def test_closing_cancels_the_signal_put_off() -> None:
    sent = threading.Event()
    deferred = _internals._DeferredDeaths(
        _torch_handler_reporting(RuntimeError(ECHO)), delay_s=0.2, send=sent.set
    )
    deferred(signal.SIGCHLD, _frame(tempfile.mkstemp.__code__))
    deferred.close()
    assert not sent.wait(0.5)


def test_worker_deaths_deferred_wraps_torch_s_handler_and_restores_it() -> None:
    with _internals.worker_deaths_deferred():
        inside = signal.getsignal(signal.SIGCHLD)
        assert isinstance(inside, _internals._DeferredDeaths)
    after = signal.getsignal(signal.SIGCHLD)
    assert callable(after) and not isinstance(after, _internals._DeferredDeaths)


def _dies_soon(delay_s: float) -> None:
    import os
    import time

    time.sleep(delay_s)
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.parametrize(
    ("failure", "found"),
    [
        (RuntimeError("DataLoader worker (pid(s) 4242) exited unexpectedly"), (signal.SIGKILL,)),
        (ValueError("Caught ValueError in DataLoader worker process 0."), ()),
    ],
)
def test_a_worker_still_dying_when_the_failure_is_seen_is_waited_for(
    failure: BaseException, found: tuple[int, ...]
) -> None:
    """The failure can reach the main process before the dying worker is a zombie: its signal
    is waited for, but not after a dataset's own error raised in a worker."""
    import multiprocessing

    worker = multiprocessing.get_context("fork").Process(target=_dies_soon, args=(0.2,))
    worker.start()
    try:
        iterator = types.SimpleNamespace(_workers=[worker])
        assert _internals.dead_worker_signals(iterator, failure) == found
    finally:
        worker.join(5)
