"""Many settings in one pass over the data: the script's loop keeps receiving batches while the
setting of the loader under it changes.

When the script iterates the tuned loader, it gets a :class:`HotSwap`'s epoch instead of the
loader's own iterator. Each setting runs as a :class:`Segment`: a plain ``DataLoader`` built from
the script's loader (its dataset, sampler order, ``collate_fn``, ``worker_init_fn``, ``timeout``,
``generator``, multiprocessing context...) with the setting applied and, as its batch sampler,
the part of the epoch the script has not received yet. When a setting is done, its workers are
shut down and the next one starts where the script is; when an epoch ends, the setting in use
carries on into the next one. A :class:`Conductor` says which setting comes next and hears how
each one went: the search in a script's trial process (:mod:`loadertune.trials.sequence`), or
the tuner inside a real training run (:mod:`loadertune.trials.live`).

**Nothing is skipped or seen twice within an epoch.** The epoch's order is taken from the
script's sampler once (lazily, as iterating the loader would: the same draws of the RNG, in the
same order) into an :class:`EpochOrder`. A segment's batch sampler reads that order from the
script's position on; a DataLoader hands batches over in the order its batch sampler made them
(``in_order=True``), so each batch the script receives moves the position by exactly the indices
it holds. Batches a segment prefetched but did not hand over are fetched again by the next one,
not lost. At the same batch size the batches are exactly those of a single setting (the position
moves by whole batches); at another, the rest of the epoch is regrouped at the new size. With
``drop_last``, the short tail dropped at the end of an epoch is that of the setting in use then.

**What differs from iterating one loader:** each segment's iterator draws its workers' base seed
from the loader's generator (torch's global one by default), as a new epoch does: one more draw
per setting. Worker-side randomness (augmentation) therefore differs from an untuned run, as it
does between two runs with other worker counts.

**What is not swapped** (:func:`why_not`; such a loader gets a fresh process per setting):

- an ``IterableDataset``: every worker restarts its own stream, so there is no position to resume
  an epoch from;
- no automatic batching (``batch_size=None`` and no ``batch_sampler``): samples are not grouped
  by a batch sampler the swap could resume;
- ``in_order=False``: batches arrive in the order workers finish them, so which samples the
  script has received is not known;
- a ``DataLoader`` subclass that changes how its iterator is made (``_get_iterator``,
  ``_index_sampler``): a plain DataLoader per setting would not do what it does.

A custom ``batch_sampler`` is swapped as it is: its batches are taken once per epoch, as the
loader would take them, and handed to each setting in turn; its batch size cannot change (the
search never changes it: the batch sampler decides).
"""

from __future__ import annotations

import collections
import inspect
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from torch.utils.data import DataLoader, IterableDataset

from loadertune.config import Config
from loadertune.measure.counting import structure_count, structure_counter
from loadertune.measure.meter import Measurement, Meter, Sink, WindowSpec
from loadertune.trials import _torch_internals as _internals
from loadertune.trials import lifeline
from loadertune.trials import loader as dl

SEEN_BATCHES = 8  # per segment: the batches whose length is kept (they tell its batch size)


def why_not(loader: DataLoader[Any]) -> str | None:
    """Why ``loader`` cannot change setting mid-epoch (see the module docstring), or None."""
    if isinstance(loader.dataset, IterableDataset):
        return "an IterableDataset (each worker restarts its stream: an epoch cannot be resumed)"
    if loader.batch_size is None and loader.batch_sampler is None:
        return "no automatic batching (batch_size=None without a batch_sampler)"
    if not getattr(loader, "in_order", True):
        return "in_order=False (batches arrive out of order: the position is not known)"
    cls = type(loader)
    changed = [
        name
        for name in _internals.ITERATOR_HOOKS
        if getattr(cls, name, None) is not getattr(DataLoader, name, None)
    ]
    if changed:
        return f"{cls.__qualname__} overrides {', '.join(changed)}"
    return None


def arguments_of(loader: DataLoader[Any]) -> dict[str, Any]:
    """The keyword arguments that rebuild ``loader``'s loading, less what decides its batches."""
    args: dict[str, Any] = {
        "dataset": loader.dataset,
        "num_workers": loader.num_workers,
        "collate_fn": loader.collate_fn,
        "pin_memory": loader.pin_memory,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "multiprocessing_context": loader.multiprocessing_context,
        "generator": loader.generator,
        "prefetch_factor": loader.prefetch_factor,
        "persistent_workers": loader.persistent_workers,
    }
    if getattr(loader, "pin_memory_device", ""):
        args["pin_memory_device"] = loader.pin_memory_device
    if hasattr(loader, "in_order"):
        args["in_order"] = loader.in_order
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
    batch sampler. Units are taken from the sampler when first needed, once."""

    def __init__(self, source: Iterable[Any]) -> None:
        try:
            self.length: int | None = len(source)  # type: ignore[arg-type]
        except TypeError:
            self.length = None
        self._it = iter(source)
        self._units: list[Any] = []
        self._base = 0  # the epoch index of _units[0]
        self._exhausted = False
        self.position = 0

    def take(self, start: int, n: int) -> list[Any]:
        """Units ``start`` .. ``start + n - 1`` of the epoch (fewer at its end)."""
        end = start + n - self._base
        while len(self._units) < end and not self._exhausted:
            try:
                self._units.append(next(self._it))
            except StopIteration:
                self._exhausted = True
        return self._units[start - self._base : end]

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
        kwargs = dl.apply_settings({**arguments_of(loader), "batch_sampler": self.sampler}, config)
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
        self.sampler.restart(self.order)
        with dl.quiet_worker_warning():
            self.iterator = iter(self.loader)
        return self._deliver(self.iterator)

    def _deliver(self, it: Iterator[Any]) -> Iterator[Any]:
        delivered = self.sampler.delivered
        for batch in it:
            self.samples = delivered()
            if self.seen < SEEN_BATCHES:
                self.seen += 1
                self.lengths.add(structure_count(batch))
            yield batch

    def count(self, batch: Any, index: int) -> int:
        """The meter's sample count: the batch the segment handed over last."""
        return self.samples

    def first_batch_unreceived(self) -> Any:
        """One batch from the script's position, which stays where it is (the replay's batch:
        the next setting hands the same samples to the script)."""
        self.sampler.restart(self.order)  # type: ignore[arg-type]
        with dl.quiet_worker_warning():
            it = iter(self.loader)
        try:
            return next(it)
        finally:
            _internals.shut_down(it)

    def ran(self) -> dict[str, Any]:
        """What this setting's loader really ran with (as :meth:`.metered.Metered.ran` says of
        a script's loader): its settings as built, the workers its iterator started, the lengths
        of the batches it handed over."""
        settings = dl.settings_of(self.loader).loader_kwargs()
        if self.sampler.batch_size is None:  # the script's batch sampler decides, as it did
            settings["batch_size"] = self._own_batch_size
        iterator = self.iterator or _internals.live_iterator(self.loader)
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


@dataclass
class Step:
    """What the loop runs next: ``config`` measured over ``window``, or, with ``window=None``,
    unmeasured until the conductor has another step."""

    config: Config
    window: WindowSpec | None = None
    phase: str = "search"
    sink: Sink | None = None
    hang_s: float | None = None


@dataclass
class Outcome:
    """How a measured step went: its measurement, or what the loader raised."""

    step: Step
    measurement: Measurement | None = None
    error: BaseException | None = None
    no_batches: str | None = None  # why the setting yields no batch at all
    epoch_samples: int | None = None
    bytes_per_sample: float | None = None
    transfer: dict[str, float] | None = None
    worker_signals: tuple[int, ...] = ()
    ran: dict[str, Any] = field(default_factory=dict)  # what its loader ran with (Segment.ran)
    extra: dict[str, Any] = field(default_factory=dict)


class Conductor(Protocol):
    """Says which setting runs next and hears how each measured one went."""

    def next_step(self) -> Step | None:
        """The next step; None: none yet (the setting in use goes on, unmeasured)."""

    def finished(self, outcome: Outcome) -> bool:
        """A measured step ended (its workers are still up); True: it worked, keep it running,
        unmeasured, until the next step (False: stop its workers)."""


class _Run:
    """A step in progress: its segment, its meter (None when unmeasured) and its iterator."""

    def __init__(self, step: Step, segment: Segment, replayed: Any = None) -> None:
        self.step, self.segment = step, segment
        self.meter: Meter | None = None
        self.replayed = replayed  # the replay's one batch, handed over again and again
        self.it: Iterator[Any] | None = None
        if step.window is not None:
            self.meter = Meter(
                step.window,
                count=segment.count if replayed is None else structure_counter,
                sink=step.sink,
                sync=dl.cuda_sync,
                measure_cpu=step.config.num_workers == 0 and step.phase != "replay",
            )

    def enter(self, order: EpochOrder) -> None:
        """Go on into ``order``'s epoch (or start in it)."""
        self.segment.order = order
        source: Iterable[Any] = self.segment
        if self.replayed is not None:
            source = dl.Repeat(self.replayed)
        self.it = self.meter.wrap(source) if self.meter is not None else iter(source)


class HotSwap:
    """The script's loader, changing setting as ``conductor`` says. See the module docstring.

    Args:
        loader: the script's loader (:func:`why_not` must be None).
        conductor: says what runs next.
        fall_back: when a measured setting's loader raises, report it and go on with the last
            setting that worked (a real training run); False: let it raise (a trial process,
            which the search then replaces).
    """

    def __init__(self, loader: DataLoader[Any], conductor: Conductor, *, fall_back: bool) -> None:
        why = why_not(loader)
        if why is not None:
            raise ValueError(f"this loader cannot change setting mid-epoch: {why}")
        self.loader = loader
        self.conductor = conductor
        self.fall_back = fall_back
        self.regroup = loader.batch_size is not None
        self.current: _Run | None = None
        self.good: Config | None = None  # the last setting that ran without failing
        self._order: EpochOrder | None = None
        self._pending: list[Any] = []  # batches fetched already, handed over first

    # -- what the script iterates ----------------------------------------------------------------

    def epoch(self) -> Iterator[Any]:
        """What ``iter(loader)`` returns: one epoch's batches, whatever setting is in use."""
        source = self.loader.sampler if self.regroup else self.loader.batch_sampler
        order = self._order = EpochOrder(source)  # type: ignore[arg-type]
        self._pending.clear()  # fetched for an epoch the script has left
        if self.current is not None:
            self.current.enter(order)
        return _Epoch(self, order)

    def _next(self, order: EpochOrder) -> Any:
        if order is not self._order:
            raise StopIteration  # an epoch the script has left
        while True:
            if self._pending:
                return self._pending.pop(0)
            run = self.current
            try:
                if run is None or run.meter is None:
                    step = self.conductor.next_step()
                    if step is None and run is None:
                        if self.good is None:
                            raise RuntimeError("the conductor gave no first setting")
                        step = Step(self.good)
                    if step is not None:
                        run = self._begin(step, order)
                        if run is None:
                            continue
                assert run is not None and run.it is not None
                return next(run.it)
            except StopIteration:
                if run is not None and run.meter is not None and run.meter.done:
                    self._end(run)
                    continue
                raise  # the epoch is over
            except Exception as exc:
                run = self.current  # the step that raised (_begin may have replaced ``run``)
                if not self.fall_back or run is None or run.meter is None or self.good is None:
                    raise
                self._failed(run, exc)

    # -- steps -----------------------------------------------------------------------------------

    def epoch_samples(self, config: Config) -> int | None:
        """Samples per epoch with ``config`` (None: unknown, or the batch sampler decides)."""
        if not self.regroup:
            return None
        try:
            n = len(self.loader.sampler)  # type: ignore[arg-type]
        except TypeError:
            return None
        return n // config.batch_size * config.batch_size if self.loader.drop_last else n

    def _begin(self, step: Step, order: EpochOrder) -> _Run | None:
        """Start ``step`` at the script's position (the setting in use gives way first); None
        when the setting yields no batch at all (reported as such)."""
        if self.current is not None:
            self._close(self.current)
        if self.epoch_samples(step.config) == 0:
            n = len(self.loader.sampler)  # type: ignore[arg-type]
            why = f"drop_last=True with {n} samples < batch_size {step.config.batch_size}"
            self.conductor.finished(Outcome(step, no_batches=why, epoch_samples=0))
            return None
        segment = Segment(self.loader, step.config, regroup=self.regroup, timeout_s=step.hang_s)
        segment.order = order
        replayed = segment.first_batch_unreceived() if step.phase == "replay" else None
        run = self.current = _Run(step, segment, replayed)
        run.enter(order)
        return run

    def _end(self, run: _Run) -> None:
        """The window is full: measure a persistent setting's re-entry, report, go on."""
        meter = run.meter
        assert meter is not None
        m = meter.result()
        cfg = run.step.config
        if (
            cfg.persistent_workers
            and cfg.num_workers
            and run.step.phase != "replay"
            and self.epoch_samples(cfg)
        ):
            t = time.perf_counter()  # a new epoch's start-up with persistent workers
            it = iter(run.segment)  # resumes the workers at the script's position
            try:
                self._pending.append(next(it))  # handed to the script next: nothing is lost
                m.reentry_s.append(time.perf_counter() - t)
                run.it = it
            except StopIteration:
                run.it = None
        elif run.step.phase == "replay":
            run.it = None
        else:
            run.it = meter.iterator
        meter.release()
        outcome = Outcome(
            run.step, measurement=m, epoch_samples=self.epoch_samples(cfg), ran=run.segment.ran()
        )
        if run.replayed is not None:
            outcome.bytes_per_sample = dl.bytes_per_sample(run.replayed)
            outcome.transfer = dl.transfer_rates(run.replayed)
        keep = self.conductor.finished(outcome)
        if keep and run.step.phase != "replay":
            self.good = cfg
        run.meter = None
        if not keep or run.it is None:
            self._close(run)

    def _failed(self, run: _Run, exc: BaseException) -> None:
        """A measured setting's loader raised: report it, take it down, fall back."""
        signals = _internals.dead_worker_signals(run.segment.iterator)
        run.meter = None
        self._close(run)
        _internals.forget_deaths()
        self.conductor.finished(Outcome(run.step, error=exc, worker_signals=signals))

    def _close(self, run: _Run) -> None:
        run.it = None
        if run.meter is not None:
            run.meter.release()
        run.segment.close()
        if self.current is run:
            self.current = None

    def active(self) -> tuple[Meter | None, Any, int]:
        """The running step's meter, DataLoader iterator and worker count (for a failure)."""
        run = self.current
        if run is None:
            return None, None, 0
        return run.meter, run.segment.iterator, run.step.config.num_workers

    def close(self) -> None:
        """Shut down whatever setting is in use."""
        if self.current is not None:
            self._close(self.current)


class _Epoch:
    """The iterator the script's ``for batch in loader`` gets for one epoch."""

    def __init__(self, swap: HotSwap, order: EpochOrder) -> None:
        self._swap, self._order = swap, order

    def __iter__(self) -> _Epoch:
        return self

    def __next__(self) -> Any:
        return self._swap._next(self._order)

    def __len__(self) -> int:
        return len(self._swap.loader)
