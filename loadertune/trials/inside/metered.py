"""A loader the trial process meters, across its epochs and its re-creations.

One :class:`Metered` per loader key (:mod:`loadertune.trials.inside.identity`): the loader the trial
tunes, or, while the first trial still looks for the loader that feeds the optimizer
(:mod:`loadertune.trials.inside.target`), each loader that may be it. Each has its own
:class:`~loadertune.measure.meter.Meter`; a candidate's meter reports to a :class:`HeldSink`,
which keeps its events until the candidate is chosen (then hands them on) or dropped.

Every epoch of a metered loader is iterated through a :class:`MeteredEpoch`, which also sees
what the loader really yields: the length of its first batches, so that the trial can report
the batch size it ran with rather than the one it asked for.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import DataLoader

from loadertune.measure.counting import structure_count
from loadertune.measure.meter import Measurement, Meter, Sink
from loadertune.trials import cuda
from loadertune.trials import loader as dl
from loadertune.trials import torch_internals as _internals
from loadertune.trials.contract import window_for
from loadertune.trials.inside.identity import LoaderRecord
from loadertune.trials.inside.patch import OriginalIter, promised_batches

SEEN_BATCHES = 8  # per epoch: the batches whose length is checked


class HeldSink:
    """A meter's sink that holds phases and progress until :meth:`release` names the real one
    (heartbeats pass at once: the trial is alive either way)."""

    def __init__(self, real: Sink) -> None:
        self.real = real
        self._held: list[tuple[str, Any, Any]] = []
        self._released = False

    def event(self, name: str) -> None:
        if self._released or name == "beat":
            self.real.event(name)
        else:
            self._held.append(("event", name, None))

    def progress(self, index: int, samples_per_s: float) -> bool:
        if self._released:
            return self.real.progress(index, samples_per_s)
        self._held.append(("progress", index, samples_per_s))
        return True

    def release(self) -> None:
        """From now on, and for what was held, the real sink hears it all."""
        self._released = True
        for kind, a, b in self._held:
            if kind == "event":
                self.real.event(a)
            else:
                self.real.progress(a, b)
        self._held.clear()


class _Epoch:
    """Calls DataLoader's own ``__iter__`` when the meter asks for the epoch's iterator."""

    def __init__(self, original: OriginalIter, loader: DataLoader[Any]) -> None:
        self._original, self._loader = original, loader

    def __iter__(self) -> Iterator[Any]:
        return self._original(self._loader)


class Metered:
    """One loader (by key), metered over its epochs and re-creations.

    Args:
        record: the first loader of this key that was iterated.
        loader: that loader.
        original: DataLoader's own ``__iter__``.
        sink: the meter's sink (a :class:`HeldSink` for a candidate).
        window_s: the measured window.
        whole_epoch: the window is an epoch (``WindowSpec.whole_epoch``).
        on_full: called with this and the measurement when the window is full.
        on_batch: called with the key and the seconds its ``next()`` took after every batch
            (the optimizer's feed watch), or None.
    """

    def __init__(
        self,
        record: LoaderRecord,
        loader: DataLoader[Any],
        original: OriginalIter,
        *,
        sink: Sink,
        window_s: float,
        whole_epoch: bool = False,
        on_full: Callable[[Metered, Measurement], None],
        on_batch: Callable[[tuple[str, ...], float], None] | None = None,
    ) -> None:
        self.record = record
        self.key = record.identity
        self.loader = loader
        self.original = original
        self.sink = sink
        self.active = True  # False: dropped (not the target); its epochs go on unmeasured
        self.on_batch = on_batch
        self.lengths: set[int] = set()
        self.loaders: list[int] = []  # the index of each loader iterated: re-creations
        self.current: MeteredEpoch | None = None  # the epoch iterated last
        self._window_s, self._whole_epoch, self._on_full = window_s, whole_epoch, on_full
        self.meter = self._new_meter()

    def _new_meter(self, *, mid_epoch: bool = False) -> Meter:
        loader = self.loader
        return Meter(
            window_for(
                dl.settings_of(loader), window_s=self._window_s, whole_epoch=self._whole_epoch
            ),
            mid_epoch=mid_epoch,
            persistent=loader.persistent_workers and loader.num_workers > 0,
            count=dl.sample_counter(loader),
            sink=self.sink,
            sync=cuda.cuda_sync,
            measure_cpu=loader.num_workers == 0,
            on_done=lambda m: self._on_full(self, m),
            epoch_batches=dl.batches_per_epoch(loader),
        )

    def restart(self) -> None:
        """Measure again, from the next batch of the epoch under way: a candidate whose window
        filled before it was known to be the one (the optimizer had not stepped on it twice yet:
        its window held training's first, slow, steps). What its first window sent is dropped."""
        if isinstance(self.sink, HeldSink):
            self.sink = HeldSink(self.sink.real)
        self.meter = self._new_meter(mid_epoch=True)
        self.active = True

    @property
    def recreated(self) -> bool:
        """More than one loader object of this key was iterated (one per epoch, say)."""
        return len(self.loaders) > 1

    def epoch(
        self, loader: DataLoader[Any], record: LoaderRecord, original: OriginalIter
    ) -> Iterator[Any]:
        """The iterator of a new epoch of ``loader``, metered."""
        if record.index not in self.loaders:
            self.loaders.append(record.index)
        self.loader, self.original = loader, original
        self.current = MeteredEpoch(self, self.meter.wrap(_Epoch(original, loader)))
        return self.current

    def replay(self, batch: Any) -> Iterator[Any]:
        """An epoch of one cached batch, metered (the step's rate without loading): endless, or
        as many batches as the loader's length once the script has asked it (a schedule sized
        by it must not step past its end: see :mod:`loadertune.trials.hotswap.swap`)."""
        return MeteredEpoch(self, self.meter.wrap(dl.Repeat(batch, promised_batches(self.loader))))

    def saw(self, batch: Any) -> None:
        self.lengths.add(structure_count(batch))

    def ran(self) -> dict[str, Any]:
        """What the loader really ran with: its settings as built, the workers its iterator
        started, the lengths of the batches seen, and how many loader objects were iterated."""
        loader = self.loader
        iterator: object = self.meter.iterator  # (not ``or``: its truth asks for its length)
        if iterator is None:
            iterator = _internals.live_iterator(loader)
        return {
            "settings": dl.settings_of(loader).loader_kwargs(),
            "workers_started": _internals.workers_started(iterator),
            "batch_lengths": sorted(self.lengths),
            "loaders": len(self.loaders),
        }


class MeteredEpoch:
    """An epoch's iterator: through the meter while it measures, then straight from the loader
    (the window is full, or the loader was dropped as a candidate) so the loop goes on; or, once
    :meth:`hand_over` has taken the rest of the epoch, from what it was handed to."""

    __slots__ = ("_given", "_meter", "_metered", "_n", "_raw", "_rest", "_then", "_wrapped")

    def __init__(self, metered: Metered, meter: Meter) -> None:
        self._metered = metered
        self._meter: Meter | None = meter
        self._wrapped = meter  # the meter this epoch went through last
        self._raw = meter.iterator
        self._n = 0
        self._given = 0  # batches this epoch has given the script
        self._rest: Iterator[Any] | None = None
        self._then: Callable[[Iterator[Any], int], Iterator[Any]] | None = None

    def hand_over(self, then: Callable[[Iterator[Any], int], Iterator[Any]]) -> bool:
        """Take the batches of this epoch the loader has not asked for yet; once the loader has
        handed over what it has in flight (its workers are then shut down), ``then(rest,
        given)`` gives the rest of the epoch (``given``: the batches it gave). False: the
        loader's iterator cannot give them up (its epoch runs to its end)."""
        rest = _internals.take_rest(self._raw)
        if rest is None:
            return False
        self._rest, self._then = rest, then
        return True

    def __iter__(self) -> MeteredEpoch:
        return self

    def __next__(self) -> Any:
        watched = self._metered.on_batch is not None  # (its clock only while it is watched)
        asked = time.perf_counter() if watched else 0.0
        if self._metered.meter is not self._wrapped and self._metered.active:  # restarted
            self._wrapped = self._meter = self._metered.meter.wrap(self._raw)  # type: ignore[arg-type]
        meter = self._meter
        if meter is not None and self._metered.active:
            try:
                batch = next(meter)
            except StopIteration:
                if not meter.done:
                    raise  # the epoch ended
                self._meter = None  # the window ended: go on without it
                batch = self._next_raw()
        else:
            batch = self._next_raw()
        if self._n < SEEN_BATCHES:
            self._n += 1
            self._metered.saw(batch)
        on_batch = self._metered.on_batch
        if on_batch is not None:
            on_batch(self._metered.key, time.perf_counter() - asked)
        self._given += 1
        return batch

    def _next_raw(self) -> Any:
        try:
            return next(self._raw)  # type: ignore[arg-type]
        except StopIteration:
            then, self._then = self._then, None
            if then is None or self._rest is None:
                raise
        _internals.shut_down(self._raw)  # the loader's own workers (persistent ones would idle)
        self._raw = then(self._rest, self._given)
        self._n = SEEN_BATCHES  # (the lengths seen are the loader's own)
        return next(self._raw)
