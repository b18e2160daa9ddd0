"""A meter's window: its phases (the first batch, the warm-up, the window, done), where the
window opens and where its sub-windows end, how an epoch's end or another loader's pass moves
it, and the :class:`~loadertune.measure.window.Measurement` it gives.
:class:`~loadertune.measure.meter.Meter` is this state plus the iterator a loop consumes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from typing import Any

from loadertune.measure.counting import FixedCount, structure_counter
from loadertune.measure.window import Measurement, NullSink, Sink, WindowSpec, cycle_warmup

_FIRST, _WARMUP, _OPENING, _WINDOW, _DONE = range(5)
# A next() that waits this long found no batch ready (a ready one is handed over in well under a
# millisecond, a large one through shared memory in a few).
SETTLED_WAIT_S = 0.010
# A window that waits for data this share of its time may see the workers' bursts: it holds
# whole rounds (``WindowSpec.round_batches``).
ROUNDS_MATTER = 0.05
WALL_WINDOWS = 4.0  # a window ends once it has lasted this many window_s of wall time


class MeterWindow:
    """What a :class:`~loadertune.measure.meter.Meter` holds, and how its window runs; its
    arguments are the Meter's (see there)."""

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

    @property
    def done(self) -> bool:
        return self._phase == _DONE

    @property
    def clock(self) -> Callable[[], float]:
        """The clock this meter reads (``time.perf_counter`` unless one was injected)."""
        return self._clock

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

    def result(self) -> Measurement:
        """The measurement; raises RuntimeError before the window has ended."""
        if self._result is None:
            raise RuntimeError("the window has not ended; iterate until StopIteration first")
        return self._result
