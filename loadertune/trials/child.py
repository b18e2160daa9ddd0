"""Inside a script trial: run the user's script as ``python train.py ARGS`` would, and measure it.

Started by :class:`loadertune.trials.script.ScriptRunner` as ``python -m
loadertune.trials.child``, in a new session (its own process group), with the trial's spec in
``$LOADERTUNE_TRIAL`` and one end of a :class:`~loadertune.trials.channel.Channel` as an
inherited file descriptor.

The script gets ``sys.argv``, ``__name__ == "__main__"``, its own directory first on ``sys.path``
and the caller's working directory. :mod:`loadertune.trials.patch` applies the trial's settings
to the target loader when the script creates it and meters the script's own loop over it. When the
window is full, the result goes to the parent. A loader that can change setting mid-epoch
(:mod:`loadertune.trials.hotswap`) then measures the next setting the parent sends, in this same
process (:mod:`loadertune.trials.sequence`); any other loader's process waits for the parent to
snapshot the process tree and kill the group. The script is not run to completion.
"""

from __future__ import annotations

import functools
import json
import os
import runpy
import sys
import time
from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from loadertune.config import Config
from loadertune.measure import failures
from loadertune.measure.meter import Measurement, Meter
from loadertune.trials import _torch_internals as _internals
from loadertune.trials import hotswap, lifeline, messages
from loadertune.trials import loader as dl
from loadertune.trials.channel import Channel
from loadertune.trials.patch import LoaderRecord, OriginalIter, matches_site, patched
from loadertune.trials.runner import window_for
from loadertune.trials.sequence import ChannelConductor, result_message

SPEC_ENV = "LOADERTUNE_TRIAL"
_LINGER_S = 60  # after the result, until the parent kills the group (it does long before)


class ChannelSink:
    """The meter's sink in a trial process: events and progress go to the parent."""

    def __init__(self, chan: Channel) -> None:
        self._chan = chan
        self.stop = False

    def event(self, name: str) -> None:
        bus_id = dl.cuda_bus_id() if name == "window_start" else None
        self._chan.send(messages.EventMsg(t="event", name=name, bus_id=bus_id))

    def progress(self, index: int, samples_per_s: float) -> bool:
        self._chan.send(messages.ProgressMsg(t="progress", i=index, rate=samples_per_s))
        self.stop = self.stop or any(m.get("t") == "stop" for m in self._chan.drain())
        return not self.stop


class _Epoch:
    """Calls DataLoader's own ``__iter__`` when the meter asks for the epoch's iterator."""

    def __init__(self, original: OriginalIter, loader: DataLoader[Any]) -> None:
        self._original, self._loader = original, loader

    def __iter__(self) -> Iterator[Any]:
        return self._original(self._loader)


class TrialController:
    """Applies the trial's settings to the target loader and meters the script's loop over it.

    The target is the loader with ``spec["index"]`` (order of creation), or created at
    ``spec["call_site"]``, or, when neither is given, the first loader the script iterates.
    """

    def __init__(self, spec: dict[str, Any], chan: Channel) -> None:
        self.spec = spec
        self.chan = chan
        self.config = Config.from_kwargs(spec["overrides"]) if spec.get("overrides") else None
        self.target: LoaderRecord | None = None
        self.meter: Meter | None = None
        self.sink = ChannelSink(chan)
        self.loader: DataLoader[Any] | None = None
        self.bytes_per_sample: float | None = None
        self.transfer: dict[str, float] | None = None
        self._original: OriginalIter | None = None
        self.swap: hotswap.HotSwap | None = None  # many settings in this process
        self.conductor: ChannelConductor | None = None
        self._script_batch_size: dict[int, Any] = {}  # per loader, as the script built it
        self._created: list[str] = []  # call sites, in order of creation

    def _is_target(self, record: LoaderRecord) -> bool:
        if self.target is not None:
            return record == self.target
        if self.spec.get("index") is not None:
            return record.index == self.spec["index"]
        if self.spec.get("call_site"):
            return matches_site(record.call_site, self.spec["call_site"])
        return False

    def on_create(self, record: LoaderRecord, arguments: dict[str, Any]) -> dict[str, Any]:
        arguments = lifeline.wrap_worker_init(arguments)  # every loader's workers die with us
        self._script_batch_size[record.index] = arguments.get("batch_size", 1)
        self._created.append(record.call_site)
        if self.config is None or not self._is_target(record):
            return arguments
        out = dl.apply_settings(arguments, self.config)
        if self.config.num_workers and not out.get("timeout"):
            out["timeout"] = self.spec["hang_s"]  # a hung worker becomes an error in next()
        return out

    def on_iter(
        self, loader: DataLoader[Any], record: LoaderRecord, original: OriginalIter
    ) -> Iterator[Any]:
        if self.target is None and (
            self._is_target(record)
            or (self.spec.get("index") is None and not self.spec.get("call_site"))
        ):
            self._start(loader, record, original)
        if record != self.target:
            return original(loader)
        if self.swap is not None:
            return self.swap.epoch()
        if self.meter is None:
            return original(loader)
        why = dl.why_no_batches(loader)
        if why is not None:  # say so, rather than "ended before its first batch" or a
            self._no_batches(why, record)  # StopIteration from next(iter(loader)) in the script
        if self.spec["phase"] == "replay":
            first = next(original(loader))
            self.bytes_per_sample = dl.bytes_per_sample(first)
            self.transfer = dl.transfer_rates(first)
            return self.meter.wrap(dl.Repeat(first))
        return self.meter.wrap(_Epoch(original, loader))

    def _start(self, loader: DataLoader[Any], record: LoaderRecord, original: OriginalIter) -> None:
        self.target, self.loader, self._original = record, loader, original
        settings = dl.settings_of(loader)
        import torch

        dataset = type(loader.dataset)
        one_only = self._hot_swap(loader, settings)
        self.chan.send(
            messages.LoaderMsg(
                t="loader",
                index=record.index,
                call_site=record.call_site,
                settings=settings.loader_kwargs(),
                epoch_samples=dl.epoch_samples(loader),
                dataset=f"{dataset.__module__}.{dataset.__qualname__}",
                batch_sampler=loader.batch_size is None,
                cuda_available=torch.cuda.is_available(),
                warnings=self._sharding_warnings(loader),
                one_setting_only=one_only,
            )
        )
        if self.swap is not None:
            return
        self.meter = Meter(
            window_for(settings, window_s=self.spec["window_s"]),
            count=dl.sample_counter(loader),
            sink=self.sink,
            sync=dl.cuda_sync,
            measure_cpu=loader.num_workers == 0,
            on_done=self._done,
        )

    def _hot_swap(self, loader: DataLoader[Any], settings: Config) -> str | None:
        """Run this process's trials through a HotSwap when the search allows it and the loader
        can change setting mid-epoch (and no loader is replayed first); else why not."""
        why = hotswap.why_not(loader) if self.spec.get("hot_swap") else "one setting asked for"
        if why is not None or dl.why_no_batches(loader) is not None:
            return why or "the first setting yields no batch"
        script_bs = self._script_batch_size.get(self.target.index) if self.target else None
        self.conductor = ChannelConductor(
            self.chan,
            self.spec,
            own=settings,  # the script's own: a trial without overrides comes first
            own_batch_size=script_bs or settings.batch_size,
            make_sink=lambda: ChannelSink(self.chan),
        )
        self.swap = hotswap.HotSwap(loader, self.conductor, fall_back=False)
        return None

    def active(self) -> tuple[Meter | None, Any, int]:
        """The meter, the DataLoader iterator and the workers of the setting measured now."""
        if self.swap is not None:
            return self.swap.active()
        meter = self.meter
        workers = self.loader.num_workers if self.loader is not None else 0
        return meter, meter.iterator if meter is not None else None, workers

    def _sharding_warnings(self, loader: DataLoader[Any]) -> list[str]:
        """In the baseline trial only: does an IterableDataset yield duplicates across workers?"""
        if self.spec["phase"] != "baseline" or not isinstance(loader.dataset, IterableDataset):
            return []
        try:
            dup = dl.duplicated_across_workers(
                loader.dataset, batch_size=loader.batch_size, collate_fn=loader.collate_fn
            )
        except Exception:  # the trial meets and reports the same error itself
            return []
        return [dl.UNSHARDED_WARNING] if dup else []

    def _done(self, m: Measurement) -> None:
        """The window is full: report, then wait for the parent to end this process group."""
        loader = self.loader
        if (
            loader is not None
            and loader.persistent_workers
            and self._original is not None
            and self.spec["phase"] != "replay"
            and dl.epoch_samples(loader)
        ):
            t = time.perf_counter()  # a new epoch's start-up with persistent workers
            next(self._original(loader))
            m.reentry_s.append(time.perf_counter() - t)
        self._report(m, complete=True)
        time.sleep(_LINGER_S)
        os._exit(0)

    def _no_batches(self, why: str, record: LoaderRecord) -> None:
        """The tuned loader yields nothing: report, then wait for the parent to end us."""
        own = (
            self.config is None
            or self.config.batch_size == self._script_batch_size.get(record.index, 1)
            or (
                self.loader is not None and self.loader.batch_size is None
            )  # a batch sampler decides, not the search
        )
        self.chan.send(messages.NoBatchesMsg(t="no_batches", why=why, own_batch_size=own))
        time.sleep(_LINGER_S)
        os._exit(0)

    def _report(self, m: Measurement, *, complete: bool) -> None:
        bytes_per_sample, epoch_samples = self.bytes_per_sample, None
        if self.swap is not None and self.conductor is not None:
            bytes_per_sample = self.conductor.bytes_per_sample
            if self.conductor.step is not None:
                epoch_samples = self.swap.epoch_samples(self.conductor.step.config)
        elif self.loader is not None:
            epoch_samples = dl.epoch_samples(self.loader)
        self.chan.send(
            result_message(
                m,
                complete=complete,
                bytes_per_sample=bytes_per_sample,
                transfer=self.transfer,
                epoch_samples=epoch_samples,
            )
        )

    def script_ended(self, how: str) -> None:
        """The script finished (or exited) before the window was full."""
        meter = self.active()[0]
        partial = meter.finish_now() if meter is not None else None
        if partial is not None:
            self._report(partial, complete=False)
        self.chan.send(
            messages.EndedMsg(
                t="ended", how=how, iterated=self.target is not None, created=self._created
            )
        )


def _report_failure(controller: TrialController, chan: Channel, exc: BaseException) -> None:
    """Send the script's exception: where it came from, its text, its traceback."""
    meter, iterator, num_workers = controller.active()
    signals = _internals.dead_worker_signals(iterator) if iterator is not None else ()
    chan.send(
        messages.FailureMsg(
            t="failure",
            where="loader" if meter is not None and meter.failed_in_next else "script",
            num_workers=num_workers,
            text="\n".join([*map(failures.signal_text, signals), failures.chain_text(exc)]),
            traceback=failures.format_exception(exc),
        )
    )


def run_as_main(script: str, args: list[str]) -> None:
    """Run ``script`` as ``python script args`` would: argv, ``__main__``, its directory first
    on the path."""
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")


def main() -> None:
    spec = json.loads(os.environ.pop(SPEC_ENV))
    chan = Channel.from_fd(spec["fd"])
    lifeline.die_with_parent(spec["parent_pid"])  # and each worker: DieWithTrial
    controller = TrialController(spec, chan)
    how = "the script ended"
    with dl.quiet_worker_warning(), patched(controller):
        error = _internals.contained(functools.partial(run_as_main, spec["script"], spec["args"]))
        if isinstance(error, SystemExit):
            how = f"the script exited with status {error.code}"
        elif error is not None:  # the script's own exception: report it, then end
            _internals.settle(functools.partial(_report_failure, controller, chan, error))
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
    controller.script_ended(how)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
