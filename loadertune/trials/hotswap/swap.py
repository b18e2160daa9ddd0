"""Many settings in one pass over the data: the script's loop keeps receiving batches while the
setting of the loader under it changes.

When the script iterates the tuned loader, it gets a :class:`HotSwap`'s epoch instead of the
loader's own iterator. Each setting runs as a :class:`~loadertune.trials.hotswap.segment.Segment`:
a plain ``DataLoader`` built from the script's loader (its dataset, sampler order, ``collate_fn``,
``worker_init_fn``, ``timeout``, ``generator``, multiprocessing context...) with the setting applied
and, as its batch sampler, the part of the epoch the script has not received yet. When a setting is
done, its workers are shut down and the next one starts where the script is; when an epoch ends, the
setting in use carries on into the next one. A :class:`Conductor` says which setting comes next and
hears how each one went: the search in a script's trial process
(:mod:`loadertune.trials.inside.sequence`), or the tuner inside a real training run
(:mod:`loadertune.trials.hotswap.live_runner`).

**Nothing is skipped or seen twice within an epoch**, and what differs from iterating one
loader: see :mod:`loadertune.trials.hotswap.segment`. What is swapped and what is not (a custom
``batch_sampler`` is): :mod:`loadertune.trials.hotswap.steps`.

**A script that asked its loader's length gets no more batches per epoch** (``keep_length``,
in a trial process): see :mod:`loadertune.trials.hotswap.lengths`.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader

from loadertune.config import Config
from loadertune.measure.meter import Meter
from loadertune.trials import cuda
from loadertune.trials import loader as dl
from loadertune.trials import torch_internals as _internals
from loadertune.trials.hotswap.lengths import SwapLengths
from loadertune.trials.hotswap.segment import EpochOrder, Segment, loads_next_batch
from loadertune.trials.hotswap.steps import Conductor, Outcome, Raised, Run, Step, why_not
from loadertune.trials.inside.patch import mark_length_asked


class HotSwap:
    """The script's loader, changing setting as ``conductor`` says. See the module docstring.

    Args:
        loader: the script's loader (:func:`why_not` must be None).
        conductor: says what runs next.
        fall_back: when a measured setting's loader raises, report it and go on with the last
            setting that worked (a real training run); False: let it raise (a trial process,
            which the search then replaces).
        keep_length: an epoch gives at most ``len(loader)`` batches once anything has asked it
            (a trial process; see :mod:`~loadertune.trials.hotswap.lengths`); False: every sample.
        drain: before the next step starts, hand over the batches the workers of the setting in
            use have in flight (a real training run: they are loading work done already, and
            throwing them away slows the tuned epochs noticeably); False: drop them, the next
            setting fetches them again (a trial process, where the steps on them would only
            delay the next window).
    """

    def __init__(
        self,
        loader: DataLoader[Any],
        conductor: Conductor,
        *,
        fall_back: bool,
        keep_length: bool = False,
        drain: bool = False,
    ) -> None:
        why = why_not(loader)
        if why is not None:
            raise ValueError(f"this loader cannot change setting mid-epoch: {why}")
        self.loader = loader
        self.conductor = conductor
        self.fall_back = fall_back
        self.keep_length = keep_length
        self.drain = drain
        self.regroup = loader.batch_size is not None
        self.lengths = SwapLengths(loader, regroup=self.regroup, keep_length=keep_length)
        self.current: Run | None = None
        self.good: Config | None = None  # the last setting that ran without failing
        self._order: EpochOrder | None = None
        self._pending: list[Any] = []  # batches fetched already, handed over first
        self._deferred: Step | None = None  # came at an epoch's end: starts with the next
        self.n_loaders = 1  # the script's loaders this swap has served (created again: more)

    # -- what the script iterates ----------------------------------------------------------------

    def epoch(self) -> Iterator[Any]:
        """What ``iter(loader)`` returns: one epoch's batches, whatever setting is in use."""
        source = self.loader.sampler if self.regroup else self.loader.batch_sampler
        order = EpochOrder(source, limit=self.lengths.limit(), batches=not self.regroup)  # type: ignore[arg-type]
        return self._enter(order)

    def follow(self, loader: DataLoader[Any]) -> None:
        """The script created its loader again (a new one every epoch, with this epoch's
        order): the next epochs come from ``loader``'s sampler. The setting in use starts again
        over it, new workers and all: its dataset, collate and worker set-up may differ from
        the last loader's, whose workers must not serve the new one's samples (a loader
        created every epoch starts its workers every epoch anyway)."""
        if loader is self.loader:
            return
        self.loader = self.lengths.loader = loader
        self.n_loaders += 1
        run = self.current
        if run is None:
            return
        if run.draining:  # its batches in flight were of the last loader's epoch
            self._close(run)
            return
        run.segment.close()
        run.segment = Segment(
            loader, run.step.config, regroup=self.regroup, timeout_s=run.step.worker_timeout_s
        )
        self._show(run.step.config)

    def rest_of_epoch(self, batches: Iterator[Any], given: int) -> Iterator[Any]:
        """The rest of an epoch the script's own loader began and gave ``given`` batches of:
        ``batches``, those its batch sampler has not given yet
        (:func:`~loadertune.trials.torch_internals.take_rest`). At another batch size they are
        regrouped as one stream of samples; with ``drop_last`` the script's batch sampler has
        dropped its short tail already, and each setting then drops its own."""
        units = itertools.chain.from_iterable(batches) if self.regroup else batches
        return self._enter(
            EpochOrder(units, limit=self.lengths.limit(), given=given, batches=not self.regroup)
        )

    def _enter(self, order: EpochOrder) -> Iterator[Any]:
        if self._order is not None and not self.regroup:  # the epoch left: its batches' count
            self.lengths.sampler_samples = self._order.samples() or self.lengths.sampler_samples
        self._order = order
        self._pending.clear()  # fetched for an epoch the script has left
        if self.current is not None and self.current.draining:
            self._close(self.current)  # its batches in flight were of the epoch left
        if self.current is not None:
            self.current.enter(order)
        return _Epoch(self, order)

    def _next(self, order: EpochOrder) -> Any:
        if order is not self._order:
            raise StopIteration  # an epoch the script has left
        while True:
            if self._pending:
                batch = self._pending.pop(0)
                if isinstance(batch, Raised):  # (the re-entry's first batch raised)
                    if self.current is not None and self._ours(self.current, batch.exc):
                        self._recover(self.current, batch.exc)
                        continue
                    batch.segment.passed_on(batch.exc)
                    raise batch.exc
                return batch
            run = self.current
            try:
                if run is not None and run.draining:
                    assert run.it is not None
                    return next(run.it)
                if run is None or run.meter is None:
                    run = self._next_run(run, order)
                    if run is None:
                        continue
                assert run.it is not None
                return next(run.it)
            except StopIteration:
                if run is not None and run.meter is not None and run.meter.done:
                    self._end(run)
                    continue
                if run is not None and run.draining:
                    self._close(run)  # drained: the next step begins where it ended
                    continue
                raise  # the epoch is over
            except Exception as exc:
                if not self._handled(exc):
                    raise

    def _next_run(self, run: Run | None, order: EpochOrder) -> Run | None:
        """No measured step is under way (``run``: the setting in use, unmeasured, if any): the
        conductor's next step begins here, or ``run`` goes on; None: look again (the step
        waits for batches in flight, or yields no batch at all). Raises StopIteration where
        the step starts with the next epoch."""
        step, self._deferred = self._deferred or self.conductor.next_step(), None
        if step is None and run is None:
            if self.good is None and not self.fall_back:
                raise RuntimeError("the conductor gave no first setting")
            # A real run whose tuning gave no setting that worked (its baseline failed, the
            # search ended) goes on with the loader's own.
            step = Step(self.good or dl.settings_of(self.loader))
        if step is None:
            return run
        if self._nothing_left(step, order):
            # nothing of this epoch is left to give (a whole-epoch window ended it): the step
            # starts with the next epoch, from its start
            self._deferred = step
            raise StopIteration
        if self._drains(run):
            self._deferred = step  # starts where the batches in flight end
            return None
        return self._begin(step, order)

    def _handled(self, exc: Exception) -> bool:
        """What the step in use raised: True where the loop goes on without it (a step handing
        over its batches in flight, loadertune's own failure, a measured setting's failure in a
        real run); False where the script gets it, as its own loader would raise it."""
        run = self.current  # the step that raised (_begin may have replaced the last one)
        if run is not None and run.draining:  # the next step fetches the rest again
            self._close(run)
            _internals.forget_deaths()
            return True
        if run is not None and self._ours(run, exc):
            self._recover(run, exc)
            return True
        if (
            not self.fall_back
            or run is None
            or run.meter is None
            or self.good is None
            or self._bad_record(run, exc)
        ):
            if run is not None:
                run.segment.passed_on(exc)  # to the script, which may go on
            return False
        self._failed(run, exc)
        return True

    # -- steps -----------------------------------------------------------------------------------

    def epoch_samples(self, config: Config) -> int | None:
        """Samples per epoch with ``config`` (None: unknown; see :class:`SwapLengths`)."""
        return self.lengths.epoch_samples(config, self._order)

    def _drains(self, run: Run | None) -> bool:
        """Begin handing over ``run``'s batches in flight, and no more of its epoch (with
        ``drain``, for a setting with workers): True when it has begun."""
        if not self.drain or run is None or run.it is None or not run.step.config.num_workers:
            return False
        if _internals.take_rest(run.segment.iterator) is None:
            return False
        run.draining = True
        return True

    def _take_in_flight(self, run: Run, batches: Iterator[Any]) -> None:
        """Fetch ``run``'s batches in flight now, to be handed over first (``_pending``): its
        workers then sit idle, as at an epoch's start. A failure keeps those fetched; the
        rest are fetched again by what comes next."""
        if _internals.take_rest(run.segment.iterator) is None:
            return
        try:
            self._pending.extend(batches)
        except Exception:
            _internals.forget_deaths()

    def _nothing_left(self, step: Step, order: EpochOrder) -> bool:
        """The epoch has no batch left for ``step`` (with ``drop_last``, a whole one), though
        the next epoch will (one that never would is reported by :meth:`_begin`)."""
        need = step.config.batch_size if self.regroup and self.loader.drop_last else 1
        return self.epoch_samples(step.config) != 0 and not order.has_left(need)

    def _begin(self, step: Step, order: EpochOrder) -> Run | None:
        """Start ``step`` at the script's position (the setting in use gives way first); None
        when the setting yields no batch at all (reported as such)."""
        if self.current is not None:
            self._close(self.current)
        if self.epoch_samples(step.config) == 0:
            if self.regroup:
                n = len(self.loader.sampler)  # type: ignore[arg-type]
                why = f"drop_last=True with {n} samples < batch_size {step.config.batch_size}"
            else:
                why = dl.why_no_batches(self.loader) or "its batch sampler yields no batch"
            self.conductor.finished(Outcome(step, no_batches=why, epoch_samples=0))
            return None
        segment = Segment(
            self.loader, step.config, regroup=self.regroup, timeout_s=step.worker_timeout_s
        )
        self._show(step.config)
        segment.order = order
        replayed = segment.first_batch_unreceived() if step.phase == "replay" else None
        started = order.position > 0 or order.given > 0  # the script is in the epoch's middle
        batches = self.lengths.epoch_batches(step, order)
        run = self.current = Run(
            step,
            segment,
            replayed,
            mid_epoch=started,
            epoch_batches=batches,
            epoch_left=self.lengths.batches_left(step, order) if started and batches else None,
        )
        run.enter(order)
        return run

    def _show(self, config: Config) -> None:
        """The script's loader says what runs now (``loader.num_workers`` and the rest): a script
        that logs them, or decides by them, reads the setting its batches come from. Set past
        DataLoader's guard against changing them after ``__init__``: the loader itself is not
        iterated while it is swapped (its segments are built from what it held at the start,
        each with its own setting applied)."""
        shown = {**config.loader_kwargs(), "prefetch_factor": config.prefetch_factor}
        if not self.regroup:
            del shown["batch_size"]  # the script's batch sampler decides, as before
        for name, value in shown.items():
            object.__setattr__(self.loader, name, value)

    def _end(self, run: Run) -> None:
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
            if meter.iterator is not None:  # timed from idle workers, as at an epoch's end;
                self._take_in_flight(run, meter.iterator)  # resuming would throw them away
            t = time.perf_counter()  # a new epoch's start-up with persistent workers
            it = iter(run.segment)  # resumes the workers at the script's position
            try:
                self._pending.append(next(it))  # handed to the script next: nothing is lost
                m.reentry_s.append(time.perf_counter() - t)
                run.it = it
            except StopIteration:
                run.it = None
            except Exception as exc:  # the script gets it next, as its own loader would raise it
                self._pending.append(Raised(run.segment, exc))
                run.it = it
        elif run.step.phase == "replay":
            run.it = None
        else:
            run.it = meter.iterator
        meter.release()
        outcome = Outcome(
            run.step,
            measurement=m,
            epoch_samples=self.epoch_samples(cfg),
            ran={**run.segment.ran(), "loaders": self.n_loaders},
        )
        if run.replayed is not None:
            outcome.bytes_per_sample = dl.bytes_per_sample(run.replayed)
            outcome.transfer = cuda.transfer_rates(run.replayed)
        keep = self.conductor.finished(outcome)
        if keep and run.step.phase != "replay":
            self.good = cfg
        run.meter = None
        if not keep or run.it is None:
            self._close(run)

    def _bad_record(self, run: Run, exc: BaseException) -> bool:
        """Whether the batch ``run``'s measured setting raised for (the dataset's or
        ``collate_fn``'s error) raises with the last good setting too: a bad record, which no
        setting loads. Its error then goes to the script, which may skip the batch and go on
        (torch's iterator goes on), and so does the measured step, rather than the search
        stopping at the first bad record. Otherwise the setting caused it (a dataset whose
        state does not survive the workers' start), and it fails; :meth:`_failed` says so. The
        check loads that one batch once more, at the script's position; its time is left out
        of the window."""
        if run.step.phase == "replay" or not run.segment.ends_batch(exc) or self.good is None:
            return False
        meter = run.meter
        assert meter is not None
        since, t = meter.place(), time.perf_counter()
        good = self.good
        if self.regroup and good.batch_size != run.step.config.batch_size:
            good = dataclasses.replace(good, batch_size=run.step.config.batch_size)
        bad = not loads_next_batch(
            self.loader,
            good,
            self._order,
            regroup=self.regroup,
            timeout_s=run.step.worker_timeout_s,
        )
        meter.left_out(time.perf_counter() - t, since)
        run.loaded_with = None if bad else good
        return bad

    def _ours(self, run: Run, exc: BaseException) -> bool:
        """Whether ``exc`` is loadertune's failure, not the script's to see: in a real run
        (``fall_back``), the workers of a loader built with a setting or a ``timeout`` the
        script did not ask for stalled past that timeout or died."""
        if not self.fall_back or run.segment.ends_batch(exc):
            return False
        return run.step.worker_timeout_s is not None or run.step.config != dl.settings_of(
            self.loader
        )

    def _recover(self, run: Run, exc: BaseException) -> None:
        """Take down the loader that failed (a measured one's failure is recorded) and go on
        with the loader's own setting, with no timeout of ours, where the epoch's order stands:
        nothing the script has not received is lost."""
        if run.meter is not None:
            self._failed(run, exc)
        else:
            self._close(run)
            _internals.forget_deaths()
        if self.good == run.step.config:
            self.good = None  # the kept setting failed: the loader's own takes over

    def _failed(self, run: Run, exc: BaseException) -> None:
        """A measured setting's loader raised: report it, take it down, fall back."""
        signals = _internals.dead_worker_signals(run.segment.iterator, exc)
        run.meter = None
        self._close(run)
        _internals.forget_deaths()
        self.conductor.finished(
            Outcome(run.step, error=exc, worker_signals=signals, loaded_with=run.loaded_with)
        )

    def _close(self, run: Run) -> None:
        run.it = None
        if run.meter is not None:
            run.meter.release()
        run.segment.close()
        if self.current is run:
            self.current = None

    @property
    def measuring(self) -> bool:
        """A measured step is under way, or waits for the next epoch to start."""
        return self._deferred is not None or (
            self.current is not None and self.current.meter is not None
        )

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
        mark_length_asked(self._swap.loader)  # a progress bar, a schedule sized by it
        return len(self._swap.loader)
