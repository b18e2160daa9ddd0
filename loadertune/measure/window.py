"""What a measurement is: the window it runs (:class:`WindowSpec`), what it showed
(:class:`Measurement`), and who hears about it while it runs (:class:`Sink`). The
:class:`~loadertune.measure.meter.Meter` takes the first, tells the third and returns the second.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class WindowSpec:
    """How long to measure.

    Attributes:
        warmup_batches: batches consumed after the first one and before the window; at least the
            batches in flight (``num_workers * prefetch_factor``): a full buffer must not
            inflate the window.
        settled_after: the warm-up may end sooner, once this many batches have come (every
            worker has started and delivered), at the first ``next()`` that waited
            :data:`~loadertune.measure.meter_window.SETTLED_WAIT_S` or more: the buffer is empty and
            the loader sets the pace from there on, so draining the rest by count would only
            wait for batches that are not there (with seconds-long batches, a minute). None: by
            count only.
        window_s: seconds of the measured window.
        min_window_batches: the window also lasts at least this many batches, unless it has
            lasted twice ``window_s`` already (a few slow batches measure a slow loop as well
            as many fast ones: a window of seconds-long batches must not take a minute).
        n_sub_windows: the window is split in this many equal-time parts, each reported.
        round_batches: batches per round of the workers (``num_workers``; 1 without workers).
            Workers deliver in turn and start together, and each takes about as long per batch,
            so batches arrive in bursts of one per worker, a batch-time apart: a window or
            sub-window shorter than a round measures a burst or a gap, not the rate. Sub-windows
            (and so the window) end only after whole rounds, unless the loop hardly waits for
            data (then batches come at the step's pace).
    """

    warmup_batches: int
    window_s: float
    min_window_batches: int = 4
    n_sub_windows: int = 4
    settled_after: int | None = None
    round_batches: int = 1
    whole_epoch: bool = False

    def is_full(self, elapsed_s: float, batches: float) -> bool:
        """The window has run its length: ``window_s`` and ``min_window_batches``, or twice
        ``window_s`` whatever the batches (a whole epoch: only the latter; its end ends it)."""
        if self.whole_epoch:
            return elapsed_s >= 2 * self.window_s
        return elapsed_s >= self.window_s and (
            batches >= self.min_window_batches or elapsed_s >= 2 * self.window_s
        )

    def __post_init__(self) -> None:
        if (
            self.warmup_batches < 0
            or self.window_s <= 0
            or self.n_sub_windows < 1
            or (self.settled_after is not None and self.settled_after < 0)
            or self.round_batches < 1
            or (self.whole_epoch and self.warmup_batches)
        ):
            raise ValueError(f"invalid window: {self}")


class Sink(Protocol):
    """Who hears about a trial while it runs (the supervisor, in this process or another)."""

    def event(self, name: str) -> None:
        """``"first_batch"``, ``"window_start"``, ``"window_end"``, ``"beat"`` (a heartbeat) or
        ``"rest"`` (an epoch ended before the window did; the next ``wrap`` beats)."""

    def progress(self, index: int, samples_per_s: float) -> bool:
        """Sub-window ``index`` ended with this running rate; return False to stop (pruned)."""


class NullSink:
    def event(self, name: str) -> None:
        pass

    def progress(self, index: int, samples_per_s: float) -> bool:
        return True


@dataclass
class Measurement:
    """What one measured window showed. Rates count samples, not batches."""

    samples_per_s: float  # steady state over the window
    sub_window_samples_per_s: list[float]
    blocked_fraction: float  # of the window's wall time spent waiting in next()
    first_batch_s: float  # iter() to the first batch: worker start-up and first fetch
    warmup_s: float
    window_s: float
    n_samples: int
    n_batches: int
    complete: bool  # the window ran its full length
    stopped_early: bool = False  # a progress() call asked to stop (pruned)
    reentry_s: list[float] = field(default_factory=list)  # first batch after each re-entry
    # the loop's time between an epoch's end and the next iter() (validation, logging), each seen
    rest_s: list[float] = field(default_factory=list)
    blocked_cpu_fraction: float | None = None  # CPU time / wall time inside next(), if measured
    # run-queue wait / wall time inside next(): ready to run while the CPUs ran other work
    blocked_wait_fraction: float | None = None
    step_s_per_batch: float = 0.0  # mean time between next() calls: the loop body
    whole_epoch: bool = False  # the window was an epoch, from its start to its end

    @property
    def blocked_busy_fraction(self) -> float | None:
        """The share of the time inside ``next()`` that loading ran or waited for a CPU (None:
        not measured). Low: it waited on I/O. The CPU time alone reads low too when other
        processes hold the CPUs, making loading that computes look like loading that waits:
        the run-queue wait counts as busy here."""
        if self.blocked_cpu_fraction is None:
            return None
        return min(1.0, self.blocked_cpu_fraction + (self.blocked_wait_fraction or 0.0))

    @property
    def spread(self) -> float | None:
        """Relative spread of the sub-window rates: (max - min) / median; None with fewer than
        two sub-windows (unknown, not 0: one sub-window's "spread 0%" would read as a precise
        figure)."""
        rates = [r for r in self.sub_window_samples_per_s if r > 0]
        if len(rates) < 2:
            return None
        return (max(rates) - min(rates)) / statistics.median(rates)

    @property
    def low_confidence(self) -> bool:
        return not self.complete or self.n_batches < 3

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["spread"] = self.spread
        data["low_confidence"] = self.low_confidence
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Measurement:
        """The measurement :meth:`to_dict` wrote (its derived figures are left out)."""
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


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
