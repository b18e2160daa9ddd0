"""One setting's loader over what is left of the epoch: the pieces a
:class:`~loadertune.trials.hotswap.swap.HotSwap` changes setting with.

An :class:`EpochOrder` holds the epoch's order, taken once from the script's sampler, and how far
the script has received it; a :class:`Segment` is a plain ``DataLoader`` built from the script's
loader with one setting applied and, as its batch sampler, the part of that order the script has
not received yet.

**Nothing is skipped or seen twice within an epoch.** The epoch's order is taken from the script's
sampler once (lazily, as iterating the loader would: the same draws of the RNG, in the same order)
into an :class:`~loadertune.trials.hotswap.segment.EpochOrder`. A segment's batch sampler reads
that order from the script's position on; a DataLoader hands batches over in the order its batch
sampler made them (``in_order=True``), so each batch the script receives moves the position by
exactly the indices it holds. Batches a segment prefetched but did not hand over are fetched again
by the next one, not lost; in a real training run they are handed over first instead (``drain``).
At the same batch size the batches are exactly those of a single setting (the position moves by
whole batches); at another, the rest of the epoch is regrouped at the new size.
With ``drop_last``, the short tail dropped at the end of an epoch is that of the setting in use
then.

**What differs from iterating one loader:** each segment's iterator draws its workers' base seed
from the loader's generator (torch's global one by default), as a new epoch does: one more draw
per setting. Worker-side randomness (augmentation) therefore differs from an untuned run, as it
does between two runs with other worker counts.
"""

from __future__ import annotations

import collections
import inspect
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from torch.utils.data import DataLoader

from loadertune.config import Config
from loadertune.measure import failures
from loadertune.measure.counting import structure_count
from loadertune.trials import lifeline
from loadertune.trials import loader as dl
from loadertune.trials import torch_internals as _internals

SEEN_BATCHES = 8  # per segment: the batches whose length is kept (they tell its batch size)


def _loading_arguments(loader: DataLoader[Any]) -> dict[str, Any]:
    """The keyword arguments that rebuild ``loader``'s loading (:func:`~.loader.arguments_of`),
    less what decides its batches: a segment's batch sampler does."""
    args = dl.arguments_of(loader)
    for name in ("batch_size", "sampler", "batch_sampler", "drop_last"):
        args.pop(name, None)
    return args


def _plain_loader(kwargs: dict[str, Any]) -> DataLoader[Any]:
    """A DataLoader built by DataLoader's own ``__init__``, even while :mod:`.patch` has replaced
    it: a segment is not one of the script's loaders (it gets no number, no controller)."""
    init = inspect.unwrap(DataLoader.__init__)
    loader = DataLoader.__new__(DataLoader)
    init(loader, **kwargs)
    return loader


class EpochOrder:
    """One epoch's units in the order the script's sampler gives them, and how many of them the
    script has received (``position``). A unit is a sample index, or a whole batch of a custom
    batch sampler. Units are taken from the sampler when first needed, once.

    Also how many batches the script has received in this epoch (``given``), and how many it may
    (``limit()``: None, no limit): an epoch ends there even if units are left (see
    :mod:`loadertune.trials.hotswap.swap` on a script's length)."""

    def __init__(
        self,
        source: Iterable[Any],
        *,
        limit: Callable[[], int | None] | None = None,
        given: int = 0,
        batches: bool = False,
    ) -> None:
        try:
            self.length: int | None = len(source)  # type: ignore[arg-type]
        except TypeError:
            self.length = None
        self._it = iter(source)
        self._units: list[Any] = []
        self._base = 0  # the epoch index of _units[0]
        self._exhausted = False
        self._batches = batches  # its units are a batch sampler's batches (not sample indices)
        self._sizes = [0, 0]  # batches taken, and their samples (where units are batches)
        self._before = given  # batches the script's own loader gave before this order began
        self.position = 0
        self.given = given
        self._limit = limit

    def full(self) -> bool:
        """The script has received as many batches as this epoch may give."""
        if self._limit is None:
            return False
        limit = self._limit()
        return limit is not None and self.given >= limit

    def has_left(self, n: int) -> bool:
        """The epoch may give the script ``n`` more units. Known from the source's length when
        it has one: taking units early could move the sampler's draws of the RNG before a
        segment's (its workers' seed), and the epoch would not be the one iterating gives."""
        if self.full():
            return False
        if self.length is not None:
            return self.length - self.position >= n
        return self.position == 0 or len(self.take(self.position, n)) >= n

    def counted(self, batches: Iterator[Any]) -> Iterator[Any]:
        """``batches`` while the epoch may give more, each counted as given (as they are,
        without a limit: nothing to count then)."""
        return batches if self._limit is None else self._counting(batches)

    def _counting(self, batches: Iterator[Any]) -> Iterator[Any]:
        while not self.full():
            try:
                batch = next(batches)
            except StopIteration:
                return
            self.given += 1
            yield batch

    def take(self, start: int, n: int) -> list[Any]:
        """Units ``start`` .. ``start + n - 1`` of the epoch (fewer at its end)."""
        end = start + n - self._base
        while len(self._units) < end and not self._exhausted:
            try:
                unit = next(self._it)
            except StopIteration:
                self._exhausted = True
                break
            self._units.append(unit)
            if self._batches:  # (not per sample index: this runs as the workers are fed)
                self._sizes[0] += 1
                self._sizes[1] += len(unit)
        return self._units[start - self._base : end]

    def samples(self) -> int | None:
        """The samples of the whole epoch where its units are a custom batch sampler's batches,
        whose ``batch_size`` the loader does not know (a bucketing sampler of its own): exact
        once the batch sampler is exhausted (with the batches the script's own loader gave
        before this order began counted at the mean), before that its length times the mean
        batch taken so far; None before any (or without a length)."""
        batches, samples = self._sizes
        if not batches:
            return None
        if self._exhausted:
            return round(samples * (1 + self._before / batches))
        return round(self.length * samples / batches) if self.length else None

    def forget_received(self) -> None:
        """Drop the units the script has received: no segment will read them again."""
        del self._units[: self.position - self._base]
        self._base = self.position


class _Remaining:
    """A segment's batch sampler: the epoch's units from the script's position on, in batches of
    ``batch_size`` (None: the custom batch sampler's own batches, one unit each)."""

    def __init__(self, batch_size: int | None, drop_last: bool) -> None:
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.order: EpochOrder | None = None
        self.start = 0
        self.emitted: collections.deque[tuple[int, int]] = collections.deque()  # (units, samples)

    def restart(self, order: EpochOrder) -> None:
        order.forget_received()
        self.order, self.start = order, order.position
        self.emitted.clear()

    def __iter__(self) -> Iterator[list[Any]]:
        order, i = self.order, self.start
        if order is None:
            return
        while True:
            if self.batch_size is None:
                units = order.take(i, 1)
                if not units:
                    return
                batch = list(units[0])
                self.emitted.append((1, len(batch)))
            else:
                batch = order.take(i, self.batch_size)
                if not batch or (self.drop_last and len(batch) < self.batch_size):
                    return
                self.emitted.append((len(batch), len(batch)))
            i += 1 if self.batch_size is None else len(batch)
            yield batch

    def __len__(self) -> int:
        if self.order is None or self.order.length is None:
            raise TypeError("the epoch's length is not known")
        left = max(0, self.order.length - self.start)
        if self.batch_size is None:
            return left
        return left // self.batch_size if self.drop_last else -(-left // self.batch_size)

    def delivered(self) -> int:
        """The script received the oldest batch made: move the position past it; its samples."""
        units, samples = self.emitted.popleft()
        if self.order is not None:
            self.order.position += units
        return samples


class _Delivered:
    """A segment's epoch as the script receives it. An iterator, not a generator: an exception
    from one batch passes through, and the epoch goes on at the next ``next()``, as it does with
    torch's own iterator (a generator that raised is finished: a script that catches a bad
    record's error and goes on would lose the rest of the epoch)."""

    __slots__ = ("_it", "_order", "_segment")

    def __init__(self, segment: Segment, it: Iterator[Any], order: EpochOrder) -> None:
        self._segment, self._it, self._order = segment, it, order

    def __iter__(self) -> _Delivered:
        return self

    def __next__(self) -> Any:
        if self._order.full():
            raise StopIteration
        batch = next(self._it)
        self._segment.delivered(batch)
        self._order.given += 1
        return batch


class Segment:
    """One setting's loader over what is left of the epoch (see the module docstring).

    Iterating it (the meter does, once per epoch) starts its workers, or resumes them with
    ``persistent_workers``, at the script's position.
    """

    def __init__(
        self,
        loader: DataLoader[Any],
        config: Config,
        *,
        regroup: bool,
        timeout_s: float | None = None,
    ) -> None:
        self.config = config
        self._own_batch_size = dl.settings_of(loader).batch_size  # a batch sampler's, if it decides
        self.lengths: set[int] = set()  # of the first batches handed over (see ran())
        self.seen = 0
        self.sampler = _Remaining(
            config.batch_size if regroup else None, loader.drop_last if regroup else False
        )
        kwargs = dl.apply_settings(
            {**_loading_arguments(loader), "batch_sampler": self.sampler}, config
        )
        if config.num_workers and not kwargs.get("timeout") and timeout_s:
            kwargs["timeout"] = timeout_s  # a hung worker becomes an error in next()
        kwargs = lifeline.wrap_worker_init(kwargs)  # the workers die with this process
        with dl.quiet_worker_warning():
            self.loader = _plain_loader(kwargs)
        self.order: EpochOrder | None = None
        self.iterator: Any = None  # the DataLoader iterator in use (its workers)
        self.samples = 0  # in the batch handed over last

    def __iter__(self) -> Iterator[Any]:
        if self.order is None:
            raise RuntimeError("Segment.order must be set before iterating")
        if self.iterator is not None and not self.loader.persistent_workers:
            _internals.shut_down(self.iterator)  # the script left an epoch early
        if self.order.full():
            return iter(())
        self.sampler.restart(self.order)
        self.iterator = dl.started(self.loader)
        return _Delivered(self, self.iterator, self.order)

    def delivered(self, batch: Any) -> None:
        """The script receives ``batch``, the oldest made: the position moves past it."""
        self.samples = self.sampler.delivered()
        if self.seen < SEEN_BATCHES:
            self.seen += 1
            self.lengths.add(structure_count(batch))

    def passed_on(self, exc: BaseException) -> None:
        """``exc``, which ``next()`` on this segment raised, goes to the script as a plain
        DataLoader's iterator would raise it. An error the dataset or ``collate_fn`` raised for
        one batch (in the loop's process, or re-raised from a worker: "Caught X in DataLoader
        worker") ends that batch, and the iterator goes on with the next: the position moves
        past it, as it does past a batch received. A worker's death or a timeout ends no batch:
        whatever comes next fetches it again."""
        if self.ends_batch(exc) and self.sampler.emitted and self.order is not None:
            self.sampler.delivered()
            self.order.given += 1

    def ends_batch(self, exc: BaseException) -> bool:
        """Whether ``exc``, which ``next()`` on this segment raised, is one batch's error (the
        dataset's or ``collate_fn``'s: see :meth:`passed_on`), not the loader's."""
        return not self.config.num_workers or failures.raised_in_worker(str(exc))

    def count(self, batch: Any, index: int) -> int:
        """The meter's sample count: the batch the segment handed over last."""
        return self.samples

    def first_batch_unreceived(self) -> Any:
        """One batch from the script's position, which stays where it is (the replay's batch:
        the next setting hands the same samples to the script). :meth:`count` then says its
        samples, as the batch sampler made it: a custom collate's batch (a dataclass) may not
        show them."""
        self.sampler.restart(self.order)  # type: ignore[arg-type]
        it = dl.started(self.loader)
        try:
            batch = next(it)
            self.samples = self.sampler.emitted[0][1]  # the first batch made
            return batch
        finally:
            _internals.shut_down(it)

    def ran(self) -> dict[str, Any]:
        """What this setting's loader really ran with (as :meth:`.metered.Metered.ran` says of
        a script's loader): its settings as built, the workers its iterator started, the lengths
        of the batches it handed over."""
        settings = dl.settings_of(self.loader).loader_kwargs()
        if self.sampler.batch_size is None:  # the script's batch sampler decides, as it did
            settings["batch_size"] = self._own_batch_size
        iterator = self.iterator  # (not ``or``: an iterator's truth asks for its length)
        if iterator is None:
            iterator = _internals.live_iterator(self.loader)
        return {
            "settings": settings,
            "workers_started": _internals.workers_started(iterator),
            "batch_lengths": sorted(self.lengths),
            "loaders": 1,
        }

    def close(self) -> None:
        """Shut the workers down (a persistent loader's too)."""
        for it in (self.iterator, _internals.live_iterator(self.loader)):
            _internals.shut_down(it)
        self.iterator = None


def loads_next_batch(
    loader: DataLoader[Any],
    config: Config,
    order: EpochOrder | None,
    *,
    regroup: bool,
    timeout_s: float | None,
) -> bool:
    """Whether ``loader`` with ``config`` loads the batch at the script's position in ``order``
    (a bad record raises with every setting); the batch is loaded and dropped."""
    check = Segment(loader, config, regroup=regroup, timeout_s=timeout_s)
    check.order = order
    try:
        check.first_batch_unreceived()
        return True
    except Exception:
        return False
    finally:
        check.close()
        _internals.forget_deaths()
