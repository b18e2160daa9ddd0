"""HotSwap in this process: real multi-worker loaders change setting under a loop that checks
every epoch holds each sample exactly once."""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, IterableDataset, SequentialSampler

from loadertune.config import Config
from loadertune.measure import failures
from loadertune.measure.failures import FailureKind
from loadertune.measure.meter import WindowSpec
from loadertune.trials import torch_internals as _internals
from loadertune.trials.contract import window_for
from loadertune.trials.hotswap.segment import EpochOrder
from loadertune.trials.hotswap.steps import Outcome, Step, why_not
from loadertune.trials.hotswap.swap import HotSwap

pytestmark = pytest.mark.slow


class Indices(Dataset):
    def __init__(self, n: int = 500) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.0002)
        return torch.tensor([i])


class Listed:
    """A conductor that runs ``configs`` in turn, then keeps the last good one."""

    def __init__(self, configs: list[Config], window_s: float = 0.15, whole: bool = False) -> None:
        self.configs = list(configs)
        self.window_s = window_s
        self.whole = whole  # whole-epoch windows
        self.outcomes: list[Outcome] = []

    def next_step(self) -> Step | None:
        if not self.configs:
            return None
        c = self.configs.pop(0)
        if self.whole:
            return Step(c, window_for(c, window_s=30.0, whole_epoch=True))  # the search's
        return Step(c, WindowSpec(warmup_batches=c.in_flight_batches + 1, window_s=self.window_s))

    def finished(self, outcome: Outcome) -> bool:
        self.outcomes.append(outcome)
        return True


def epochs_through(swap: HotSwap, conductor: Listed) -> list[list[int]]:
    """Epochs until every setting has run, and one more."""
    seen = []
    while len(seen) < 30 and (conductor.configs or len(seen) < 2 or swap.measuring):
        seen.append([i for batch in swap.epoch() for i in batch.flatten().tolist()])
    seen.append([i for batch in swap.epoch() for i in batch.flatten().tolist()])
    swap.close()
    return seen


SEQUENCE = [
    Config(16),
    Config(16, 2, 2),
    Config(32, 1, 2, persistent_workers=True),
    Config(8, 3, 1),
    Config(16, 2, 4, persistent_workers=True),
    Config(64),
]


@pytest.mark.parametrize(("drop_last", "drain"), [(False, False), (True, False), (True, True)])
def test_each_epoch_holds_every_sample_once_across_setting_changes(
    drop_last: bool, drain: bool
) -> None:
    loader = DataLoader(Indices(), batch_size=16, shuffle=True, drop_last=drop_last)
    conductor = Listed(SEQUENCE)
    swap = HotSwap(loader, conductor, fall_back=False, drain=drain)
    epochs = epochs_through(swap, conductor)
    assert [o.step.config for o in conductor.outcomes] == SEQUENCE  # every setting was measured
    assert all(o.measurement is not None and o.measurement.n_samples for o in conductor.outcomes)
    for seen in epochs:
        assert len(seen) == len(set(seen))  # nothing twice
        if not drop_last:
            assert sorted(seen) == list(range(500))  # nothing lost
        else:  # only the tail of the setting in use at the epoch's end, less than its batch
            assert 500 - len(seen) < max(c.batch_size for c in SEQUENCE)


def test_whole_epoch_trials_begun_mid_epoch_measure_an_epoch_s_batches_across_its_end() -> None:
    """After a windowed setting that ends mid-epoch, each whole-epoch setting measures as many
    batches as an epoch holds, from where it began (after its warm-up) across the epoch's end
    into the next: the epoch's start-up, first round and tail once each, without waiting for
    the next epoch to begin. Every epoch still holds every sample once."""
    loader = DataLoader(Indices(), batch_size=16, shuffle=True)
    windowed = Listed([Config(16, 1, 2)], window_s=0.01)
    swap = HotSwap(loader, windowed, fall_back=False)
    settings = [Config(32, 2, 2), Config(16, 2, 2, persistent_workers=True), Config(64)]
    whole = Listed(settings, whole=True)
    try:
        epoch = swap.epoch()
        first = [i for b in itertools.islice(epoch, 10) for i in b.flatten().tolist()]
        assert windowed.outcomes  # the window ended mid-epoch, 160 samples in
        swap.conductor = whole  # the first whole-epoch setting starts here
        first += [i for b in epoch for i in b.flatten().tolist()]
    except BaseException:
        swap.close()
        raise
    assert sorted(first) == list(range(500))
    epochs = epochs_through(swap, whole)
    assert [o.step.config for o in whole.outcomes] == settings
    for o in whole.outcomes:
        m, batch_size = o.measurement, o.step.config.batch_size
        assert m is not None and m.whole_epoch and o.epoch_samples == 500
        assert m.n_batches == -(-500 // batch_size)  # an epoch's batches
        # one short batch among them (the rest of the epoch where it began, regrouped)
        assert 500 - batch_size < m.n_samples <= 500
        assert m.reentry_s or m.rest_s  # it ran across an epoch's end
    for seen in epochs[1:]:
        assert sorted(seen) == list(range(500))


def test_a_persistent_whole_epoch_trial_runs_across_its_first_epoch_s_end() -> None:
    """Persistent workers begun at an epoch's start (a fresh launch's first trial): their first
    epoch holds their start-up, so the window opens after a warm-up (a batch from each of the
    2 workers and one more) and holds an epoch's 8 batches across its end, rather than waiting
    the epoch out and measuring the next (the rule in epochs under four warm-ups: 16 batches)."""
    loader = DataLoader(Indices(), batch_size=16, shuffle=True)
    whole = Listed([Config(64, 2, 2, persistent_workers=True)], whole=True)
    swap = HotSwap(loader, whole, fall_back=False)
    given = 0
    try:
        for _ in range(3):
            for _batch in swap.epoch():
                given += 0 if whole.outcomes else 1
    finally:
        swap.close()
    m = whole.outcomes[0].measurement
    assert m is not None and m.whole_epoch and (m.n_batches, m.n_samples) == (8, 500)
    assert m.reentry_s  # the second epoch's start is in it
    assert 8 < given <= 8 + 3 + 1  # the first batch, the warm-up and the window


def test_a_step_that_comes_when_the_epoch_has_no_batch_left_starts_with_the_next() -> None:
    """A whole-epoch window ends its epoch; with ``drop_last`` the 4 samples left make no batch.
    The replay that comes next (it needs a batch the script has not received) starts with the
    next epoch, rather than finding none and being lost."""
    loader = DataLoader(Indices(), batch_size=16, shuffle=True, drop_last=True)
    steps = [
        Step(Config(16, 1, 2), WindowSpec(warmup_batches=0, window_s=30.0, whole_epoch=True)),
        Step(Config(16), WindowSpec(warmup_batches=1, window_s=0.02), phase="replay"),
    ]
    conductor = Listed([])
    conductor.next_step = lambda: steps.pop(0) if steps else None  # type: ignore[method-assign]
    swap = HotSwap(loader, conductor, fall_back=False)
    try:
        epochs = [[i for b in swap.epoch() for i in b.flatten().tolist()] for _ in range(2)]
    finally:
        swap.close()
    assert [o.step.phase for o in conductor.outcomes] == ["search", "replay"]
    assert all(o.measurement is not None for o in conductor.outcomes)
    assert conductor.outcomes[0].measurement.n_samples == 496  # type: ignore[union-attr]
    assert len(epochs[0]) == 496


class Counted(Indices):
    """Counts the samples its workers load (in shared memory: a worker's count is its own)."""

    def __init__(self, n: int = 500) -> None:
        super().__init__(n)
        self.loaded = torch.zeros(1, dtype=torch.int64).share_memory_()

    def __getitem__(self, i: int) -> torch.Tensor:
        self.loaded += 1  # a race between workers loses counts, never adds them
        return super().__getitem__(i)


@pytest.mark.parametrize("drain", [False, True])
def test_a_real_run_hands_over_the_batches_in_flight_before_the_next_setting(drain: bool) -> None:
    """With ``drain`` (a real training run), the batches a setting's workers had prefetched are
    handed over before the next setting starts, not loaded again by it: every sample is loaded
    about once per epoch. Without it (a trial process), they are thrown away."""
    dataset = Counted()
    loader = DataLoader(dataset, batch_size=4, shuffle=True)
    configs = [Config(4, 2, 8), Config(4, 3, 8, persistent_workers=True), Config(4, 2, 8)] * 2
    conductor = Listed(configs, window_s=0.05)
    swap = HotSwap(loader, conductor, fall_back=True, drain=drain)
    epochs = epochs_through(swap, conductor)
    assert [o.step.config for o in conductor.outcomes] == configs
    for seen in epochs:
        assert sorted(seen) == list(range(500))
    extra = int(dataset.loaded) - 500 * len(epochs)
    if drain:  # a race may lose a few counts; a batch of 4 thrown away would add 4
        assert extra <= 0, extra
    else:  # at least one setting's prefetched batches were loaded again by the next
        assert extra >= 4 * 8, extra


@pytest.mark.parametrize("drain", [False, True])
def test_at_the_same_batch_size_the_batches_are_those_of_one_loader(drain: bool) -> None:
    """Swaps at one batch size hand over exactly the batches one loader makes, in its order:
    the epoch's order is taken from the sampler as iterating would (same RNG draws)."""
    torch.manual_seed(7)
    plain = [b.flatten().tolist() for b in DataLoader(Indices(), batch_size=16, shuffle=True)]
    torch.manual_seed(7)
    loader = DataLoader(Indices(), batch_size=16, shuffle=True)
    configs = [Config(16), Config(16, 2, 2), Config(16, 1, 1)]
    swap = HotSwap(loader, Listed(configs), fall_back=False, drain=drain)
    swapped = [b.flatten().tolist() for b in swap.epoch()]
    swap.close()
    assert swapped == plain


@pytest.mark.parametrize("drain", [False, True])
def test_a_custom_batch_sampler_keeps_its_batches(drain: bool) -> None:
    class Pairs(BatchSampler):
        pass  # a subclass: its batches are taken as they come

    sampler = Pairs(SequentialSampler(range(300)), batch_size=7, drop_last=False)
    loader = DataLoader(Indices(300), batch_sampler=sampler)
    conductor = Listed([Config(7), Config(7, 2, 2), Config(7, 1, 2)], window_s=0.1)
    swap = HotSwap(loader, conductor, fall_back=False, drain=drain)
    batches = [b.flatten().tolist() for _ in range(2) for b in swap.epoch()]
    swap.close()
    assert batches == [list(b) for _ in range(2) for b in sampler]


class Buckets(torch.utils.data.Sampler):
    """A batch sampler of its own (bucketing by length, say): batches of 5 and 9 samples, a
    length, and no ``batch_size``."""

    def __init__(self, n: int) -> None:
        self.batches, start = [], 0
        for size in itertools.cycle([5, 9]):
            if start >= n:
                break
            self.batches.append(list(range(start, min(n, start + size))))
            start += size

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def test_a_batch_samplers_epoch_length_comes_from_its_batches() -> None:
    """Its samples per epoch are the batches' (a search then tries persistent workers, and
    ranks by the per-epoch rate); they were unknown without a ``batch_size``."""
    loader = DataLoader(Indices(300), batch_sampler=Buckets(300))
    configs = [Config(1), Config(1, 2, 2, persistent_workers=True), Config(1, 1, 2)]
    conductor = Listed(configs, whole=True)  # each window ends with its epoch
    swap = HotSwap(loader, conductor, fall_back=False)
    epochs = epochs_through(swap, conductor)
    assert all(sorted(e) == list(range(300)) for e in epochs)
    assert len(conductor.outcomes) == 3
    for outcome in conductor.outcomes:
        assert outcome.epoch_samples is not None
        assert abs(outcome.epoch_samples - 300) <= 15, outcome.epoch_samples
    persistent = conductor.outcomes[1].measurement
    assert persistent is not None and persistent.reentry_s  # its next epoch's start, timed


def test_a_batch_samplers_epoch_length_is_known_as_the_next_epoch_begins() -> None:
    """A trial whose window ends at the next epoch's first batch reports the epoch just
    counted: under load one ended there, before the new epoch had a batch, and had none."""
    loader = DataLoader(Indices(300), batch_sampler=Buckets(300))
    swap = HotSwap(loader, Listed([Config(1)], window_s=60.0), fall_back=False)
    try:
        assert sorted(i for b in swap.epoch() for i in b.flatten().tolist()) == list(range(300))
        swap.epoch()  # the next epoch begins; no batch taken yet
        assert swap.epoch_samples(Config(1)) == 300
    finally:
        swap.close()


def test_a_batch_samplers_epoch_counts_the_batches_its_own_loader_gave_first() -> None:
    """A swap that takes over an epoch the script's own loader began (``rest_of_epoch``) sees
    only the rest of its batches: the epoch's samples count the ones given before too (a new
    user's 800-sample epochs, taken over after 5 of 25 batches, were recorded as 640)."""
    batches = [list(range(i, i + 32)) for i in range(0, 800, 32)]
    whole = EpochOrder(batches, batches=True)
    rest = EpochOrder(iter(batches[5:]), given=5, batches=True)
    assert whole.take(0, 3) and whole.samples() == 800  # its length times the mean so far
    for order in (whole, rest):
        order.take(0, 100)  # to its end
        assert order.samples() == 800


class Fragile(Indices):
    """A worker of a loader with 3 workers is killed (SIGKILL), as the OOM killer does."""

    def __getitem__(self, i: int) -> torch.Tensor:
        info = torch.utils.data.get_worker_info()
        if info is not None and info.num_workers == 3 and i % 50 == 3:
            import os
            import signal

            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(i)


@pytest.mark.parametrize("drain", [False, True])
def test_a_failing_setting_falls_back_to_the_last_good_one_without_losing_a_sample(
    drain: bool,
) -> None:
    loader = DataLoader(Fragile(), batch_size=16, shuffle=True)
    conductor = Listed([Config(16, 1, 2), Config(16, 3, 2), Config(16, 2, 2)])
    # as LiveConductor does in a real run: the death is raised only where torch waits for a
    # batch, never in the loop's own code (here, the list comprehension)
    with _internals.worker_deaths_deferred(only_while_waiting=True):
        swap = HotSwap(loader, conductor, fall_back=True, drain=drain)
        epochs = epochs_through(swap, conductor)
    failed = [o for o in conductor.outcomes if o.error is not None]
    assert [o.step.config.num_workers for o in failed] == [3]
    # As a run records it (``live.py``): torch's "DataLoader worker ... killed" or, where the
    # worker died handing a batch over (a loaded machine, beside a CI run), an EOFError with
    # the worker's SIGKILL in its exit code.
    failure = failures.classify_exception(
        failed[0].error, where="loader", worker_signals=failed[0].worker_signals, num_workers=3
    )
    assert failure.kind == FailureKind.WORKER_KILLED, failure
    ok = [o.step.config for o in conductor.outcomes if o.measurement is not None]
    assert ok == [Config(16, 1, 2), Config(16, 2, 2)]  # the sequence went on after the failure
    for seen in epochs:
        assert sorted(seen) == list(range(500))


class Stream(IterableDataset):
    def __iter__(self) -> Any:
        return iter(range(10))


def test_what_cannot_be_swapped_says_why() -> None:
    assert "IterableDataset" in (why_not(DataLoader(Stream(), batch_size=2)) or "")
    assert "automatic batching" in (why_not(DataLoader(Indices(), batch_size=None)) or "")
    assert "in_order" in (why_not(DataLoader(Indices(), num_workers=1, in_order=False)) or "")

    class OwnIterator(DataLoader):
        def _get_iterator(self) -> Any:
            return super()._get_iterator()

    assert "_get_iterator" in (why_not(OwnIterator(Indices())) or "")
    assert why_not(DataLoader(Indices(), batch_size=4)) is None
    with pytest.raises(ValueError, match="IterableDataset"):
        HotSwap(DataLoader(Stream(), batch_size=2), Listed([]), fall_back=False)


def test_the_scripts_loader_says_which_setting_its_batches_come_from() -> None:
    """``loader.num_workers`` and the rest, read in the loop, are the setting in use: a script
    that logs them or decides by them read its own settings all along before."""
    loader = DataLoader(Indices(), batch_size=16, shuffle=True)
    conductor = Listed([Config(32, 2, 4, persistent_workers=True), Config(8)])
    swap = HotSwap(loader, conductor, fall_back=True)
    shown = set()
    try:
        for _ in range(6):
            for batch in swap.epoch():
                ran = (len(batch), loader.num_workers, loader.prefetch_factor)
                shown.add((*ran, loader.batch_size, loader.persistent_workers))
    finally:
        swap.close()
    assert (32, 2, 4, 32, True) in shown
    assert (8, 0, None, 8, False) in shown  # the last setting, kept to the end


def test_a_real_run_without_a_first_setting_goes_on_with_its_own() -> None:
    """A live run's tuning that never gave a setting (its baseline failed, and the search
    ended) must not end the training: the loader goes on with its own setting. A new user's
    script stopped with "the conductor gave no first setting" inside its validation loop."""
    loader = DataLoader(Indices(60), batch_size=8, num_workers=1)
    swap = HotSwap(loader, Listed([]), fall_back=True)
    for _ in range(2):
        seen = sorted(i for batch in swap.epoch() for i in batch.flatten().tolist())
        assert seen == list(range(60))
    assert swap.current is not None and swap.current.step.config == Config(8, 1, 2)
    swap.close()
    # a trial process (no fall-back) has no own setting to go on with: the search names one
    with pytest.raises(RuntimeError, match="no first setting"):
        next(iter(HotSwap(loader, Listed([]), fall_back=False).epoch()))


class StallsOnce(Dataset):
    """Indices; one item stalls its worker once, past the trial loader's timeout."""

    def __init__(self, n: int, stall_at: int, stall_s: float, flag: str) -> None:
        self.n, self.stall_at, self.stall_s, self.flag = n, stall_at, stall_s, flag

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        import os

        if i == self.stall_at and not os.path.exists(self.flag):
            open(self.flag, "w").close()  # a marker: the stall happens once across processes
            time.sleep(self.stall_s)
        return torch.tensor([i])


@pytest.mark.parametrize("measured", [False, True])
def test_a_live_run_never_gets_a_timeout_of_a_loader_loadertune_built(tmp_path, measured) -> None:
    """The ``timeout`` a trial's loader gets is loadertune's, not the script's: a worker that
    stalls past it, under the measured setting or under the setting kept after it, falls back
    to the loader's own setting, and the loop gets every sample of the epoch once."""
    n = 480
    stall_at = 200 if not measured else 40
    ds = StallsOnce(n, stall_at, stall_s=1.5, flag=str(tmp_path / "stalled"))
    loader = DataLoader(ds, batch_size=16)

    class KeepOne(Listed):
        def next_step(self) -> Step | None:
            step = super().next_step()
            if step is not None:
                step.worker_timeout_s = 0.5
            return step

    conductor = KeepOne([Config(16, 2, 2)], window_s=0.05)
    swap = HotSwap(loader, conductor, fall_back=True, drain=True)
    try:
        seen = [i for batch in swap.epoch() for i in batch.flatten().tolist()]
    finally:
        swap.close()
    assert (tmp_path / "stalled").exists()
    assert sorted(seen) == list(range(n))
