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

import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from loadertune import signals
from loadertune.measure.counting import FixedCount, structure_counter
from loadertune.measure.window import Measurement, NullSink, Sink, WindowSpec

# What a meter takes, tells and returns (in window.py) is imported from here too.
__all__ = ["Measurement", "Meter", "NullSink", "Sink", "WindowSpec"]

_FIRST, _WARMUP, _OPENING, _WINDOW, _DONE = range(5)
# A next() that waits this long found no batch ready (a ready one is handed over in well under a
# millisecond, a large one through shared memory in a few).
SETTLED_WAIT_S = 0.010
# A window that waits for data this share of its time may see the workers' bursts: it holds
# whole rounds (``WindowSpec.round_batches``).
ROUNDS_MATTER = 0.05
WALL_WINDOWS = 4.0  # a window ends once it has lasted this many window_s of wall time


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


def cycle_warmup(spec: WindowSpec, epoch_batches: int | None, left: int | None = None) -> int:
    """The warm-up of a whole-epoch window that cannot open at an epoch's start and so runs
    across its end: a round of the workers and one more batch (at least two), as a timed
    window's (:func:`loadertune.trials.window_for`), ended sooner by a waiting ``next()`` once
    every worker has delivered. 0 where such a window waits for the next epoch instead, because
    that costs fewer batches: the warm-up and then an epoch, against the ``left`` batches of the
    epoch under way and then an epoch. ``left``: where the window begins, its epoch's batches
    yet to come (None: unknown, reckoned at half an epoch); 0 too where ``epoch_batches`` is
    unknown (the window cannot be placed). A persistent setting at an epoch's start has the
    whole epoch left, and runs across its end in any epoch longer than the warm-up, which in
    short epochs saves a trial a whole epoch of waiting."""
    if not epoch_batches:
        return 0
    warmup = max(2, spec.round_batches + 1)
    left = epoch_batches // 2 if left is None else min(left, epoch_batches)
    return warmup if warmup < left else 0


class Meter:
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

    # Slots: the hot path reads and writes a handful of these per batch.
    __slots__ = (
        "_beat_s",
        "_clock",
        "_count",
        "_cycle",
        "_epoch_batches",
        "_excluded",
        "_first_batch_s",
        "_fixed",
        "_index_in_epoch",
        "_it",
        "_last_beat",
        "_last_index",
        "_left_out_after",
        "_left_out_mark",
        "_measure_cpu",
        "_n_wraps",
        "_on_done",
        "_paused_at",
        "_phase",
        "_reentry_s",
        "_rest_from",
        "_rests",
        "_result",
        "_settle_at",
        "_sink",
        "_sub_end",
        "_sub_excluded",
        "_sub_rates",
        "_sub_samples",
        "_sub_start",
        "_sync",
        "_t_last",
        "_t_wrap",
        "_to_next_epoch",
        "_w_batches",
        "_w_blocked",
        "_w_blocked_cpu",
        "_w_blocked_wait",
        "_w_samples",
        "_w_start",
        "_w_wait_known",
        "_warmup_left",
        "_warmup_start",
        "failed_in_next",
        "spec",
    )

    def __init__(
        self,
        spec: WindowSpec,
        *,
        count: Callable[[Any, int], int] = structure_counter,
        sink: Sink | None = None,
        sync: Callable[[], None] | None = None,
        measure_cpu: bool = False,
        beat_s: float = 0.5,
        on_done: Callable[[Measurement], None] | None = None,
        mid_epoch: bool = False,
        persistent: bool = False,
        epoch_batches: int | None = None,
        epoch_left: int | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.spec = spec
        self._count = count
        # The hot path counts inline for a fixed batch size; CPU timing takes the general path.
        self._fixed = count if isinstance(count, FixedCount) and not measure_cpu else None
        self._sink: Sink = sink or NullSink()
        self._sync = sync
        self._measure_cpu = measure_cpu
        self._beat_s = beat_s
        self._on_done = on_done
        self._clock = clock
        self._it: Iterator[Any] | None = None
        self._phase = _FIRST
        self._result: Measurement | None = None
        self._t_wrap = 0.0
        self._index_in_epoch = 0
        self._n_wraps = 0
        self._t_last = 0.0  # when the last batch was handed over
        # the index of an epoch's last batch, where a whole-epoch window ends (-1: none)
        self._last_index = epoch_batches - 1 if spec.whole_epoch and epoch_batches else -1
        self._paused_at: float | None = None
        self._excluded = 0.0  # time between epochs (validation, logging), outside the window
        # the seconds of other loaders' passes left out since the batch handed over at the mark
        self._left_out_after, self._left_out_mark = 0.0, -math.inf
        self._reentry_s: list[float] = []
        self._rest_from: float | None = None  # the end of an epoch that gave batches
        self._rests: list[float] = []  # the loop's time between two epochs, each seen
        self._last_beat = -math.inf
        self._warmup_left = spec.warmup_batches
        # the warm-up batches left when a waiting next() may end it (-1: never)
        self._settle_at = (
            -1 if spec.settled_after is None else spec.warmup_batches - spec.settled_after
        )
        # A whole-epoch window that cannot open at this epoch's start runs across its end, an
        # epoch's batches long (see ``epoch_batches``), or where that is unknown or would cost
        # more than the rest of this epoch, waits for the next epoch, warming up to this one's end.
        waits = spec.whole_epoch and (mid_epoch or persistent)
        self._epoch_batches = epoch_batches or 0
        self._cycle = 0  # the batches of the window that runs across an epoch's end (0: none)
        left = epoch_left if mid_epoch else epoch_batches
        warmup = cycle_warmup(spec, epoch_batches, left) if waits else 0
        if warmup:
            self._cycle = self._epoch_batches
            self._warmup_left = warmup
            self._settle_at = self._warmup_left - max(2, spec.round_batches)
            self._last_index = -1  # its end is placed when the epoch under way ends
        self._to_next_epoch = waits and not self._cycle
        self._first_batch_s = math.nan
        self._warmup_start = 0.0
        self._w_start = 0.0
        self._w_blocked = 0.0
        self._w_blocked_cpu = 0.0
        self._w_blocked_wait = 0.0  # run-queue wait inside next()
        self._w_wait_known = True
        self._w_samples = 0
        self._w_batches = 0
        self._sub_start = 0.0
        self._sub_end = 0.0
        self._sub_excluded = 0.0
        self._sub_samples = 0
        self._sub_rates: list[float] = []
        self.failed_in_next = False

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

    @property
    def done(self) -> bool:
        return self._phase == _DONE

    @property
    def clock(self) -> Callable[[], float]:
        """The clock this meter reads (``time.perf_counter`` unless one was injected)."""
        return self._clock

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
            self._reentry_s.append(waited)
            if phase == _WINDOW:
                # A new epoch's start-up (non-persistent workers restart) is counted once, per
                # epoch, from ``reentry_s`` (``TrialResult.epoch_startup_s``); in the steady rate
                # too, it would count twice, and only for the windows that hold an epoch's end.
                self._excluded += waited
                self._sub_end += waited
                waited = 0.0
        if phase == _WINDOW:
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
        elif phase == _WARMUP:
            self._warmup_left -= 1
            if not self._to_next_epoch and (
                self._warmup_left <= 0
                or (waited >= SETTLED_WAIT_S and self._warmup_left <= self._settle_at)
            ):
                self._phase = _OPENING
        else:  # _FIRST
            self._first_batch_s = t1 - self._t_wrap
            self._warmup_start = t1
            self._sink.event("first_batch")
            self._phase = _WARMUP if self._warmup_left > 0 or self._to_next_epoch else _OPENING
            if self._phase == _OPENING and self.spec.whole_epoch:
                # The first batch's step is the epoch's too, and its slowest (the workers are
                # all busy filling the buffer): the window holds it.
                self._open_window(t1)
                self._window_holds(batch, index)
        return batch

    def _mean_step(self) -> float:
        """The window's mean step so far (0 outside a window): its time to the last batch's
        hand-over holds a wait for each of its batches and a step for all but the last."""
        if self._phase != _WINDOW or self._w_batches < 2:
            return 0.0
        busy = self._t_last - self._w_start - self._excluded - self._w_blocked
        return max(0.0, busy / (self._w_batches - 1))

    def _window_holds(self, batch: Any, index: int) -> None:
        """Count ``batch`` (the ``index``-th of its epoch) in the window."""
        n = self._count(batch, index)
        self._w_samples += n
        self._sub_samples += n
        self._w_batches += 1

    def _epoch_ended(self, t0: float, *, by_count: bool = False) -> None:
        """The loop's ``next()`` at ``t0`` found the epoch over; ``by_count``: the loop
        stopped asking, and ``t0`` is when its last step is reckoned to have ended."""
        phase = self._phase
        if phase == _WINDOW and self._cycle:
            # The window runs on into the next epoch, to its ``cycle``-th batch: every part of
            # an epoch (its start-up, first round and tail) once, as in a whole epoch.
            left, self._cycle = self._cycle - self._w_batches, 0
            self._last_index = left - 1 if left > 0 else -1
            if left <= 0:  # (this epoch held an epoch's batches after all: the window is full)
                self._epoch_ended(t0, by_count=by_count)
                return
        elif phase == _WINDOW and self.spec.whole_epoch:
            if self._sync is not None and not by_count:  # (by count, ``t0`` is reckoned)
                self._sync()
                t0 = self._clock()
            self._close_sub_window(t0)
            self._finish(t0, complete=True, whole_epoch=True)
            return
        self._paused_at = t0
        self._rest_from = t0 if phase != _FIRST else None
        if phase == _FIRST:
            self._to_next_epoch = False  # nothing came: the next epoch starts with the meter
            if self._cycle:  # and is its window, whole
                self._cycle = self._warmup_left = 0
                self._last_index = self._epoch_batches - 1
        else:  # the epoch ended before the window did: the loop is elsewhere
            if self._to_next_epoch:
                self._phase = _OPENING  # the next epoch is the window
            self._sink.event("rest")

    # The window opens at the start of the next() call after the last warm-up batch, so that
    # batch's step stays outside it, and closes at the start of a next() call, after a step.

    def _open_window(self, t0: float) -> float:
        if self._sync is not None:
            self._sync()
            t0 = self._clock()
        self._sink.event("window_start")
        self._w_start = self._sub_start = t0
        self._sub_excluded = self._excluded
        self._sub_end = t0 + self.spec.window_s / self.spec.n_sub_windows
        self._phase = _WINDOW
        return t0

    def _close_sub_window(self, t: float) -> None:
        elapsed = t - self._sub_start - (self._excluded - self._sub_excluded)
        if self._sub_samples or elapsed > 0:
            self._sub_rates.append(self._sub_samples / elapsed if elapsed > 0 else 0.0)
        self._sub_samples = 0
        self._sub_start = t
        self._sub_excluded = self._excluded

    def _round_done(self, t0: float) -> bool:
        """A sub-window may end here: after whole rounds of the workers, or anywhere when the loop
        hardly waits for data (the buffer stays full and batches come at the step's pace, not in
        bursts)."""
        return self._w_batches % self.spec.round_batches == 0 or self._w_blocked < ROUNDS_MATTER * (
            t0 - self._w_start
        )

    def _sub_window_boundary(self, t0: float) -> float:
        if self._sync is not None:
            self._sync()
            t0 = self._clock()
        self._close_sub_window(t0)
        elapsed = t0 - self._w_start - self._excluded
        running = self._w_samples / elapsed if elapsed > 0 else 0.0
        keep_going = self._sink.progress(len(self._sub_rates) - 1, running)
        # time left out (validations) stretches the window: not past WALL_WINDOWS of it
        full = self.spec.is_full(elapsed, self._w_batches) or (
            t0 - self._w_start >= WALL_WINDOWS * self.spec.window_s and self._w_batches > 0
        )
        if full or not keep_going:
            self._finish(t0, complete=full, stopped_early=not full)
            return t0
        t_back = self._clock()  # the sink's own time is not the loop's: leave it out
        self._excluded += t_back - t0
        self._sub_end = t_back + self.spec.window_s / self.spec.n_sub_windows
        return t_back

    def _finish(
        self,
        t_end: float,
        *,
        complete: bool,
        stopped_early: bool = False,
        whole_epoch: bool = False,
    ) -> None:
        window = t_end - self._w_start - self._excluded
        self._phase = _DONE
        self._sink.event("window_end")
        blocked = self._w_blocked
        self._result = Measurement(
            samples_per_s=self._w_samples / window if window > 0 else 0.0,
            sub_window_samples_per_s=list(self._sub_rates),
            blocked_fraction=min(1.0, blocked / window) if window > 0 else 0.0,
            first_batch_s=self._first_batch_s,
            warmup_s=max(0.0, self._w_start - self._warmup_start),
            window_s=window,
            n_samples=self._w_samples,
            n_batches=self._w_batches,
            complete=complete,
            stopped_early=stopped_early,
            reentry_s=list(self._reentry_s),
            rest_s=list(self._rests),
            blocked_cpu_fraction=(
                self._w_blocked_cpu / blocked if self._measure_cpu and blocked > 0 else None
            ),
            blocked_wait_fraction=(
                self._w_blocked_wait / blocked
                if self._measure_cpu and self._w_wait_known and blocked > 0
                else None
            ),
            step_s_per_batch=(window - blocked) / self._w_batches if self._w_batches else 0.0,
            whole_epoch=whole_epoch,
        )
        if self._on_done is not None:
            self._on_done(self._result)

    def place(self) -> tuple[int, int]:
        """Where the loop is in this meter's batches (its epoch, its batch): unchanged between
        two calls, the loop asked none of them in between."""
        return self._n_wraps, self._index_in_epoch

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

    def left_out(self, seconds: float, since: tuple[int, int]) -> None:
        """The loop spent ``seconds`` on a whole pass of another loader (a validation inside
        the training epoch) and asked none of this meter's batches meanwhile (``since``: the
        :meth:`place` at the pass's start): that time is left out of the window, as a rest
        between two epochs is. Kept in, a validation pass inside a window spreads its
        sub-window rates widely and can decide which setting wins. A whole epoch's window
        leaves it out too, so that its rate compares with windows that held none. Such a
        window ends at its epoch's end, by StopIteration or by count (:meth:`_epoch_ended`)."""
        if (
            self._phase == _WINDOW
            and self._paused_at is None  # (a rest between epochs is left out at the next one)
            and since == self.place()
            and seconds > 0
        ):
            self._excluded += seconds
            self._sub_end += seconds
            if self._left_out_mark != self._t_last:
                self._left_out_after, self._left_out_mark = 0.0, self._t_last
            self._left_out_after += seconds

    def finish_now(self) -> Measurement | None:
        """End the window where it stands (the loop ran out of data); None if it never opened."""
        if self._result is not None:
            return self._result
        if self._phase != _WINDOW:
            return None
        t = self._paused_at if self._paused_at is not None else self._clock()
        if self._sync is not None and self._paused_at is None:
            self._sync()
            t = self._clock()
        self._close_sub_window(t)
        self._finish(t, complete=False)
        return self._result

    @property
    def iterator(self) -> Iterator[Any] | None:
        """The current epoch's iterator (a DataLoader's, with its workers)."""
        return self._it

    def release(self) -> None:
        """Drop the current epoch's iterator (a DataLoader iterator shuts its workers down)."""
        self._it = None

    def result(self) -> Measurement:
        """The measurement; raises RuntimeError before the window has ended."""
        if self._result is None:
            raise RuntimeError("the window has not ended; iterate until StopIteration first")
        return self._result


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
