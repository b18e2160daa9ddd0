"""Inside a script trial, the script's loaders as the trial sees them: the target loader found
or named, the trial's setting applied to it when the script creates it, the script's own loop
over it metered, and the result sent to the parent (:class:`TrialController`, which
:mod:`loadertune.trials.inside.patch` calls at each loader's creation and ``iter()``).

A loader that can change setting mid-epoch (:mod:`loadertune.trials.hotswap.swap`) measures the next
settings the parent sends in this same process (:mod:`loadertune.trials.inside.sequence`); any other
loader's process, once its result is sent, waits for the parent to snapshot the process tree and
kill the group. The process itself (the script run as ``__main__``, the channel) is
:mod:`loadertune.trials.inside.child`'s.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader

from loadertune.config import Config
from loadertune.measure.meter import Measurement, Meter, elsewhere
from loadertune.trials import cuda, handles, lifeline, messages
from loadertune.trials import loader as dl
from loadertune.trials import torch_internals as _internals
from loadertune.trials.channel import Channel
from loadertune.trials.hotswap import swap as hotswap
from loadertune.trials.hotswap.steps import why_not
from loadertune.trials.inside.epochs import EpochLengths
from loadertune.trials.inside.identity import LoaderRecord, same_key, user_sources
from loadertune.trials.inside.metered import HeldSink, Metered
from loadertune.trials.inside.patch import OriginalIter
from loadertune.trials.inside.sequence import ChannelConductor, ChannelSink, result_message
from loadertune.trials.inside.target import FeedWatch, Selector, optimizer_exists

_LINGER_S = 60  # after the result, until the parent kills the group (it does long before)


class TrialController:
    """Applies the trial's settings to the target loader and meters the script's loop over it.

    The target is named by the spec (``key``, ``index`` or ``call_site``: see
    :class:`~loadertune.trials.inside.target.Selector`), or else found: the loader that feeds the
    optimizer (:class:`~loadertune.trials.inside.target.FeedWatch`). Every loader of the target's
    key gets the settings, also one a framework rebuilt from it and one created again at each epoch,
    and all of them are metered as one.

    Many settings in one process: when the target is known before it is iterated (named by the
    spec), the spec allows it (``hot_swap``), the loader can change setting mid-epoch
    (:func:`~loadertune.trials.hotswap.steps.why_not`) and this is not a rank of a distributed
    trial, its epochs go through a :class:`~loadertune.trials.hotswap.swap.HotSwap` that takes each
    setting from the search (:class:`~loadertune.trials.inside.sequence.ChannelConductor`). Else one
    setting per process, as the LoaderMsg's ``one_setting_only`` says.
    """

    def __init__(self, spec: dict[str, Any], chan: Channel) -> None:
        self.spec = spec
        self.chan = chan
        self.config = Config.from_kwargs(spec["overrides"]) if spec.get("overrides") else None
        self.selector = Selector(spec)
        self.rank: int | None = spec.get("rank")
        self.target_key: tuple[str, ...] | None = self.selector.key
        self.target: Metered | None = None
        self.sink = ChannelSink(chan)
        self.bytes_per_sample: float | None = None
        self.transfer: dict[str, float] | None = None
        self._candidates: dict[tuple[str, ...], Metered] = {}
        self.swap: hotswap.HotSwap | None = None  # many settings in this process
        self.conductor: ChannelConductor | None = None
        self._script_batch_size: dict[int, Any] = {}  # per loader, as the script built it
        self._records: list[LoaderRecord] = []  # in order of creation
        self._chosen_by = "--loader" if self.selector.named else ""
        self.watch = None if self.selector.named else FeedWatch(self._fed, self._epoch_samples)
        self.epoch_lengths = EpochLengths()  # the target's epochs, as the script takes them
        # (each candidate's, while the target is not known: the chosen one's become the target's)
        self._candidate_lengths: dict[tuple[str, ...], EpochLengths] = {}
        self._iters: Counter[tuple[str, ...]] = Counter()  # iter() calls per loader key

    def epochs_begun(self) -> int | None:
        """The tuned loader's epochs this process has begun (its ``iter()`` calls, re-creations
        included, those before it was found too); None while it is not known."""
        key = self.target_key
        if key is None:
            return None
        return sum(n for k, n in self._iters.items() if same_key(k, key))

    @property
    def loader(self) -> DataLoader[Any] | None:
        return self.target.loader if self.target is not None else None

    @property
    def meter(self) -> Meter | None:
        return self.target.meter if self.target is not None else None

    def _is_target(self, record: LoaderRecord) -> bool:
        if self.target_key is not None:
            return same_key(record.identity, self.target_key)
        return self.selector.names(record)

    def on_create(self, record: LoaderRecord, arguments: dict[str, Any]) -> dict[str, Any]:
        arguments = lifeline.wrap_worker_init(arguments)  # every loader's workers die with us
        self._script_batch_size[record.index] = arguments.get("batch_size", 1)
        self._records.append(record)
        if not self._is_target(record):
            return arguments
        self.target_key = record.identity  # its re-creations and rebuilt copies are the target too
        if self.config is None:
            return arguments
        out = dl.apply_settings(arguments, self.config)
        if self.config.num_workers and not out.get("timeout"):
            out["timeout"] = self.spec["worker_timeout_s"]  # a hung worker: an error in next()
        return out

    def on_iter(
        self, loader: DataLoader[Any], record: LoaderRecord, original: OriginalIter
    ) -> Iterator[Any]:
        self._iters[record.identity] += 1
        if self.target_key is None:
            lengths = self._candidate_lengths.setdefault(record.identity, EpochLengths())
        elif same_key(record.identity, self.target_key):
            lengths = self.epoch_lengths
        else:
            return self._epoch(loader, record, original)
        lengths.close()  # (before the next epoch's workers start)
        epoch = self._epoch(loader, record, original)
        return lengths.count(epoch, dl.batches_per_epoch(loader))

    def _epoch(
        self, loader: DataLoader[Any], record: LoaderRecord, original: OriginalIter
    ) -> Iterator[Any]:
        if self.target_key is None and self.watch is not None and self.watch.fed is None:
            return self._candidate_epoch(loader, record, original)
        if self.target_key is None or not same_key(record.identity, self.target_key):
            meter = self.active()[0]  # a validation's pass is left out of its window
            return elsewhere(original(loader), meter, dl.epoch_batches(loader))
        meter = self.meter
        if self.swap is None and self.conductor is not None and meter is not None and meter.done:
            # the first setting was measured on the loader as it ran and its epoch could not be
            # taken over (_swap_now): segments load from this epoch on
            assert self.target is not None  # (its persistent workers go)
            _internals.shut_down(_internals.live_iterator(self.target.loader))
            self.swap = hotswap.HotSwap(loader, self.conductor, fall_back=False, keep_length=True)
        if self.swap is not None:
            return self._swap_epoch(loader)
        if self.target is None:
            self._start(self._metered(loader, record, original, sink=self.sink))
            if self.swap is not None:
                return self._swap_epoch(loader)
        assert self.target is not None
        why = dl.why_no_batches(loader)
        if why is not None:  # say so, rather than "ended before its first batch" or a
            self._no_batches(why, record, loader)  # StopIteration from next(iter(loader))
        if self.spec["phase"] == "replay":
            first = next(original(loader))
            self.bytes_per_sample = dl.bytes_per_sample(first)
            self.transfer = cuda.transfer_rates(first)
            return self.target.replay(first)
        return self.target.epoch(loader, record, original)

    def _swap_epoch(self, loader: DataLoader[Any]) -> Iterator[Any]:
        """The HotSwap's epoch; a loader of the key created again (the search then knows it is
        re-created and runs one setting per process) serves the next epochs' order, the setting
        in use rebuilt over it (:meth:`~loadertune.trials.hotswap.swap.HotSwap.follow`, which counts
        the loaders served for the trial's ``ran``)."""
        assert self.swap is not None
        self.swap.follow(loader)
        return self.swap.epoch()

    def _metered(
        self, loader: DataLoader[Any], record: LoaderRecord, original: OriginalIter, *, sink: Any
    ) -> Metered:
        return Metered(
            record,
            loader,
            original,
            sink=sink,
            window_s=self.spec["window_s"],
            whole_epoch=self.spec.get("whole_epoch", False),
            on_full=self._window_full,
            on_batch=self.watch.yielded if self.watch is not None else None,
        )

    # -- finding the loader that feeds the optimizer (the first trial, no --loader) ------------

    def _candidate_epoch(
        self, loader: DataLoader[Any], record: LoaderRecord, original: OriginalIter
    ) -> Iterator[Any]:
        """An epoch of a loader that may be the one to tune, metered on its own account."""
        candidate = self._candidates.get(record.identity)
        if candidate is None:
            why = dl.why_no_batches(loader)
            if why is not None and not self._candidates:  # the first loader iterated is empty
                self._no_batches(why, record, loader)
            candidate = self._metered(loader, record, original, sink=HeldSink(self.sink))
            self._candidates[record.identity] = candidate
        return candidate.epoch(loader, record, original)

    def _epoch_samples(self, key: tuple[str, ...]) -> int | None:
        candidate = self._candidates.get(key)
        return dl.epoch_samples(candidate.loader) if candidate is not None else None

    def _fed(self, key: tuple[str, ...]) -> None:
        """The optimizer stepped on batches of loader ``key``: it is the one. A window that
        filled before the votes were in held training's first, slow steps: measured again."""
        self._choose(key, "the optimizer", remeasure=True)

    def _choose(self, key: tuple[str, ...], how: str, *, remeasure: bool = False) -> None:
        self.target_key, self._chosen_by = key, how
        self.epoch_lengths = self._candidate_lengths.pop(key, self.epoch_lengths)
        for lengths in self._candidate_lengths.values():
            lengths.close()  # (an epoch the script dropped goes, its workers with it)
        self._candidate_lengths.clear()
        for other_key, other in self._candidates.items():
            if other_key != key:
                other.active = False  # its epochs go on, unmeasured
        chosen = self._candidates.get(key)
        if chosen is not None:
            if remeasure and chosen.meter.done:
                chosen.restart()
            chosen.on_batch = None
            self._start(chosen)
            assert isinstance(chosen.sink, HeldSink)
            chosen.sink.release()

    def _start(self, metered: Metered) -> None:
        """``metered`` is the target: say which loader it is and what it runs with."""
        import torch

        self.target = metered
        loader, record = metered.loader, metered.record
        settings = dl.settings_of(loader)
        one_only = self._hot_swap(loader, settings)
        self.chan.send(
            messages.LoaderMsg(
                t="loader",
                index=record.index,
                call_site=record.call_site,
                key=list(record.identity),
                lines=list(record.lines),
                origin=record.origin,
                chosen_by=self._chosen_by,
                settings=settings.loader_kwargs(),
                epoch_samples=dl.epoch_samples(loader),
                dataset=record.dataset,
                batch_sampler=loader.batch_size is None,
                batch_size_fixed=dl.why_batch_size_fixed(loader),
                cuda_available=torch.cuda.is_available(),
                warnings=self._loader_warnings(loader) + self._also_fed_warnings(),
                one_setting_only=one_only,
                sources=user_sources(),
            )
        )

    def _hot_swap(self, loader: DataLoader[Any], settings: Config) -> str | None:
        """Run this process's trials through a HotSwap when the search allows it and the loader
        can change setting mid-epoch; else why not. A target named by the spec swaps from its
        first epoch; one found while it ran (the loader that feeds the optimizer) runs its first
        setting as it is, and swaps right after that setting's window (:meth:`_swap_now`)."""
        if not self.spec.get("hot_swap"):
            return "one setting asked for"
        if self.rank is not None:
            return "a rank of a distributed trial"
        why = why_not(loader)
        if why is not None or dl.why_no_batches(loader) is not None:
            return why or "the first setting yields no batch"
        assert self.target is not None
        own = Config.from_kwargs(self.spec["own"]) if self.spec.get("own") else settings
        found = self.watch is not None  # the first setting is running already
        self.conductor = ChannelConductor(
            self.chan,
            None if found else self.spec,
            own=own,  # the script's own: a trial without overrides runs them
            own_batch_size=self._script_batch_size.get(self.target.record.index) or own.batch_size,
            make_sink=lambda: ChannelSink(self.chan),
            epoch_scale=lambda samples: self.epoch_lengths.scale(samples),
            epochs_begun=self.epochs_begun,
        )
        if not found:
            self.swap = hotswap.HotSwap(loader, self.conductor, fall_back=False, keep_length=True)
        return None

    def active(self) -> tuple[Meter | None, Any, int]:
        """The meter, the DataLoader iterator and the workers of the setting measured now (for
        a failure: the metered loader whose ``next()`` raised, if one did)."""
        if self.swap is not None:
            return self.swap.active()
        failed = self.failed_loader()
        meter = failed.meter if failed is not None else self.meter
        loader = failed.loader if failed is not None else self.loader
        return (
            meter,
            meter.iterator if meter is not None else None,
            loader.num_workers if loader is not None else 0,
        )

    def _window_full(self, metered: Metered, m: Measurement) -> None:
        """A meter's window is full: the target's is the trial's result. A candidate's, while
        the target is not known, is the result only in a loop without an optimizer."""
        if metered is not self.target:
            if self.target_key is not None or self.watch is None:
                return  # dropped already
            if self.watch.steps or optimizer_exists():  # training has not started: not this one
                metered.active = False
                return
            self.watch.close()
            self._choose(metered.key, "the first loader to fill a window (no optimizer)")
        self._done(m)

    def _loader_warnings(self, loader: DataLoader[Any]) -> list[str]:
        """In the baseline trial only: does an IterableDataset yield duplicates across workers?
        In every launch (a resumed search may run no baseline): does the dataset hold handles
        forked workers share?"""
        unsharded = dl.unsharded_warning(loader) if self.spec["phase"] == "baseline" else None
        return [w for w in (unsharded, handles.loader_fork_warning(loader)) if w]

    def _also_fed_warnings(self) -> list[str]:
        if self.watch is None or self._chosen_by != "the optimizer":
            return []
        return self.watch.also_fed({k: m.record for k, m in self._candidates.items()})

    def _done(self, m: Measurement) -> None:
        """The window is full: report, then wait for the parent to end this process group. A
        rank of a distributed trial goes on training (unmeasured) instead: the other ranks wait
        for it in their collectives until every rank has reported."""
        target = self.target
        if (
            target is not None
            and target.loader.persistent_workers
            and not target.recreated
            and self.spec["phase"] != "replay"
            and dl.epoch_samples(target.loader)
            and self.rank is None
            and self.conductor is None  # (the loop goes on, into a HotSwap: not measured)
        ):
            # a new epoch's start-up with persistent workers, from idle ones (an epoch's end)
            _internals.end_epoch_now(_internals.live_iterator(target.loader))
            t = time.perf_counter()
            next(target.original(target.loader))
            m.reentry_s.append(time.perf_counter() - t)
        self._report(m, complete=True)
        if self.conductor is not None and self.swap is None:
            # the swap stops this setting's workers: not before the search has counted them
            self.conductor.wait_release()
            self._swap_now()
        if self.rank is not None or self.conductor is not None:
            return  # the loop goes on (a rank, or into a HotSwap)
        time.sleep(_LINGER_S)
        os._exit(0)

    def _swap_now(self) -> None:
        """The first setting, measured on the loader as it ran, is done: the settings the search
        sends next take over the rest of this epoch (once the batches in flight are handed over),
        not only from the next one, which may be many minutes away."""
        target = self.target
        assert target is not None and self.conductor is not None
        epoch = target.current
        swap = hotswap.HotSwap(target.loader, self.conductor, fall_back=False, keep_length=True)
        if epoch is not None and epoch.hand_over(swap.rest_of_epoch):
            self.swap = swap

    def _no_batches(self, why: str, record: LoaderRecord, loader: DataLoader[Any]) -> None:
        """The tuned loader yields nothing: report, then wait for the parent to end us."""
        own = (
            self.config is None
            or self.config.batch_size == self._script_batch_size.get(record.index, 1)
            or dl.why_batch_size_fixed(loader) is not None
        )
        self.chan.send(messages.NoBatchesMsg(t="no_batches", why=why, own_batch_size=own))
        time.sleep(_LINGER_S)
        os._exit(0)

    def _report(self, m: Measurement, *, complete: bool) -> None:
        bytes_per_sample, epoch_samples = self.bytes_per_sample, None
        ran: dict[str, Any] = {}
        if self.swap is not None and self.conductor is not None:
            bytes_per_sample = self.conductor.bytes_per_sample
            if self.conductor.step is not None:
                epoch_samples = self.swap.epoch_samples(self.conductor.step.config)
            if self.swap.current is not None:
                ran = {**self.swap.current.segment.ran(), "loaders": self.swap.n_loaders}
        elif self.target is not None:
            mean_batch = m.n_samples / m.n_batches if m.n_batches else None
            epoch_samples = dl.epoch_samples(self.target.loader, mean_batch)
            ran = self.target.ran()
        epoch_samples = self.epoch_lengths.scale(epoch_samples)
        self.chan.send(
            result_message(
                m,
                complete=complete,
                bytes_per_sample=bytes_per_sample,
                transfer=self.transfer,
                epoch_samples=epoch_samples,
                ran=ran,
                rank=self.rank,
                epochs_begun=self.epochs_begun(),
            )
        )

    def raised_after_training(self) -> bool:
        """The script's exception came after its loop over the tuned loader: that loader's last
        epoch ran to its end, no other began, and no loader's ``next()`` raised. Code after the
        training (a checkpoint's upload, an evaluation, a final ``raise``) runs once a run is
        over; a trial process seldom gets there, and when it does its figures stand rather
        than the script's error ending the search and losing every trial of it."""
        return (
            self.target is not None
            and self.failed_loader() is None
            and self.epoch_lengths.between_epochs()
            # (after its first epoch, code that raises is more likely a bug every epoch meets:
            # a print of a figure the loop never set)
            and (self.epochs_begun() or 0) >= 2
        )

    def failed_loader(self) -> Metered | None:
        """The metered loader whose ``next()`` raised, if one did."""
        for metered in [self.target, *self._candidates.values()]:
            if metered is not None and metered.meter.failed_in_next:
                return metered
        return None

    def script_ended(self, how: str) -> None:
        """The script finished (or exited) before the window was full."""
        if self.target is None:  # no optimizer stepped: the first loader whose window opened
            opened = [c for c in self._candidates.values() if c.meter.finish_now() is not None]
            if opened:
                self._choose(opened[0].key, "the first loader measured (no optimizer step)")
        meter = self.active()[0]
        partial = meter.finish_now() if meter is not None else None
        if partial is not None:
            self._report(partial, complete=False)
        self.chan.send(
            messages.EndedMsg(
                t="ended",
                how=how,
                iterated=self.target is not None,
                created=[r.call_site for r in self._records],
                epochs_begun=self.epochs_begun(),
            )
        )
