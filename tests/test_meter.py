"""The meter: phases, sample counting, blocked time, epoch gaps, early stop.

Time here is a :class:`FakeClock`'s: the meter reads it, and the test's loaders and steps
advance it, so windows and rates are exact and nothing sleeps. Only the tests of CPU time and
run-queue waits inside ``next()`` (``measure_cpu``), which the kernel counts in real time, run
on the real clock, briefly.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import time

import pytest
import torch

from loadertune.measure.counting import FixedCount, structure_count
from loadertune.measure.meter import Measurement, Meter, WindowSpec


class FakeClock:
    """Seconds that pass only when a test says so: pass it as ``Meter(..., clock=clock)``."""

    def __init__(self, start: float = 100.0) -> None:
        self.now = start  # not 0: a meter that took 0 for "never" would go unnoticed

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class Recorder:
    """A sink that records events and can ask to stop at a given sub-window."""

    def __init__(self, stop_at: int | None = None) -> None:
        self.events: list[str] = []
        self.progress_calls: list[tuple[int, float]] = []
        self.stop_at = stop_at

    def event(self, name: str) -> None:
        if name != "beat":
            self.events.append(name)

    def progress(self, index: int, samples_per_s: float) -> bool:
        self.progress_calls.append((index, samples_per_s))
        return self.stop_at is None or index < self.stop_at


def slow_batches(n: int, sleep_s: float, batch: int = 8, *, sleep=time.sleep):
    """``n`` batches, each made in ``sleep_s`` (of ``sleep``: a fake clock's, or real time)."""
    for _ in range(n):
        sleep(sleep_s)
        yield torch.zeros(batch, 3)


def run_loop(meter: Meter, iterable, step_s: float = 0.0) -> Measurement:
    """Epochs of ``iterable`` until the window ends; each step takes ``step_s`` of the meter's
    (fake) clock."""
    while not meter.done:
        got = 0
        for _ in meter.wrap(iterable):
            got += 1
            if step_s:
                meter.clock.sleep(step_s)  # type: ignore[attr-defined]
        if got == 0:
            break
    return meter.result() if meter.done else meter.finish_now()


def test_structure_count_finds_the_leading_dimension() -> None:
    assert structure_count(torch.zeros(5, 3)) == 5
    assert structure_count([torch.zeros(7, 2), torch.zeros(7)]) == 7
    assert structure_count({"x": torch.zeros(4, 2), "y": torch.zeros(4)}) == 4
    assert structure_count(["a", "b", "c"]) == 3  # a list of plain samples counts its length


@dataclasses.dataclass
class _Batch:
    step: int  # no leading dimension: the next field counts
    x: torch.Tensor
    y: torch.Tensor


class _Attrs:
    def __init__(self) -> None:
        self.names = "abc"
        self.x = torch.zeros(6, 2)


class _Sized:
    __slots__ = ()

    def __len__(self) -> int:
        return 9


def test_structure_count_reads_a_custom_collates_object() -> None:
    """A custom collate's dataclass or object counts by its first attribute with a leading
    dimension, else by its len(); it was counted 1 sample a batch."""
    assert structure_count(_Batch(3, torch.zeros(5, 2), torch.zeros(5))) == 5
    assert structure_count(_Attrs()) == 6
    assert structure_count(_Sized()) == 9
    assert structure_count(7) == 1 and structure_count(torch.tensor(1.0)) == 1


def test_fixed_count_gives_the_short_last_batch() -> None:
    count = FixedCount(32, epoch_samples=100)
    assert [count(None, i) for i in range(4)] == [32, 32, 32, 4]
    assert count(None, 4) == 32  # past the epoch: a new epoch's first batch
    assert FixedCount(32, epoch_samples=100, drop_last=True)(None, 3) == 32


def test_phases_and_counts() -> None:
    """The first batch, 3 warm-up batches, then a window of two 0.1-s sub-windows of 3-ms
    batches, each ended by the first ``next()`` past its end (34 batches, 0.102 s)."""
    clock = FakeClock()
    rec = Recorder()
    meter = Meter(
        WindowSpec(warmup_batches=3, window_s=0.2, n_sub_windows=2),
        sink=rec,
        count=FixedCount(8),
        clock=clock,
    )
    m = run_loop(meter, slow_batches(10_000, 0.003, sleep=clock.sleep))
    assert rec.events == ["first_batch", "window_start", "window_end"]
    assert m.complete and not m.stopped_early
    assert m.first_batch_s == pytest.approx(0.003)
    assert m.warmup_s == pytest.approx(3 * 0.003)
    assert (m.n_batches, m.n_samples) == (68, 8 * 68)
    assert m.window_s == pytest.approx(68 * 0.003)
    assert m.sub_window_samples_per_s == pytest.approx([8 / 0.003] * 2)
    assert m.samples_per_s == pytest.approx(8 / 0.003)
    assert m.blocked_fraction == pytest.approx(1.0)  # no step: the loop only waits


def test_blocked_fraction_separates_loading_from_the_step() -> None:
    """Loading 6 ms and a 2 ms step: blocked 3/4 of the window, the step 2 ms a batch."""
    clock = FakeClock()
    meter = Meter(WindowSpec(warmup_batches=1, window_s=0.3), count=FixedCount(8), clock=clock)
    m = run_loop(meter, slow_batches(10_000, 0.006, sleep=clock.sleep), step_s=0.002)
    assert m.blocked_fraction == pytest.approx(0.75)
    assert m.step_s_per_batch == pytest.approx(0.002)
    assert m.samples_per_s == pytest.approx(8 / 0.008)


def test_warmup_batches_are_not_measured() -> None:
    """The first batches are instant (a full prefetch buffer); the window must not see them."""
    clock = FakeClock()

    def batches():
        for i in range(10_000):
            if i >= 5:
                clock.sleep(0.004)
            yield torch.zeros(8, 1)

    meter = Meter(WindowSpec(warmup_batches=5, window_s=0.2), count=FixedCount(8), clock=clock)
    m = run_loop(meter, batches())
    assert m.window_s / m.n_batches == pytest.approx(0.004)  # no instant batch inside the window
    assert m.samples_per_s == pytest.approx(8 / 0.004)
    assert m.warmup_s == pytest.approx(0.004)  # 4 instant warm-up batches and one of 4 ms


def test_cpu_share_of_loading() -> None:
    """Sleeping loaders use little CPU; measure_cpu tells it. Real time: the CPU time inside
    ``next()`` is the thread's own, as the kernel counts it."""
    meter = Meter(WindowSpec(warmup_batches=1, window_s=0.05), measure_cpu=True)
    m = run_loop(meter, slow_batches(10_000, 0.004))
    assert m.blocked_cpu_fraction is not None
    assert m.blocked_cpu_fraction < 0.5


def _spin(seconds: float) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        pass


def computed_batches(n: int, cpu_s: float, batch: int = 8):
    for _ in range(n):
        _spin(cpu_s)
        yield torch.zeros(batch, 3)


def test_loading_that_computes_reads_busy_while_other_processes_hold_the_cpus() -> None:
    """With more busy processes than CPUs, loading that computes gets part of a CPU: its CPU
    time alone reads like loading that waits on I/O (half of it on a 2-CPU machine), its
    run-queue wait makes up the rest. A loader that sleeps stays low either way. Real time:
    the kernel's CPU time and run-queue wait of this thread."""
    import multiprocessing

    hogs = [
        multiprocessing.get_context("fork").Process(target=_spin, args=(3.0,), daemon=True)
        for _ in range(len(os.sched_getaffinity(0)) + 1)
    ]
    for hog in hogs:
        hog.start()
    try:
        time.sleep(0.1)  # the hogs are running
        busy = Meter(WindowSpec(warmup_batches=1, window_s=0.5), measure_cpu=True)
        computing = run_loop(busy, computed_batches(10_000, 0.004))
        # sleeps of 40 ms: each wake-up's wait for a CPU the hogs hold (a few ms) stays a
        # small share of it (after sleeps of 4 ms it read 0.5-0.7 on a loaded machine)
        idle = Meter(WindowSpec(warmup_batches=1, window_s=0.3), measure_cpu=True)
        sleeping = run_loop(idle, slow_batches(10_000, 0.04))
    finally:
        for hog in hogs:
            hog.kill()
            hog.join()
    assert computing.blocked_wait_fraction is not None, "no schedstat on this machine"
    assert computing.blocked_busy_fraction is not None
    assert computing.blocked_busy_fraction >= 0.8, computing
    assert sleeping.blocked_busy_fraction is not None and sleeping.blocked_busy_fraction < 0.5


def test_gaps_between_epochs_are_excluded() -> None:
    """Time the loop spends between epochs (validation) is not part of the window: it holds
    the 4-ms steps of instant batches only."""
    clock = FakeClock()
    meter = Meter(WindowSpec(warmup_batches=1, window_s=0.3), count=FixedCount(8), clock=clock)
    t0 = clock()
    while not meter.done:
        for _ in meter.wrap(list(torch.zeros(6, 8, 1))):  # 6 batches per epoch, instant
            clock.sleep(0.004)
        clock.sleep(0.05)  # "validation"
    m = meter.result()
    assert m.window_s == pytest.approx(m.n_batches * 0.004)  # no gap in it
    assert m.samples_per_s == pytest.approx(8 / 0.004)
    gaps = len(m.rest_s)  # each validation inside the window, left out
    assert gaps >= 10 and m.rest_s == pytest.approx([0.05] * gaps)
    assert clock() - t0 > m.window_s + gaps * 0.05
    assert m.reentry_s == pytest.approx([0.0] * gaps)  # an instant list restarts instantly


def test_the_loops_time_between_epochs_is_recorded_as_rests() -> None:
    """Each time from an epoch's end to the next ``iter()`` (the script's validation) is a rest,
    whatever the phase: a whole epoch swapped in mid-epoch sees the rest before its epoch."""
    clock = FakeClock()
    meter = Meter(WindowSpec(warmup_batches=1, window_s=0.3), count=FixedCount(8), clock=clock)
    while not meter.done:
        for _ in meter.wrap(list(torch.zeros(6, 8, 1))):
            clock.sleep(0.004)
        clock.sleep(0.05)  # "validation"
    rests = meter.result().rest_s
    assert len(rests) >= 2 and rests == pytest.approx([0.05] * len(rests))
    whole = Meter(
        WindowSpec(warmup_batches=0, window_s=10.0, whole_epoch=True), mid_epoch=True, clock=clock
    )
    for n in (3, 7):
        for _ in whole.wrap(slow_batches(n, 0.002, sleep=clock.sleep)):
            pass
        clock.sleep(0.03)
    assert whole.done and whole.result().rest_s == pytest.approx([0.03])


def test_a_loop_that_stops_by_count_ends_its_epochs_at_their_last_step() -> None:
    """Lightning asks exactly ``len(loader)`` batches and calls ``iter()`` again, never meeting
    StopIteration: the epoch ends with the step on its last batch all the same. A whole-epoch
    window ends there (it used to run on to twice its expected time, over several epochs), and
    the time until the next epoch (validation) is a rest, left out of a window."""
    clock = FakeClock()
    whole = Meter(WindowSpec(warmup_batches=0, window_s=10.0, whole_epoch=True), clock=clock)
    epochs = 0
    for _epoch in range(3):
        it = whole.wrap(slow_batches(8, 0.002, sleep=clock.sleep))
        if whole.done:  # (the loop's loader goes on unmetered: MeteredEpoch, HotSwap)
            break
        epochs += 1
        for _ in range(8):  # by count: never asks past the last batch
            next(it)
            clock.sleep(0.01)
        clock.sleep(0.2)  # "validation"
    m = whole.result()
    assert epochs == 1  # one epoch and its validation, not two or three
    assert m.whole_epoch and m.complete and (m.n_batches, m.n_samples) == (8, 64)
    # 8 steps of 10 ms and 7 waits of 2 ms (the first batch's is its start-up), not the rest
    assert m.window_s == pytest.approx(8 * 0.01 + 7 * 0.002)
    assert m.first_batch_s == pytest.approx(0.002)
    window = Meter(WindowSpec(warmup_batches=1, window_s=0.3), count=FixedCount(8), clock=clock)
    while not window.done:
        for _, _batch in zip(range(6), window.wrap(list(torch.zeros(6, 8, 1))), strict=False):
            clock.sleep(0.004)
        clock.sleep(0.05)
    w = window.result()
    # each rest from the end of the epoch's last step (reckoned: the loop never asked again)
    assert len(w.rest_s) >= 2 and w.rest_s == pytest.approx([0.05] * len(w.rest_s))
    assert w.samples_per_s == pytest.approx(8 / 0.004)  # the rests are left out


def test_a_whole_epoch_window_knowing_the_epochs_batches_ends_at_the_last_one() -> None:
    """The last epoch of a loop that stops by count has no next ``iter()`` to end it: told
    the epoch's batches, the window ends with the last one's step (reckoned as long as the
    step before), and the loop still receives that batch."""
    clock = FakeClock()
    meter = Meter(
        WindowSpec(warmup_batches=0, window_s=10.0, whole_epoch=True), epoch_batches=8, clock=clock
    )
    it = meter.wrap(slow_batches(8, 0.002, sleep=clock.sleep))
    got = 0
    for _ in range(8):
        next(it)
        got += 1
        clock.sleep(0.01)
    assert got == 8 and meter.done
    m = meter.result()
    assert m.whole_epoch and m.complete and (m.n_batches, m.n_samples) == (8, 64)
    # 8 steps of 10 ms (the last one reckoned), 7 waits of 2 ms
    assert m.window_s == pytest.approx(8 * 0.01 + 7 * 0.002)
    # GPU work still queued when the last batch comes is waited for (a sync point), then the
    # last step is reckoned on top: here a sync that takes 50 ms stands for it (the one at the
    # window's opening stays outside it)
    synced = Meter(
        WindowSpec(warmup_batches=0, window_s=10.0, whole_epoch=True),
        epoch_batches=8,
        sync=lambda: clock.sleep(0.05),
        clock=clock,
    )
    got = 0
    for _ in synced.wrap(slow_batches(8, 0.002, sleep=clock.sleep)):
        got += 1
        clock.sleep(0.01)
        if synced.done:
            break
    assert got == 8 and synced.done
    assert synced.result().window_s == pytest.approx(8 * 0.01 + 7 * 0.002 + 0.05)
    window = Meter(WindowSpec(warmup_batches=2, window_s=10.0), epoch_batches=8, clock=clock)
    for _ in window.wrap(slow_batches(8, 0.001, sleep=clock.sleep)):
        pass
    assert not window.done  # a window that is not an epoch does not end with one


class _Restarting:
    """An epoch of 6 instant batches whose first batch waits ``start_s`` (workers restarting)."""

    def __init__(self, clock: FakeClock, start_s: float) -> None:
        self.clock, self.start_s = clock, start_s

    def __iter__(self):
        self.clock.sleep(self.start_s)
        yield from list(torch.zeros(6, 8, 1))


def test_a_new_epoch_s_start_up_inside_the_window_counts_once_as_its_start_up() -> None:
    """Non-persistent workers restart at each epoch: that wait is the epoch's start-up
    (``reentry_s``, added once per epoch to the epoch rate), not part of the steady rate, or a
    window that holds an epoch's end would count it twice."""
    clock = FakeClock()
    meter = Meter(WindowSpec(warmup_batches=1, window_s=0.3), count=FixedCount(8), clock=clock)
    loader = _Restarting(clock, 0.1)
    while not meter.done:
        for _ in meter.wrap(loader):
            clock.sleep(0.005)
    m = meter.result()
    assert len(m.reentry_s) >= 2 and m.reentry_s == pytest.approx([0.1] * len(m.reentry_s))
    # 8 samples per 5 ms step, the restarts left out (with them: 8 / 0.0217 = 369/s)
    assert m.samples_per_s == pytest.approx(8 / 0.005)
    assert m.blocked_fraction == pytest.approx(0.0)


def test_progress_can_stop_a_window_early() -> None:
    """Stopped at the second of four 0.25-s sub-windows (each ended by the first 3-ms batch
    past its end): half the window."""
    clock = FakeClock()
    rec = Recorder(stop_at=1)
    meter = Meter(
        WindowSpec(warmup_batches=1, window_s=1.0, n_sub_windows=4), sink=rec, clock=clock
    )
    m = run_loop(meter, slow_batches(10_000, 0.003, sleep=clock.sleep))
    assert m.stopped_early and not m.complete
    assert [i for i, _ in rec.progress_calls] == [0, 1]
    assert [rate for _, rate in rec.progress_calls] == pytest.approx([8 / 0.003] * 2)
    assert m.n_batches == 2 * 84 and m.window_s == pytest.approx(2 * 84 * 0.003)


def test_finish_now_gives_a_partial_result_when_data_runs_out() -> None:
    clock = FakeClock()
    meter = Meter(WindowSpec(warmup_batches=2, window_s=10.0), clock=clock)
    for _ in meter.wrap(slow_batches(8, 0.002, sleep=clock.sleep)):
        pass
    clock.sleep(1.0)  # the loop ran out of data: the window ended with the epoch
    m = meter.finish_now()
    assert m is not None and not m.complete and m.low_confidence
    assert m.n_batches == 5  # 8 batches: first, 2 warm-up, then 5 in the window
    assert m.window_s == pytest.approx(5 * 0.002)
    assert Meter(WindowSpec(1, 1.0)).finish_now() is None  # never opened


def test_failed_in_next_tells_loader_errors_from_step_errors() -> None:
    def broken():
        yield torch.zeros(2)
        raise RuntimeError("DataLoader worker (pid 1) is killed by signal: Killed.")

    meter = Meter(WindowSpec(0, 1.0))
    with pytest.raises(RuntimeError, match="killed by signal"):
        for _ in meter.wrap(broken()):
            pass
    assert meter.failed_in_next

    meter = Meter(WindowSpec(0, 1.0), clock=FakeClock())
    with pytest.raises(ValueError, match="step bug"):
        for _ in meter.wrap(slow_batches(5, 0.0, sleep=meter.clock.sleep)):  # type: ignore[attr-defined]
            raise ValueError("step bug")
    assert not meter.failed_in_next


def test_iterating_before_wrap_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="wrap"):
        next(Meter(WindowSpec(0, 1.0)))


def test_hot_path_and_general_path_count_the_same() -> None:
    """Epochs of 100 samples at batch 32 (a short batch of 4 each epoch), measured fast and slow."""

    def epochs() -> list[torch.Tensor]:
        return [torch.zeros(32 if i < 3 else 4, 1) for i in range(4)]

    def measure(count) -> Measurement:  # type: ignore[no-untyped-def]
        clock = FakeClock()
        meter = Meter(WindowSpec(warmup_batches=0, window_s=0.2), count=count, clock=clock)
        while not meter.done:
            for _ in meter.wrap(epochs()):
                clock.sleep(0.0006)
        return meter.result()

    fast = measure(FixedCount(32, epoch_samples=100))
    general = measure(lambda batch, index: structure_count(batch))
    sizes = [32, 32, 32, 4]  # an epoch's batches; the window opens at the first one's step
    for m in (fast, general):
        assert m.n_samples == sum(sizes[(1 + i) % 4] for i in range(m.n_batches))
    assert fast.n_batches == general.n_batches > 100


@pytest.mark.parametrize(
    ("elapsed", "batches", "full"),
    [
        (0.5, 10, False),  # not yet window_s
        (1.0, 3, False),  # window_s, but fewer than min_window_batches of fast batches
        (1.0, 4, True),
        (2.0, 1, True),  # twice window_s: a few slow batches are enough
        (1.99, 1, False),
    ],
)
def test_a_window_of_slow_batches_ends_after_twice_its_length(
    elapsed: float, batches: int, full: bool
) -> None:
    assert WindowSpec(warmup_batches=0, window_s=1.0).is_full(elapsed, batches) is full


def test_a_loop_of_slow_batches_is_measured_in_a_few_of_them() -> None:
    """Batches of 0.15 s and a 0.05 s window: the window ends after 0.1 s, not at 4 batches."""
    clock = FakeClock()
    meter = Meter(WindowSpec(warmup_batches=0, window_s=0.05), count=FixedCount(8), clock=clock)
    m = run_loop(meter, slow_batches(10_000, 0.15, sleep=clock.sleep))
    assert m.complete
    assert m.n_batches == 1 and m.window_s == pytest.approx(0.15)


class Counted:
    """Batches whose ``next()`` waits ``gap_s`` every ``every`` batches (a burst after each gap,
    as workers in step deliver), counting what was handed out when the window opened."""

    def __init__(self, sink: Recorder, clock: FakeClock, *, gap_s: float, every: int) -> None:
        self.sink, self.clock, self.gap_s, self.every = sink, clock, gap_s, every
        self.given = 0
        self.before_window: int | None = None

    def __iter__(self):
        while True:
            if self.before_window is None and "window_start" in self.sink.events:
                self.before_window = self.given
            if self.given % self.every == 0:
                self.clock.sleep(self.gap_s)
            self.given += 1
            yield torch.zeros(8, 3)


def test_the_warm_up_ends_at_the_first_wait_once_every_worker_has_delivered() -> None:
    """An empty buffer (a next() that waits) after ``settled_after`` batches ends the warm-up:
    draining by count would wait for batches that are not there."""
    clock, rec = FakeClock(), Recorder()
    spec = WindowSpec(warmup_batches=20, window_s=0.05, settled_after=4)
    # every next() waits: the loader sets the pace
    batches = Counted(rec, clock, gap_s=0.02, every=1)
    run_loop(Meter(spec, sink=rec, count=FixedCount(8), clock=clock), batches)
    assert batches.before_window == 1 + 4  # the first batch, then four warm-up batches


def test_a_full_buffer_is_drained_by_count() -> None:
    clock, rec = FakeClock(), Recorder()
    spec = WindowSpec(warmup_batches=20, window_s=0.05, settled_after=4)
    batches = Counted(rec, clock, gap_s=0.0, every=1)  # never waits: the buffer stays full
    # the loop's step, so that the window ends
    run_loop(Meter(spec, sink=rec, count=FixedCount(8), clock=clock), batches, step_s=0.001)
    assert batches.before_window == 1 + 20


def test_a_window_holds_whole_rounds_of_the_workers() -> None:
    """Five workers in step: a wait, then a burst of five. Each sub-window (and so the window)
    ends after whole rounds, however short its time."""
    clock, rec = FakeClock(), Recorder()
    spec = WindowSpec(
        warmup_batches=4, window_s=0.015, min_window_batches=7, n_sub_windows=2, round_batches=5
    )
    batches = Counted(rec, clock, gap_s=0.02, every=5)
    m = run_loop(Meter(spec, sink=rec, count=FixedCount(8), clock=clock), batches)
    assert m.n_batches == 10  # two rounds: the first sub-window's round is not enough
    assert len(m.sub_window_samples_per_s) == 2


def test_a_whole_epoch_window_holds_the_epoch_from_its_first_batch_to_its_end() -> None:
    """No warm-up: the first batch's step (the slowest, while the workers fill their buffer) and
    the epoch's last batches (the buffer draining) are the epoch's, so the window holds them."""
    clock, rec = FakeClock(), Recorder()
    meter = Meter(
        WindowSpec(warmup_batches=0, window_s=10.0, whole_epoch=True), sink=rec, clock=clock
    )
    steps = iter([0.05] + [0.0] * 9)  # the first step is slow
    t0 = clock()
    for _ in meter.wrap(slow_batches(10, 0.002, sleep=clock.sleep)):
        clock.sleep(next(steps))
    elapsed = clock() - t0
    assert meter.done
    m = meter.result()
    assert m.complete and m.whole_epoch
    assert (m.n_batches, m.n_samples) == (10, 80)
    # iter() to the epoch's end, less the first batch's wait: the slow first step is inside
    assert m.first_batch_s == pytest.approx(0.002)
    assert m.first_batch_s + m.window_s == pytest.approx(elapsed)
    assert m.window_s == pytest.approx(0.05 + 9 * 0.002)
    assert rec.events[:2] == ["first_batch", "window_start"] and rec.events[-1] == "window_end"


def test_a_whole_epoch_window_begun_mid_epoch_measures_the_next_epoch() -> None:
    """A setting swapped in mid-epoch lets that epoch run out, then measures the next one
    whole; the next epoch's start-up (its first batch's wait) is recorded as a re-entry."""
    clock = FakeClock()
    meter = Meter(
        WindowSpec(warmup_batches=0, window_s=10.0, whole_epoch=True), mid_epoch=True, clock=clock
    )
    got = [sum(1 for _ in meter.wrap(slow_batches(n, 0.002, sleep=clock.sleep))) for n in (3, 7)]
    assert got == [3, 7] and meter.done
    m = meter.result()
    assert m.whole_epoch and (m.n_batches, m.n_samples) == (7, 56)
    assert m.reentry_s == pytest.approx([0.002])
    assert m.window_s == pytest.approx(6 * 0.002)  # the epoch less its first batch's wait


def test_a_whole_epoch_window_of_persistent_workers_measures_their_second_epoch() -> None:
    """Persistent workers' first epoch waits for their start, once: the whole-epoch window is the
    next, whose start (a re-entry, timed) is every later epoch's. Opened on the first, a 6-batch
    epoch whose first wait held the making of most of its batches read 9,921 samples/s, and no
    re-entry was known to charge it with; the script made 2,100."""
    clock = FakeClock()
    spec = WindowSpec(warmup_batches=0, window_s=10.0, whole_epoch=True)
    meter = Meter(spec, persistent=True, clock=clock)
    got = [sum(1 for _ in meter.wrap(slow_batches(6, 0.002, sleep=clock.sleep))) for _ in range(2)]
    assert got == [6, 6] and meter.done
    m = meter.result()
    assert m.whole_epoch and (m.n_batches, m.n_samples) == (6, 48)
    assert m.reentry_s == pytest.approx([0.002])
    first = Meter(spec, clock=clock)
    assert sum(1 for _ in first.wrap(slow_batches(6, 0.002, sleep=clock.sleep))) == 6
    assert first.done
    assert not first.result().reentry_s  # not persistent: the first epoch is any epoch


def _epochs_until_done(meter: Meter, lengths: list[int], *, by_count: bool = False) -> list[int]:
    """The batches the loop received in each epoch of ``lengths`` until the meter was done:
    batches of 2 ms, steps of 3 ms and a 30 ms "validation" after each epoch, on the meter's
    fake clock. ``by_count``: the loop asks exactly the epoch's batches (Lightning) and never
    meets StopIteration."""
    clock: FakeClock = meter.clock  # type: ignore[assignment]
    got = []
    for n in lengths:
        if meter.done:
            break
        it = meter.wrap(slow_batches(n, 0.002, sleep=clock.sleep))
        k = 0
        for _ in range(n) if by_count else itertools.count():
            try:
                next(it)
            except StopIteration:
                break
            k += 1
            clock.sleep(0.003)
            if by_count and meter.done:
                break
        got.append(k)
        clock.sleep(0.03)
    return got


@pytest.mark.parametrize("by_count", [False, True])
def test_a_whole_epoch_window_begun_mid_epoch_runs_an_epoch_s_batches_across_its_end(
    by_count: bool,
) -> None:
    """Knowing an epoch's batches, a setting swapped in mid-epoch does not wait for the next
    epoch: after its warm-up (a round and a batch) its window holds as many batches as an epoch,
    across the epoch's end (its tail, the next one's start-up and first round: each once, as
    in a whole epoch). The loop's time between the epochs is left out, the next epoch's
    start-up recorded as a re-entry."""
    meter = Meter(
        WindowSpec(warmup_batches=0, window_s=10.0, whole_epoch=True),
        mid_epoch=True,
        epoch_batches=20,
        clock=FakeClock(),
    )
    got = _epochs_until_done(meter, [12, 20, 20], by_count=by_count)
    m = meter.result()
    # the first batch and 2 of warm-up, 9 in the window; then 11 of the next, the last one
    # received
    assert got == [12, 11]
    assert m.whole_epoch and m.complete and (m.n_batches, m.n_samples) == (20, 160)
    assert m.reentry_s == pytest.approx([0.002]) and m.rest_s == pytest.approx([0.03])
    # 20 steps of 3 ms and 19 waits of 2 ms (the next epoch's first one is its start-up): the
    # validation is not in it
    assert m.window_s == pytest.approx(20 * 0.003 + 19 * 0.002)


def test_persistent_workers_whole_epoch_runs_across_their_first_epoch_s_end() -> None:
    """Persistent workers' first epoch holds their start-up, paid once: the window opens after
    the warm-up and runs an epoch's batches into the second, whose start is a re-entry. A short
    epoch does too, where its warm-up is shorter than it: a warm-up and an epoch cost fewer
    batches than an epoch waited out and an epoch (the rule was to wait in an epoch under four
    warm-ups, as this one)."""
    spec = WindowSpec(warmup_batches=0, window_s=10.0, whole_epoch=True, round_batches=2)
    meter = Meter(spec, persistent=True, epoch_batches=24, clock=FakeClock())
    # the first batch and a warm-up of 3, then 20 in the window and 4 of the next epoch
    assert _epochs_until_done(meter, [24, 24, 24]) == [24, 4]
    m = meter.result()
    assert m.whole_epoch and m.n_batches == 24 and len(m.reentry_s) == 1
    short = Meter(spec, persistent=True, epoch_batches=11, clock=FakeClock())
    assert _epochs_until_done(short, [11, 11, 11]) == [11, 4]
    assert short.result().n_batches == 11 and len(short.result().reentry_s) == 1


@pytest.mark.parametrize(
    ("epoch_batches", "epoch_left", "got"),
    [
        (3, None, [3, 3]),  # persistent, at the start: an epoch no longer than the warm-up
        (20, 3, [3, 20]),  # swapped in 3 batches before the end: the rest is the warm-up
        (20, 12, [12, 12]),  # 12 before it: the first batch, a warm-up of 3, 8 and 12 of the next
    ],
)
def test_a_whole_epoch_window_waits_for_the_next_epoch_only_where_that_costs_less(
    epoch_batches: int, epoch_left: int | None, got: list[int]
) -> None:
    """Waiting for the next epoch costs the rest of the epoch under way, running across its end
    a warm-up (a round and a batch): the window does whichever is fewer batches, and holds an
    epoch's batches either way."""
    meter = Meter(
        WindowSpec(warmup_batches=0, window_s=10.0, whole_epoch=True, round_batches=2),
        persistent=True,
        mid_epoch=epoch_left is not None,
        epoch_batches=epoch_batches,
        epoch_left=epoch_left,
        clock=FakeClock(),
    )
    lengths = [epoch_left or epoch_batches, epoch_batches, epoch_batches]
    assert _epochs_until_done(meter, lengths) == got
    m = meter.result()
    assert m.whole_epoch and m.n_batches == epoch_batches


def test_a_whole_epoch_window_that_outlasts_twice_its_expected_time_ends_as_a_window() -> None:
    """Batches of 15 ms: the first sub-window boundary at or past 0.1 s ends it (0.105 s)."""
    clock = FakeClock()
    meter = Meter(WindowSpec(warmup_batches=0, window_s=0.05, whole_epoch=True), clock=clock)
    n = sum(1 for _ in meter.wrap(slow_batches(1000, 0.015, sleep=clock.sleep)))
    m = meter.result()
    assert n == 8 and m.complete and not m.whole_epoch
    assert m.n_batches == 8 and m.window_s == pytest.approx(7 * 0.015)


def test_a_whole_epoch_window_takes_no_warm_up() -> None:
    with pytest.raises(ValueError):
        WindowSpec(warmup_batches=2, window_s=1.0, whole_epoch=True)


def test_another_loaders_pass_after_a_break_is_left_out_of_the_window_once() -> None:
    """A loop breaks out of the measured loader's epoch (a sanity pass of two batches), runs a
    whole pass of another loader (a training epoch), then iterates the measured loader again.
    The pass was left out once as another loader's and once more as the rest up to the next
    ``iter()``: a live run's window measured -1.61 s and its setting was recorded as failed."""
    from loadertune.measure.meter import elsewhere

    clock = FakeClock()
    meter = Meter(WindowSpec(warmup_batches=1, window_s=0.2), count=FixedCount(8), clock=clock)
    for i, _ in enumerate(meter.wrap(slow_batches(50, 0.002, sleep=clock.sleep))):
        if i >= 3:
            break  # inside the window: the sanity pass is over
        clock.sleep(0.004)
    for _ in elsewhere(slow_batches(10, 0.01, sleep=clock.sleep), meter, 10):
        pass  # the other loader's pass, 0.1 s
    while not meter.done:
        got = 0
        for _ in meter.wrap(slow_batches(50, 0.002, sleep=clock.sleep)):
            got += 1
            clock.sleep(0.004)
        assert got
    m = meter.result()
    # each batch's 2-ms wait and 4-ms step, less the step the loop broke out before and the
    # next epoch's start-up: the 0.1-s pass is left out once (twice, the window measured
    # -1.61 s; kept, it would be 0.1 s longer)
    assert m.window_s == pytest.approx(m.n_batches * 0.006 - 0.004 - 0.002)
    assert m.reentry_s == pytest.approx([0.002])


@pytest.mark.parametrize("whole_epoch", [False, True])
def test_another_loaders_pass_inside_the_epoch_is_left_out_of_the_window(whole_epoch: bool) -> None:
    """A validation every 10 steps of the training epoch (Lightning's val_check_interval), each
    0.3 s, far longer than the steps between: each whole pass is left out of the window, a timed
    one or a whole epoch's, which holds the training's 2-ms waits and 3-ms steps only. Kept in,
    a script's window measured a fifth of its rate (tests/test_script.py runs one)."""
    from loadertune.measure.meter import elsewhere

    clock = FakeClock()
    if whole_epoch:
        spec = WindowSpec(warmup_batches=0, window_s=10.0, whole_epoch=True)
    else:
        spec = WindowSpec(warmup_batches=1, window_s=0.2)
    meter = Meter(spec, count=FixedCount(8), clock=clock)
    passes = 0
    for step, _ in enumerate(meter.wrap(slow_batches(60, 0.002, sleep=clock.sleep))):
        clock.sleep(0.003)
        if step % 10 == 9:
            for _ in elsewhere(slow_batches(30, 0.01, sleep=clock.sleep), meter, 30):
                pass
            passes += meter.done is False
    assert meter.done
    m = meter.result()
    assert m.whole_epoch is whole_epoch and m.complete
    if whole_epoch:  # 60 steps and 59 waits (the first batch's is its start-up), 6 passes out
        assert (m.n_batches, passes) == (60, 6)
        assert m.window_s == pytest.approx(60 * 0.003 + 59 * 0.002)
    else:
        assert passes >= 3
        assert m.window_s == pytest.approx(m.n_batches * 0.005)
        assert m.samples_per_s == pytest.approx(8 / 0.005)
