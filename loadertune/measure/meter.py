"""Time a training loop's consumption of batches: the measurement at the heart of every trial.

:class:`Meter` is an iterator proxy. Whatever loop consumes it (loadertune's own in
``tune_loader``, or an unmodified script's ``for batch in loader:``) is measured the same way::

    meter = Meter(WindowSpec(warmup_batches=9, window_s=1.5), count=FixedCount(64))
    for batch in meter.wrap(loader):
        step(batch)            # the time until the next next() call is the step's
    meter.result().samples_per_s

Per batch the hot path costs two clock reads and a few additions (``scripts/bench_overhead.py``
measures it). Phases: the first batch (worker start-up, timed alone), warm-up batches (the
prefetch buffer drains to its steady level), then a time-based window split into sub-windows
whose rates show the noise. The window ends at the first ``next()`` after ``window_s``; that call
raises ``StopIteration`` (or calls ``on_done``, which may end the process).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

from loadertune import signals
from loadertune.measure.meter_window import (
    _DONE,
    _OPENING,
    _WARMUP,
    _WINDOW,
    SETTLED_WAIT_S,
    MeterWindow,
)
from loadertune.measure.window import Measurement, NullSink, Sink, WindowSpec, cycle_warmup

# What a meter takes, tells and returns (in window.py) is imported from here too.
__all__ = ["Measurement", "Meter", "NullSink", "Sink", "WindowSpec", "cycle_warmup"]


_NO_TIMES: tuple[float, float | None] = (0.0, None)
_schedstat = threading.local()  # each thread's /proc schedstat file, opened once


def thread_times() -> tuple[float, float | None]:
    """The calling thread's CPU seconds and run-queue wait (seconds it was ready to run while
    the CPUs ran other work), from ``/proc``'s schedstat; the wait is None where that cannot be
    read (then the CPU time is ``time.thread_time()``)."""
    tid = threading.get_native_id()
    if getattr(_schedstat, "tid", None) != tid:
        _schedstat.tid = tid
        try:
            _schedstat.fd = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY)
        except OSError:
            _schedstat.fd = None
    fd = _schedstat.fd
    if fd is not None:
        try:
            ran, waited = os.pread(fd, 64, 0).split()[:2]
            return int(ran) / 1e9, int(waited) / 1e9
        except (OSError, ValueError):
            pass
    return time.thread_time(), None


class Meter(MeterWindow):
    """An iterator proxy that measures the loop consuming it. See the module docstring.

    Args:
        spec: warm-up and window lengths.
        count: ``count(batch, index_in_epoch) -> samples``.
        sink: told about phases, heartbeats and sub-window progress.
        sync: called before the clock is read at window boundaries (``torch.cuda.synchronize``
            when CUDA is in use, so queued GPU work lands in the window it belongs to).
        measure_cpu: also measure CPU time spent inside ``next()`` (for ``num_workers=0``, where
            the loading runs in this thread; tells CPU-bound from I/O-bound loading).
        beat_s: at most one heartbeat per this many seconds.
        on_done: called with the result when the window ends, before ``StopIteration``.
        mid_epoch: the meter begins in the middle of an epoch (a setting swapped in under a
            running loop): a whole-epoch window (``WindowSpec.whole_epoch``) cannot open at
            the epoch's start.
        persistent: the loader's workers persist across epochs. Their first epoch is no epoch
            as training sees it (its first batch waits for their start, which they pay once):
            a whole-epoch window cannot open at its start either; the next epoch begins with
            a re-entry, timed (``reentry_s``). Opened on the first, a short epoch whose first
            wait holds the making of most of its batches would read several times the rate
            the script gets.
        epoch_batches: the batches of a whole epoch, where known: a whole-epoch window ends
            with the step on the last of them, for a loop that stops by count (Lightning asks
            exactly ``len(loader)`` batches, and its last epoch is followed by no other). A
            whole-epoch window that cannot open at an epoch's start (``mid_epoch``,
            ``persistent``) then warms up (:func:`cycle_warmup`) and holds that many batches
            across the epoch's end, so that every part of an epoch (the next one's start-up,
            its first round, this one's tail) is in it once, as in a whole epoch, without
            costing a trial a second epoch. Unknown, or where the rest of the epoch under way
            is shorter than the warm-up (:func:`cycle_warmup`): it waits for the next epoch.
        epoch_left: the batches of the epoch under way yet to come where the meter begins
            mid-epoch, where known (None: unknown).
        clock: seconds, monotonic (tests and simulations pass a fake one).
    """

    __slots__ = ()  # (the state is MeterWindow's)

    def wrap(self, iterable: Iterable[Any]) -> Meter:
        """Measure one epoch of ``iterable``; call again with the same loader for the next epoch.

        ``iter(iterable)`` is called here, after the clock is read, so the start-up of
        non-persistent workers counts in the first batch's time.
        """
        now = self._clock()
        if self._paused_at is None and self._index_in_epoch and self._phase != _DONE:
            # A new epoch without StopIteration: the loop left the last one by count
            # (Lightning asks exactly len(loader) batches) or broke out of it. It ended with
            # the step on its last batch, about as long as the window's steps. The passes of
            # other loaders since (:meth:`left_out`) are out of the window already.
            self._epoch_ended(min(now, self._t_last + self._mean_step()), by_count=True)
            if self._paused_at is not None and self._left_out_mark == self._t_last:
                self._paused_at = min(now, self._paused_at + self._left_out_after)
        if self._rest_from is not None:
            self._rests.append(now - self._rest_from)
            self._rest_from = None
        if self._paused_at is not None:
            if self._phase == _WINDOW:  # the loop was elsewhere between two epochs (validation)
                self._excluded += now - self._paused_at
            self._paused_at = None
            if self._phase != _DONE:
                self._sink.event("beat")  # back from a rest
        self._t_wrap = now
        self._index_in_epoch = 0
        self._n_wraps += 1
        try:
            with signals.held():  # a Ctrl-C in the workers' fork would be lost
                self._it = iter(iterable)  # non-persistent workers start: the loader's failure
        except BaseException:
            self.failed_in_next = True
            raise
        return self

    def __iter__(self) -> Meter:
        return self

    def __next__(self) -> Any:
        t0 = self._clock()
        if (
            self._phase != _WINDOW
            or t0 >= self._sub_end
            or t0 - self._last_beat >= self._beat_s
            or self._index_in_epoch == 0
            or self._index_in_epoch == self._last_index
            or self._fixed is None
        ):
            return self._next(t0)
        # The hot path, a batch inside the window: two clock reads and four additions.
        try:
            batch = next(self._it)  # type: ignore[arg-type]
        except StopIteration:
            self._epoch_ended(t0)
            raise
        except BaseException:
            self.failed_in_next = True
            raise
        t1 = self._clock()
        index = self._index_in_epoch
        self._index_in_epoch = index + 1
        self._t_last = t1
        self._w_blocked += t1 - t0
        fixed = self._fixed
        n = fixed.short if index == fixed.short_at else fixed.batch_size
        self._w_samples += n
        self._sub_samples += n
        self._w_batches += 1
        return batch

    def _next(self, t0: float) -> Any:
        """Every other batch: phases, epoch starts, heartbeats, sub-window boundaries."""
        if self._phase == _OPENING:
            t0 = self._open_window(t0)
        elif self._phase == _WINDOW and t0 >= self._sub_end and self._round_done(t0):
            t0 = self._sub_window_boundary(t0)
        phase = self._phase
        if phase == _DONE:
            raise StopIteration
        if t0 - self._last_beat >= self._beat_s:
            self._last_beat = t0
            self._sink.event("beat")
        if self._it is None:
            raise RuntimeError("Meter.wrap(iterator) must be called before iterating")
        c0 = thread_times() if self._measure_cpu else _NO_TIMES
        try:
            batch = next(self._it)
        except StopIteration:
            self._epoch_ended(t0)
            raise
        except BaseException:
            self.failed_in_next = True  # the loader raised, not the loop's body
            raise
        t1 = self._clock()
        index = self._index_in_epoch
        self._index_in_epoch = index + 1
        step = t0 - self._t_last if index else 0.0  # the loop's step on the batch before
        self._t_last = t1
        # The first batch of an epoch waited since iter() (in wrap): worker start-up included.
        waited = t1 - (self._t_wrap if index == 0 else t0)
        if index == 0 and self._n_wraps > 1:
            waited = self._reentered(waited, phase)
        if phase == _WINDOW:
            self._in_window(batch, index, t1, step, waited, c0)
        elif phase == _WARMUP:
            self._warming_up(waited)
        else:  # _FIRST
            self._first_batch(batch, index, t1)
        return batch

    def _reentered(self, waited: float, phase: int) -> float:
        """A new epoch's first batch came after ``waited`` seconds: its start-up, recorded; the
        part of ``waited`` the window counts as blocked (none of it)."""
        self._reentry_s.append(waited)
        if phase != _WINDOW:
            return waited
        # A new epoch's start-up (non-persistent workers restart) is counted once, per epoch,
        # from ``reentry_s`` (``TrialResult.epoch_startup_s``); in the steady rate too, it would
        # count twice, and only for the windows that hold an epoch's end.
        self._excluded += waited
        self._sub_end += waited
        return 0.0

    def _in_window(
        self,
        batch: Any,
        index: int,
        t1: float,
        step: float,
        waited: float,
        c0: tuple[float, float | None],
    ) -> None:
        """A batch in the window, handed over at ``t1`` after ``waited`` seconds in ``next()``
        (``c0``: the thread's CPU times when it began); ``step``: the loop's step before it."""
        self._w_blocked += waited
        if self._measure_cpu:
            c1 = thread_times()
            self._w_blocked_cpu += c1[0] - c0[0]
            if c0[1] is None or c1[1] is None:
                self._w_wait_known = False
            else:
                self._w_blocked_wait += c1[1] - c0[1]
        self._window_holds(batch, index)
        if index == self._last_index:  # the epoch ends with the step on this batch
            end = t1
            if self._sync is not None:  # the GPU's queued steps first, then this one's
                self._sync()
                end = max(t1, self._clock())
            self._epoch_ended(end + step, by_count=True)  # this step: as long

    def _warming_up(self, waited: float) -> None:
        """A warm-up batch: the window opens at the next ``next()`` once the warm-up is over,
        or once a ``next()`` waited (the buffer is empty) after enough of it."""
        self._warmup_left -= 1
        if not self._to_next_epoch and (
            self._warmup_left <= 0
            or (waited >= SETTLED_WAIT_S and self._warmup_left <= self._settle_at)
        ):
            self._phase = _OPENING

    def _first_batch(self, batch: Any, index: int, t1: float) -> None:
        """The first batch, handed over at ``t1``: the workers' start-up, timed alone."""
        self._first_batch_s = t1 - self._t_wrap
        self._warmup_start = t1
        self._sink.event("first_batch")
        self._phase = _WARMUP if self._warmup_left > 0 or self._to_next_epoch else _OPENING
        if self._phase == _OPENING and self.spec.whole_epoch:
            # The first batch's step is the epoch's too, and its slowest (the workers are
            # all busy filling the buffer): the window holds it.
            self._open_window(t1)
            self._window_holds(batch, index)

    def beat(self) -> None:
        """The loop makes progress elsewhere (another loader's pass): a sign of life for the
        sink, at most one every ``beat_s``, as the meter's own batches give. Not while this
        loader rests between two of its epochs: that rest is its own, and the sink judges it
        (a loader iterated too seldom to be measured)."""
        now = self._clock()
        if (
            self._phase != _DONE
            and self._paused_at is None
            and now - self._last_beat >= self._beat_s
        ):
            self._last_beat = now
            self._sink.event("beat")

    @property
    def iterator(self) -> Iterator[Any] | None:
        """The current epoch's iterator (a DataLoader's, with its workers)."""
        return self._it

    def release(self) -> None:
        """Drop the current epoch's iterator (a DataLoader iterator shuts its workers down)."""
        self._it = None


def elsewhere(
    batches: Iterator[Any], meter: Meter | None, length: int | None = None
) -> Iterator[Any]:
    """``batches``, another loader's epoch that the loop iterates while ``meter`` measures the
    tuned one: each batch is a sign of life for ``meter``'s sink (:meth:`Meter.beat`: a
    validation longer than the hang limit is not a hang), and a whole pass run between two of
    ``meter``'s batches is left out of its window (:meth:`Meter.left_out`). Whole: to its end,
    or ``length`` batches (the loader's length: an evaluation loop such as Lightning's stops by
    count, without asking past the end); a batch or two drawn inside a training step are the
    step's and stay in. ``batches`` itself when nothing is measured."""
    if meter is None or meter.done:
        return batches
    return _elsewhere(batches, meter, length)


def _elsewhere(batches: Iterator[Any], meter: Meter, length: int | None) -> Iterator[Any]:
    # The pass is whole at its ``length``-th batch: the loop may never ask past it, and drop
    # the iterator only much later (Lightning does, at its next validation).
    clock = meter.clock
    since, t0, n = meter.place(), clock(), 0
    for batch in batches:
        n += 1
        meter.beat()
        if n == length:
            meter.left_out(clock() - t0, since)
        yield batch
    if length is None or n < length:  # (a length that was not the pass's: left out at its end)
        meter.left_out(clock() - t0, since)
