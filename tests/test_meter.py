"""The meter: phases, sample counting, blocked time, epoch gaps, early stop."""

from __future__ import annotations

import dataclasses
import itertools
import os
import time

import pytest
import torch

from loadertune.measure.counting import FixedCount, structure_count
from loadertune.measure.meter import Measurement, Meter, WindowSpec


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


def slow_batches(n: int, sleep_s: float, batch: int = 8):
    for _ in range(n):
        time.sleep(sleep_s)
        yield torch.zeros(batch, 3)


def run_loop(meter: Meter, iterable, step_s: float = 0.0) -> Measurement:
    while not meter.done:
        got = 0
        for _ in meter.wrap(iterable):
            got += 1
            if step_s:
                time.sleep(step_s)
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
    rec = Recorder()
    meter = Meter(
        WindowSpec(warmup_batches=3, window_s=0.2, n_sub_windows=2), sink=rec, count=FixedCount(8)
    )
    m = run_loop(meter, slow_batches(10_000, 0.002))
    assert rec.events[:2] == ["first_batch", "window_start"]
    assert rec.events[-1] == "window_end"
    assert m.complete and not m.stopped_early
    assert m.n_samples == 8 * m.n_batches
    assert m.window_s >= 0.2
    assert len(m.sub_window_samples_per_s) == 2
    assert m.samples_per_s == pytest.approx(m.n_samples / m.window_s)


def test_blocked_fraction_separates_loading_from_the_step() -> None:
    """Loading 6 ms and a 2 ms step: blocked about 3/4; the exact value varies on a busy box."""
    meter = Meter(WindowSpec(warmup_batches=1, window_s=0.3), count=FixedCount(8))
    m = run_loop(meter, slow_batches(10_000, 0.006), step_s=0.002)
    assert 0.55 < m.blocked_fraction < 0.95
    assert m.step_s_per_batch > 0.001


def test_warmup_batches_are_not_measured() -> None:
    """The first batches are instant (a full prefetch buffer); the window must not see them."""

    def batches():
        for i in range(10_000):
            if i >= 5:
                time.sleep(0.004)
            yield torch.zeros(8, 1)

    meter = Meter(WindowSpec(warmup_batches=5, window_s=0.2), count=FixedCount(8))
    m = run_loop(meter, batches())
    per_batch = m.window_s / m.n_batches
    assert per_batch > 0.003  # no instant batch inside the window


def test_cpu_share_of_loading() -> None:
    """Sleeping loaders use little CPU; measure_cpu tells it."""
    meter = Meter(WindowSpec(warmup_batches=1, window_s=0.2), measure_cpu=True)
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
    run-queue wait makes up the rest. A loader that sleeps stays low either way."""
    import multiprocessing

    hogs = [
        multiprocessing.get_context("fork").Process(target=_spin, args=(6.0,), daemon=True)
        for _ in range(len(os.sched_getaffinity(0)) + 1)
    ]
    for hog in hogs:
        hog.start()
    try:
        time.sleep(0.2)
        busy = Meter(WindowSpec(warmup_batches=1, window_s=1.0), measure_cpu=True)
        computing = run_loop(busy, computed_batches(10_000, 0.004))
        idle = Meter(WindowSpec(warmup_batches=1, window_s=0.5), measure_cpu=True)
        sleeping = run_loop(idle, slow_batches(10_000, 0.004))
    finally:
        for hog in hogs:
            hog.kill()
            hog.join()
    assert computing.blocked_wait_fraction is not None, "no schedstat on this machine"
    assert computing.blocked_busy_fraction is not None
    assert computing.blocked_busy_fraction >= 0.8, computing
    assert sleeping.blocked_busy_fraction is not None and sleeping.blocked_busy_fraction < 0.5


def test_gaps_between_epochs_are_excluded() -> None:
    """Time the loop spends between epochs (validation) is not part of the window."""
    meter = Meter(WindowSpec(warmup_batches=1, window_s=0.3), count=FixedCount(8))
    t0 = time.perf_counter()
    while not meter.done:
        for _ in meter.wrap(list(torch.zeros(6, 8, 1))):  # 6 batches per epoch, instant
            time.sleep(0.004)
        time.sleep(0.05)  # "validation"
    m = meter.result()
    wall = time.perf_counter() - t0
    assert m.window_s < wall - 0.1  # several 50 ms gaps were left out
    assert m.samples_per_s > 8 / 0.006  # about 8 samples per 4 ms step, gaps excluded
    assert len(m.reentry_s) >= 1


def test_the_loops_time_between_epochs_is_recorded_as_rests() -> None:
    """Each time from an epoch's end to the next ``iter()`` (the script's validation) is a rest,
    whatever the phase: a whole epoch swapped in mid-epoch sees the rest before its epoch."""
    meter = Meter(WindowSpec(warmup_batches=1, window_s=0.3), count=FixedCount(8))
    while not meter.done:
        for _ in meter.wrap(list(torch.zeros(6, 8, 1))):
            time.sleep(0.004)
        time.sleep(0.05)  # "validation"
    rests = meter.result().rest_s
    assert len(rests) >= 2 and all(0.045 <= r < 0.5 for r in rests)
    whole = Meter(WindowSpec(warmup_batches=0, window_s=10.0, whole_epoch=True), mid_epoch=True)
    for n in (3, 7):
        for _ in whole.wrap(slow_batches(n, 0.002)):
            pass
        time.sleep(0.03)
    assert whole.done and len(whole.result().rest_s) == 1 and whole.result().rest_s[0] >= 0.025


def test_a_loop_that_stops_by_count_ends_its_epochs_at_their_last_step() -> None:
    """Lightning asks exactly ``len(loader)`` batches and calls ``iter()`` again, never meeting
    StopIteration: the epoch ends with the step on its last batch all the same. A whole-epoch
    window ends there (it used to run on to twice its expected time, over several epochs), and
    the time until the next epoch (validation) is a rest, left out of a window."""
    whole = Meter(WindowSpec(warmup_batches=0, window_s=10.0, whole_epoch=True))
    t0 = time.perf_counter()
    for _epoch in range(3):
        it = whole.wrap(slow_batches(8, 0.002))
        if whole.done:  # (the loop's loader goes on unmetered: MeteredEpoch, HotSwap)
            break
        for _ in range(8):  # by count: never asks past the last batch
            next(it)
            time.sleep(0.01)
        time.sleep(0.2)  # "validation"
    m = whole.result()
    assert time.perf_counter() - t0 < 0.6  # one epoch and its validation, not two or three
    assert m.whole_epoch and m.complete and (m.n_batches, m.n_samples) == (8, 64)
    # 8 steps of 10 ms and 7 waits of 2 ms (the first batch's is its start-up), not the rest
    assert 0.09 <= m.window_s < 0.15
    window = Meter(WindowSpec(warmup_batches=1, window_s=0.3), count=FixedCount(8))
    while not window.done:
        for _, _batch in zip(range(6), window.wrap(list(torch.zeros(6, 8, 1))), strict=False):
            time.sleep(0.004)
        time.sleep(0.05)
    w = window.result()
    assert len(w.rest_s) >= 2 and all(0.045 <= r < 0.2 for r in w.rest_s)
    assert w.samples_per_s > 8 / 0.006  # the rests are left out


def test_a_whole_epoch_window_knowing_the_epochs_batches_ends_at_the_last_one() -> None:
    """The last epoch of a loop that stops by count has no next ``iter()`` to end it: told
    the epoch's batches, the window ends with the last one's step (reckoned as long as the
    step before), and the loop still receives that batch."""
    meter = Meter(WindowSpec(warmup_batches=0, window_s=10.0, whole_epoch=True), epoch_batches=8)
    it = meter.wrap(slow_batches(8, 0.002))
    got = 0
    for _ in range(8):
        next(it)
        got += 1
        time.sleep(0.01)
    assert got == 8 and meter.done
    m = meter.result()
    assert m.whole_epoch and m.complete and (m.n_batches, m.n_samples) == (8, 64)
    assert 0.09 <= m.window_s < 0.15  # 8 steps of 10 ms (the last one reckoned), 7 waits
    # GPU work still queued when the last batch comes is waited for (a sync point), then the
    # last step is reckoned on top: here a sync that takes 50 ms stands for it
    synced = Meter(
        WindowSpec(warmup_batches=0, window_s=10.0, whole_epoch=True),
        epoch_batches=8,
        sync=lambda: time.sleep(0.05),
    )
    for _ in synced.wrap(slow_batches(8, 0.002)):
        time.sleep(0.01)
        if synced.done:
            break
    assert synced.done and synced.result().window_s >= 0.09 + 0.05
    window = Meter(WindowSpec(warmup_batches=2, window_s=10.0), epoch_batches=8)
    for _ in window.wrap(slow_batches(8, 0.001)):
        pass
    assert not window.done  # a window that is not an epoch does not end with one


class _Restarting:
    """An epoch of 6 instant batches whose first batch waits ``start_s`` (workers restarting)."""

    def __init__(self, start_s: float) -> None:
        self.start_s = start_s

    def __iter__(self):
        time.sleep(self.start_s)
        yield from list(torch.zeros(6, 8, 1))


def test_a_new_epoch_s_start_up_inside_the_window_counts_once_as_its_start_up() -> None:
    """Non-persistent workers restart at each epoch: that wait is the epoch's start-up
    (``reentry_s``, added once per epoch to the epoch rate), not part of the steady rate, or a
    window that holds an epoch's end would count it twice."""
    meter = Meter(WindowSpec(warmup_batches=1, window_s=0.3), count=FixedCount(8))
    loader = _Restarting(0.1)
    while not meter.done:
        for _ in meter.wrap(loader):
            time.sleep(0.005)
    m = meter.result()
    assert len(m.reentry_s) >= 2 and min(m.reentry_s) >= 0.1
    # 8 samples per 5 ms step, the restarts left out (with them: below 8 / 0.0217 = 369/s)
    assert m.samples_per_s > 8 / 0.008
    assert m.blocked_fraction < 0.3


def test_progress_can_stop_a_window_early() -> None:
    rec = Recorder(stop_at=1)
    meter = Meter(WindowSpec(warmup_batches=1, window_s=1.0, n_sub_windows=4), sink=rec)
    m = run_loop(meter, slow_batches(10_000, 0.002))
    assert m.stopped_early and not m.complete
    assert [i for i, _ in rec.progress_calls] == [0, 1]
    assert m.window_s < 0.9


def test_finish_now_gives_a_partial_result_when_data_runs_out() -> None:
    meter = Meter(WindowSpec(warmup_batches=2, window_s=10.0))
    for _ in meter.wrap(slow_batches(8, 0.002)):
        pass
    m = meter.finish_now()
    assert m is not None and not m.complete and m.low_confidence
    assert m.n_batches == 5  # 8 batches: first, 2 warm-up, then 5 in the window
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

    meter = Meter(WindowSpec(0, 1.0))
    with pytest.raises(ValueError, match="step bug"):
        for _ in meter.wrap(slow_batches(5, 0.0)):
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
        meter = Meter(WindowSpec(warmup_batches=0, window_s=0.2), count=count)
        while not meter.done:
            for _ in meter.wrap(epochs()):
                time.sleep(0.0005)
        return meter.result()

    fast = measure(FixedCount(32, epoch_samples=100))
    general = measure(lambda batch, index: structure_count(batch))
    for m in (fast, general):
        assert m.n_samples / m.n_batches == pytest.approx(100 / 4, rel=0.1)


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
    """Batches of 0.15 s and a 0.05 s window: the window ends at 0.1 s, not at 4 batches."""
    meter = Meter(WindowSpec(warmup_batches=0, window_s=0.05), count=FixedCount(8))
    m = run_loop(meter, slow_batches(10_000, 0.15))
    assert m.complete
    assert m.n_batches == 1


class Counted:
    """Batches whose ``next()`` waits ``gap_s`` every ``every`` batches (a burst after each gap,
    as workers in step deliver), counting what was handed out when the window opened."""

    def __init__(self, sink: Recorder, *, gap_s: float, every: int) -> None:
        self.sink, self.gap_s, self.every = sink, gap_s, every
        self.given = 0
        self.before_window: int | None = None

    def __iter__(self):
        while True:
            if self.before_window is None and "window_start" in self.sink.events:
                self.before_window = self.given
            if self.given % self.every == 0:
                time.sleep(self.gap_s)
            self.given += 1
            yield torch.zeros(8, 3)


def test_the_warm_up_ends_at_the_first_wait_once_every_worker_has_delivered() -> None:
    """An empty buffer (a next() that waits) after ``settled_after`` batches ends the warm-up:
    draining by count would wait for batches that are not there."""
    rec = Recorder()
    spec = WindowSpec(warmup_batches=20, window_s=0.05, settled_after=4)
    batches = Counted(rec, gap_s=0.02, every=1)  # every next() waits: the loader sets the pace
    run_loop(Meter(spec, sink=rec, count=FixedCount(8)), batches)
    assert batches.before_window == 1 + 4  # the first batch, then four warm-up batches


def test_a_full_buffer_is_drained_by_count() -> None:
    rec = Recorder()
    spec = WindowSpec(warmup_batches=20, window_s=0.05, settled_after=4)
    batches = Counted(rec, gap_s=0.0, every=1)  # never waits: the buffer stays full
    run_loop(Meter(spec, sink=rec, count=FixedCount(8)), batches)
    assert batches.before_window == 1 + 20


def test_a_window_holds_whole_rounds_of_the_workers() -> None:
    """Five workers in step: a wait, then a burst of five. Each sub-window (and so the window)
    ends after whole rounds, however short its time."""
    rec = Recorder()
    spec = WindowSpec(
        warmup_batches=4, window_s=0.015, min_window_batches=7, n_sub_windows=2, round_batches=5
    )
    m = run_loop(Meter(spec, sink=rec, count=FixedCount(8)), Counted(rec, gap_s=0.02, every=5))
    assert m.n_batches == 10  # two rounds: the first sub-window's round is not enough
    assert len(m.sub_window_samples_per_s) == 2


def test_a_whole_epoch_window_holds_the_epoch_from_its_first_batch_to_its_end() -> None:
    """No warm-up: the first batch's step (the slowest, while the workers fill their buffer) and
    the epoch's last batches (the buffer draining) are the epoch's, so the window holds them."""
    rec = Recorder()
    meter = Meter(WindowSpec(warmup_batches=0, window_s=10.0, whole_epoch=True), sink=rec)
    steps = iter([0.05] + [0.0] * 9)  # the first step is slow
    t0 = time.perf_counter()
    for _ in meter.wrap(slow_batches(10, 0.002)):
        time.sleep(next(steps))
    elapsed = time.perf_counter() - t0
    assert meter.done
    m = meter.result()
    assert m.complete and m.whole_epoch
    assert (m.n_batches, m.n_samples) == (10, 80)
    # iter() to the epoch's end, less the first batch's wait: the slow first step is inside
    assert m.first_batch_s + m.window_s == pytest.approx(elapsed, abs=0.01)
    assert m.window_s >= 0.05
    assert rec.events[:2] == ["first_batch", "window_start"] and rec.events[-1] == "window_end"


def test_a_whole_epoch_window_begun_mid_epoch_measures_the_next_epoch() -> None:
    """A setting swapped in mid-epoch lets that epoch run out, then measures the next one
    whole; the next epoch's start-up (its first batch's wait) is recorded as a re-entry."""
    meter = Meter(WindowSpec(warmup_batches=0, window_s=10.0, whole_epoch=True), mid_epoch=True)
    got = [sum(1 for _ in meter.wrap(slow_batches(n, 0.002))) for n in (3, 7)]
    assert got == [3, 7] and meter.done
    m = meter.result()
    assert m.whole_epoch and (m.n_batches, m.n_samples) == (7, 56)
    assert len(m.reentry_s) == 1


def test_a_whole_epoch_window_of_persistent_workers_measures_their_second_epoch() -> None:
    """Persistent workers' first epoch waits for their start, once: the whole-epoch window is the
    next, whose start (a re-entry, timed) is every later epoch's. Opened on the first, a 6-batch
    epoch whose first wait held the making of most of its batches read 9,921 samples/s, and no
    re-entry was known to charge it with; the script made 2,100."""
    meter = Meter(WindowSpec(warmup_batches=0, window_s=10.0, whole_epoch=True), persistent=True)
    got = [sum(1 for _ in meter.wrap(slow_batches(6, 0.002))) for _ in range(2)]
    assert got == [6, 6] and meter.done
    m = meter.result()
    assert m.whole_epoch and (m.n_batches, m.n_samples) == (6, 48)
    assert len(m.reentry_s) == 1
    first = Meter(WindowSpec(warmup_batches=0, window_s=10.0, whole_epoch=True))
    assert sum(1 for _ in first.wrap(slow_batches(6, 0.002))) == 6 and first.done
    assert not first.result().reentry_s  # not persistent: the first epoch is any epoch


def _epochs_until_done(meter: Meter, lengths: list[int], *, by_count: bool = False) -> list[int]:
    """The batches the loop received in each epoch of ``lengths`` until the meter was done;
    a 30 ms "validation" after each epoch. ``by_count``: the loop asks exactly the epoch's
    batches (Lightning) and never meets StopIteration."""
    got = []
    for n in lengths:
        if meter.done:
            break
        it = meter.wrap(slow_batches(n, 0.002))
        k = 0
        for _ in range(n) if by_count else itertools.count():
            try:
                next(it)
            except StopIteration:
                break
            k += 1
            time.sleep(0.003)
            if by_count and meter.done:
                break
        got.append(k)
        time.sleep(0.03)
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
    )
    t0 = time.perf_counter()
    got = _epochs_until_done(meter, [12, 20, 20], by_count=by_count)
    elapsed = time.perf_counter() - t0
    m = meter.result()
    # the first batch and 2 of warm-up, 9 in the window; then 11 of the next, the last one
    # received
    assert got == [12, 11]
    assert m.whole_epoch and m.complete and (m.n_batches, m.n_samples) == (20, 160)
    assert len(m.reentry_s) == 1 and len(m.rest_s) == 1 and m.rest_s[0] >= 0.025
    assert m.window_s < elapsed - 0.03  # the validation is not in it


def test_persistent_workers_whole_epoch_runs_across_their_first_epoch_s_end() -> None:
    """Persistent workers' first epoch holds their start-up, paid once: the window opens after
    the warm-up and runs an epoch's batches into the second, whose start is a re-entry. A short
    epoch does too, where its warm-up is shorter than it: a warm-up and an epoch cost fewer
    batches than an epoch waited out and an epoch (the rule was to wait in an epoch under four
    warm-ups, as this one)."""
    spec = WindowSpec(warmup_batches=0, window_s=10.0, whole_epoch=True, round_batches=2)
    meter = Meter(spec, persistent=True, epoch_batches=24)
    # the first batch and a warm-up of 3, then 20 in the window and 4 of the next epoch
    assert _epochs_until_done(meter, [24, 24, 24]) == [24, 4]
    m = meter.result()
    assert m.whole_epoch and m.n_batches == 24 and len(m.reentry_s) == 1
    short = Meter(spec, persistent=True, epoch_batches=11)
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
    )
    lengths = [epoch_left or epoch_batches, epoch_batches, epoch_batches]
    assert _epochs_until_done(meter, lengths) == got
    m = meter.result()
    assert m.whole_epoch and m.n_batches == epoch_batches


def test_a_whole_epoch_window_that_outlasts_twice_its_expected_time_ends_as_a_window() -> None:
    meter = Meter(WindowSpec(warmup_batches=0, window_s=0.05, whole_epoch=True))
    n = sum(1 for _ in meter.wrap(slow_batches(1000, 0.01)))
    m = meter.result()
    assert n < 1000 and m.complete and not m.whole_epoch
    assert m.window_s >= 0.1


def test_a_whole_epoch_window_takes_no_warm_up() -> None:
    with pytest.raises(ValueError):
        WindowSpec(warmup_batches=2, window_s=1.0, whole_epoch=True)


def test_another_loaders_pass_after_a_break_is_left_out_of_the_window_once() -> None:
    """A loop breaks out of the measured loader's epoch (a sanity pass of two batches), runs a
    whole pass of another loader (a training epoch), then iterates the measured loader again.
    The pass was left out once as another loader's and once more as the rest up to the next
    ``iter()``: a live run's window measured -1.61 s and its setting was recorded as failed."""
    from loadertune.measure.meter import elsewhere

    meter = Meter(WindowSpec(warmup_batches=1, window_s=0.2), count=FixedCount(8))
    for i, _ in enumerate(meter.wrap(slow_batches(50, 0.002))):
        if i >= 3:
            break  # inside the window: the sanity pass is over
        time.sleep(0.004)
    for _ in elsewhere(slow_batches(10, 0.01), meter, 10):
        pass  # the other loader's pass, about 0.1 s
    while not meter.done:
        got = 0
        for _ in meter.wrap(slow_batches(50, 0.002)):
            got += 1
            time.sleep(0.004)
        assert got
    m = meter.result()
    assert m.window_s > 0.15  # the window's own time, the pass left out once
    assert m.samples_per_s < 8 / 0.005  # about 8 samples per 6 ms
