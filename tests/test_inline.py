"""In-process trials over real multi-worker DataLoaders, and every way they fail."""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import signal
import threading
import time
from typing import ClassVar

import pytest
import torch

from loadertune.config import Config
from loadertune.trials import Limits, window_for
from loadertune.trials.inline import InlineRunner
from loadertune.units import MIB

from workloads import FaultDataset, SleepDataset, TensorDataset, sleep_step

pytestmark = pytest.mark.slow


def run(
    runner: InlineRunner,
    config: Config,
    *,
    window_s: float = 0.4,
    phase: str = "search",
    limits: Limits | None = None,
):
    return runner.run(
        config,
        window=window_for(config, window_s=window_s),
        limits=limits or Limits(hang_s=5, startup_s=20, timeout_s=60),
        phase=phase,
    )


def test_measures_a_multi_worker_loader() -> None:
    runner = InlineRunner(SleepDataset(n=20000, sleep_s=0.0005))
    result = run(runner, Config(32, 2, 2))
    assert result.ok and result.error is None
    assert result.params == {
        "batch_size": 32,
        "num_workers": 2,
        "prefetch_factor": 2,
        "pin_memory": False,
        "persistent_workers": False,
    }
    m = result.measurement
    assert m is not None and m.complete and m.n_samples == 32 * m.n_batches
    assert result.resources is not None
    assert result.resources.n_workers == 2
    assert result.resources.pss_bytes and result.resources.pss_bytes > 0
    assert result.epoch_samples == 20000
    assert m.reentry_s, "a new epoch's start-up is measured when the length is known"
    assert result.orphans_killed == 0


class SlowAfterFirst(torch.utils.data.Dataset):
    """Every sample but the first (an epoch's) waits ``sleep_s``."""

    def __init__(self, n: int, sleep_s: float) -> None:
        self.n, self.sleep_s = n, sleep_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if i:
            time.sleep(self.sleep_s)
        return torch.zeros(4)


def test_a_new_epochs_start_up_waits_for_no_batch_of_the_last() -> None:
    # Persistent workers resume at a new iter() only once they have made (and torch dropped)
    # every batch still queued of the epoch before: 2 workers x prefetch 2, 0.4 s each. An
    # epoch's natural end leaves none queued, so its start-up is the first batch alone (here
    # quick); timed mid-epoch without ending it, it read at least one slow batch more.
    runner = InlineRunner(SlowAfterFirst(n=10_000, sleep_s=0.4))
    result = run(runner, Config(1, 2, 2, persistent_workers=True), window_s=0.3)
    assert result.ok and result.measurement is not None
    assert result.measurement.reentry_s and result.measurement.reentry_s[0] < 0.4


def test_more_workers_load_a_latency_bound_dataset_faster() -> None:
    runner = InlineRunner(SleepDataset(n=50000, sleep_s=0.001))
    one = run(runner, Config(32, 1, 2)).samples_per_s
    four = run(runner, Config(32, 4, 2)).samples_per_s
    assert one and four and four > 2 * one  # sleeping workers overlap; a 4x ideal, 2x for noise


def test_fixed_arguments_pass_through() -> None:
    calls = []

    def collate(samples):
        calls.append(len(samples))
        return torch.stack(samples)

    runner = InlineRunner(TensorDataset(n=1000), fixed={"collate_fn": collate, "drop_last": True})
    result = run(runner, Config(64))
    assert result.ok
    assert calls and set(calls) == {64}  # drop_last: never a short batch
    assert result.epoch_samples == 960


def test_replay_measures_the_step_alone() -> None:
    runner = InlineRunner(SleepDataset(n=5000, sleep_s=0.002), step=sleep_step(0.001))
    replay = run(runner, Config(16), phase="replay")
    assert replay.ok
    assert replay.measurement is not None and replay.measurement.blocked_fraction < 0.1
    assert runner.bytes_per_sample == 16 * 4  # 16 float32 values per sample


@pytest.mark.parametrize(
    ("fault", "kind"), [("sigkill", "worker_killed"), ("sigbus", "shm_exhausted")]
)
def test_a_killed_worker_is_recorded_and_not_fatal(fault: str, kind: str) -> None:
    runner = InlineRunner(FaultDataset(fault, min_workers=2, at=40))
    bad = run(runner, Config(8, 2, 2))
    assert bad.error == kind and not bad.failure.user_bug  # type: ignore[union-attr]
    assert bad.samples_per_s is None
    good = run(runner, Config(8, 1, 2))  # below the fault's threshold: works
    assert good.ok


def test_a_hung_worker_times_out() -> None:
    runner = InlineRunner(FaultDataset("hang", min_workers=1, at=20))
    t0 = time.monotonic()
    result = run(runner, Config(8, 2, 2), limits=Limits(hang_s=2, startup_s=10, timeout_s=30))
    assert result.error == "timeout"
    assert time.monotonic() - t0 < 20
    assert result.failure is not None and "worker_init_fn" in result.failure.advice


def test_a_trial_running_at_the_search_deadline_is_cut_skipped_not_failed() -> None:
    """``Limits.ends_by``: a trial still in its (long) window at the search's deadline stops
    there, its workers with it, and is recorded as skipped: no rate, and no failure that would
    rule its setting (or larger ones) out."""
    runner = InlineRunner(SleepDataset(n=100000, sleep_s=0.02))
    t0 = time.monotonic()
    result = run(
        runner,
        Config(8, 2, 2),
        window_s=60,
        limits=Limits(hang_s=5, startup_s=20, timeout_s=120, ends_by=t0 + 2.0),
    )
    assert time.monotonic() - t0 < 15
    assert result.failure is None and not result.ok and result.status == "skipped"
    assert result.skipped is not None and "deadline" in result.skipped
    assert result.samples_per_s is None and result.measurement is None
    assert not multiprocessing.active_children()
    assert run(runner, Config(8, 2, 2)).ok  # the same setting, without a deadline


def test_a_hung_step_is_interrupted() -> None:
    calls = {"n": 0}

    def step(batch):
        calls["n"] += 1
        if calls["n"] > 20:
            time.sleep(3600)

    runner = InlineRunner(TensorDataset(n=100000), step=step)
    t0 = time.monotonic()
    result = run(runner, Config(8), limits=Limits(hang_s=1.0, startup_s=10, timeout_s=30))
    assert result.error == "timeout"
    assert time.monotonic() - t0 < 15
    # no workers: no advice about workers' start method or threads
    assert result.failure is not None and "without workers" in result.failure.message
    assert "worker_init_fn" not in result.failure.advice


def test_a_hung_step_is_interrupted_where_sigint_is_ignored() -> None:
    """A process started in the background by a shell without job control ignores SIGINT: the
    watchdog's interrupt must still reach the step, and the disposition is put back after."""
    calls = {"n": 0}

    def step(batch):
        calls["n"] += 1
        if calls["n"] > 20:
            time.sleep(3600)

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    t0 = time.monotonic()
    try:
        result = run(
            InlineRunner(TensorDataset(n=100000), step=step),
            Config(8),
            limits=Limits(hang_s=1.0, startup_s=10, timeout_s=30),
        )
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
    assert result.error == "timeout"
    assert time.monotonic() - t0 < 15  # interrupted, not left hanging (forever, but for pytest's
    # own time limit, which the runner would then report as the trial's failure)


def test_dataset_bug_is_a_user_bug() -> None:
    runner = InlineRunner(FaultDataset("raise", at=20))
    result = run(runner, Config(8, 2, 2))
    assert result.error == "dataset_error" and result.failure.user_bug  # type: ignore[union-attr]
    assert "corrupt sample" in result.failure.detail  # type: ignore[union-attr]


def test_step_bug_is_a_user_bug() -> None:
    def step(batch):
        raise KeyError("labels")

    result = run(InlineRunner(TensorDataset(), step=step), Config(8))
    assert result.error == "step_error" and result.failure.user_bug  # type: ignore[union-attr]


def test_gpu_oom_in_the_step_is_tuning_data() -> None:
    """A fake OOM with the real message text, as accelerate's tests do."""

    def step(batch):
        if batch.shape[0] >= 64:
            raise torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; "
                "79.10 GiB total capacity; 77.00 GiB already allocated)"
            )

    runner = InlineRunner(TensorDataset(), step=step)
    assert run(runner, Config(64)).error == "oom"
    assert run(runner, Config(32)).ok


def test_memory_budget_stops_a_trial() -> None:
    class Hog(TensorDataset):
        hoard: ClassVar[list[torch.Tensor]] = []

        def __getitem__(self, i):  # each worker grows by ~4 MB per sample
            self.hoard.append(torch.ones(1 << 20))
            return super().__getitem__(i)

    runner = InlineRunner(Hog(n=100000))
    from loadertune.measure.resources import tree_pss

    budget = tree_pss(__import__("os").getpid()) + 300 * MIB
    result = run(
        runner,
        Config(8, 2, 2),
        window_s=30,
        limits=Limits(hang_s=10, startup_s=20, timeout_s=60, memory_budget_bytes=budget),
    )
    assert result.error == "memory_budget"
    assert "over the budget" in result.failure.message  # type: ignore[union-attr]


def test_a_dataset_that_does_not_pickle_is_tuning_data() -> None:
    """Under spawn (forkserver is Python 3.14's default), workers need a picklable dataset."""

    class Local(TensorDataset):  # a class defined in a function does not pickle
        pass

    runner = InlineRunner(Local(n=1000), fixed={"multiprocessing_context": "spawn"})
    result = run(runner, Config(8, 2, 2))
    assert result.error == "pickle_error", result.failure
    assert not result.failure.user_bug  # type: ignore[union-attr]
    assert run(runner, Config(8)).ok  # without workers nothing needs pickling


def test_killed_workers_leave_no_process_object_and_no_file_descriptor() -> None:
    """The trial reaps the workers it kills; multiprocessing must learn they are dead, or each
    keeps a Process object in active_children() and its sentinel pipe open, trial after trial."""
    runner = InlineRunner(FaultDataset("sigkill", min_workers=2, at=40, n=100000))
    run(runner, Config(8, 2, 2))  # one failing trial first: lazily opened fds settle
    fds = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        result = run(runner, Config(8, 4, 2))
        assert result.error in ("worker_killed", "worker_crashed"), result.failure
    assert multiprocessing.active_children() == []
    gc.collect()  # the sentinel pipes close when their Popen objects are collected
    assert len(os.listdir("/proc/self/fd")) <= fds


def test_many_workers_dying_at_once_never_escape_the_trial() -> None:
    """Every worker SIGKILLs itself: while the first death is handled, DataLoader's SIGCHLD
    handler fires again for each sibling. None of it may escape as an exception."""
    runner = InlineRunner(FaultDataset("sigkill", min_workers=1, at=0, n=100000))
    for _ in range(8):
        result = run(runner, Config(8, 4, 2))
        assert result.error in ("worker_killed", "worker_crashed"), result.failure


def test_workers_die_with_a_sigkilled_tune_loader(tmp_path) -> None:
    """A process in tune_loader SIGKILLed while its workers are stuck in __getitem__ (issue 14):
    the workers go with it, instead of living on under init."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    import psutil

    scripts = Path(__file__).parent / "scripts"
    program = (
        f"import sys; sys.path.insert(0, {str(scripts)!r}); from stuck_workers import Stuck\n"
        "from loadertune import tune_loader\n"
        "tune_loader(Stuck(), batch_size=4, baseline={'num_workers': 2}, budget_s=60, "
        "verbose=False)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", program], env={**os.environ, "STUCK_PIDS_DIR": str(tmp_path)}
    )
    try:
        deadline = time.monotonic() + 60
        while len(os.listdir(tmp_path)) < 2 and time.monotonic() < deadline:
            assert proc.poll() is None, "tune_loader ended before its workers got stuck"
            time.sleep(0.1)
        workers = [psutil.Process(int(name)) for name in os.listdir(tmp_path)]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def alive() -> list[psutil.Process]:
        out = []
        for p in workers:
            with contextlib.suppress(psutil.Error):
                if p.status() != psutil.STATUS_ZOMBIE:  # a zombie is dead, not yet reaped
                    out.append(p)
        return out

    deadline = time.monotonic() + 3
    while (left := alive()) and time.monotonic() < deadline:
        time.sleep(0.05)
    for p in left:
        p.kill()
    assert not left, "DataLoader workers outlived the SIGKILLed process"


class _Buckets(torch.utils.data.Sampler):
    """A batch sampler of the user's own: batches of 10 over 400 samples, a length, no
    ``batch_size``."""

    def __iter__(self):
        return iter([list(range(i, i + 10)) for i in range(0, 400, 10)])

    def __len__(self) -> int:
        return 40


def test_a_batch_samplers_epoch_length_comes_from_the_batches_measured() -> None:
    """``tune_loader(dataset, batch_sampler=...)``: the epoch's samples, unknown from a batch
    sampler without ``batch_size``, come from the batches its first trial measured, so the
    search tries persistent workers (it never did)."""
    runner = InlineRunner(SleepDataset(n=400, sleep_s=0.0002), fixed={"batch_sampler": _Buckets()})
    assert runner.epoch_samples is None  # not known before a trial
    try:
        result = run(runner, Config(1), window_s=0.2)
    finally:
        runner.close()
    assert result.ok, result.failure
    assert result.epoch_samples == runner.epoch_samples == 400


def test_the_watchdog_sends_no_interrupt_once_the_trial_has_ended(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The trial ends by itself just as the watchdog's grace runs out: no SIGINT may follow,
    or it reaches whatever runs next (a stray KeyboardInterrupt stopped a later test's search
    as "search interrupted")."""
    from loadertune.measure import failures
    from loadertune.trials import inline

    class Expired:
        def expired(self):
            return failures.hang(1.0, 0)

    dog = inline._Watchdog(Expired(), set(inline._children()), interrupt_grace_s=0.0)
    ended = threading.Event()

    def grace_ran_out(timeout: float | None = None) -> bool:
        if timeout == 0.0:  # the grace: the trial ends meanwhile, and the wait says it did not
            dog._done.set()
            ended.set()
            return False
        return threading.Event.wait(dog._done, timeout)

    monkeypatch.setattr(dog._done, "wait", grace_ran_out)
    sent: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: sent.append(signum))
    try:
        with dog:
            assert ended.wait(5)
        time.sleep(0.2)  # (a signal sent is handled by now)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert dog.failure is not None and not dog.interrupted and sent == []
