"""What a :class:`~loadertune.trials.hotswap.swap.HotSwap` runs and reports: the steps a
:class:`Conductor` hands it, how each measured one went (:class:`Outcome`), a step in progress
(:class:`Run`), and which loaders cannot change setting mid-epoch.

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

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from torch.utils.data import DataLoader, IterableDataset

from loadertune.config import Config
from loadertune.measure.meter import Measurement, Meter, Sink, WindowSpec
from loadertune.trials import cuda
from loadertune.trials import loader as dl
from loadertune.trials import torch_internals as _internals
from loadertune.trials.hotswap.segment import EpochOrder, Segment


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


@dataclass
class Step:
    """What the loop runs next: ``config`` measured over ``window``, or, with ``window=None``,
    unmeasured until the conductor has another step."""

    config: Config
    window: WindowSpec | None = None
    phase: str = "search"
    sink: Sink | None = None
    worker_timeout_s: float | None = None  # the DataLoader's timeout (Limits.worker_timeout_s)


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
    loaded_with: Config | None = None  # the setting that loaded the batch ``error`` was for
    ran: dict[str, Any] = field(default_factory=dict)  # what its loader ran with (Segment.ran)
    extra: dict[str, Any] = field(default_factory=dict)


class Conductor(Protocol):
    """Says which setting runs next and hears how each measured one went."""

    def next_step(self) -> Step | None:
        """The next step; None: none yet (the setting in use goes on, unmeasured)."""

    def finished(self, outcome: Outcome) -> bool:
        """A measured step ended (its workers are still up); True: it worked, keep it running,
        unmeasured, until the next step (False: stop its workers)."""


class Run:
    """A step in progress: its segment, its meter (None when unmeasured) and its iterator."""

    def __init__(
        self,
        step: Step,
        segment: Segment,
        replayed: Any = None,
        *,
        mid_epoch: bool = False,
        epoch_batches: int | None = None,
        epoch_left: int | None = None,
    ) -> None:
        self.step, self.segment = step, segment
        self.meter: Meter | None = None
        self.replayed = replayed  # the replay's one batch, handed over again and again
        self.it: Iterator[Any] | None = None
        self.draining = False  # handing over its batches in flight before the next step
        self.loaded_with: Config | None = None  # a setting that loaded the batch it raised for
        if step.window is not None:
            self.meter = Meter(
                step.window,
                count=segment.count,  # (the replayed batch's samples, during a replay)
                sink=step.sink,
                sync=cuda.cuda_sync,
                measure_cpu=step.config.num_workers == 0 and step.phase != "replay",
                mid_epoch=mid_epoch,
                persistent=step.config.persistent_workers and step.config.num_workers > 0,
                epoch_batches=epoch_batches,
                epoch_left=epoch_left,
            )

    def enter(self, order: EpochOrder) -> None:
        """Go on into ``order``'s epoch (or start in it)."""
        self.segment.order = order
        source: Iterable[Any] = self.segment
        if self.replayed is not None:
            source = order.counted(iter(dl.Repeat(self.replayed)))
        self.it = self.meter.wrap(source) if self.meter is not None else iter(source)


@dataclass
class Raised:
    """What a segment's ``next()`` raised, held to be raised to the script in its turn."""

    segment: Segment
    exc: Exception
