"""Trials inside the real training run: the search's settings, measured on the live loop.

The search runs in a thread of the training process (:mod:`loadertune.api.live` starts it) and
talks to a :class:`LiveRunner` like to any runner. Each trial it asks for is handed to the
training loop's :class:`~loadertune.trials.hotswap.swap.HotSwap` by :class:`LiveConductor`, on the
main thread, the next time the loop asks for a batch; the loop never stops: between trials, and
while the search decides, the last setting that worked goes on (unmeasured). Every batch is a
real training batch, handed over once per epoch (see :mod:`loadertune.trials.hotswap.swap`): there
is no replay here (:attr:`LiveRunner.replays` is False), which would feed the model one batch again
and again.

The same safety as the search, without ever losing the run: a setting whose loader fails (a
killed worker, a hung one, which the loader's ``timeout`` turns into an error) is recorded as a
failed trial, its workers are shut down and the last good setting takes over at the batch the
loop had reached; a setting past the memory budget is stopped at its next sub-window and treated
the same way. While the tuning runs, a dead worker is reported only where the loop waits for a
batch (never inside the training step). When the search is done, the winner runs to the end.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import DataLoader

from loadertune.config import Config
from loadertune.errors import ScriptError
from loadertune.measure import failures
from loadertune.measure.failures import Failure, FailureKind
from loadertune.trials import cuda
from loadertune.trials import loader as dl
from loadertune.trials import torch_internals as _internals
from loadertune.trials.contract import (
    BaseRunner,
    TrialRequest,
    TrialResult,
    empty_window,
    window_for,
)
from loadertune.trials.hotswap.steps import Outcome, Step
from loadertune.trials.hotswap.swap import HotSwap
from loadertune.trials.inside.epochs import EpochLengths
from loadertune.trials.inside.patch import length_asked
from loadertune.trials.supervisor import Supervisor


class RunEnded(KeyboardInterrupt):
    """Raised in the search's thread when the training run ends (or is interrupted) before the
    search: the search stops as it does on Ctrl-C, its study keeps what it measured, and the
    best setting so far can be saved, marked partial."""


@dataclass
class _Slot:
    """One trial between the two threads: asked for by the search, run by the loop."""

    config: Config | None
    request: TrialRequest
    result: TrialResult | None = None
    sup: Supervisor | None = None
    abort: Failure | None = None  # set by the search's thread: stop at the next sub-window
    done: threading.Event = field(default_factory=threading.Event)


class _Sink:
    """The meter's sink for a live trial: the supervisor's, stopping the window on an abort."""

    def __init__(self, sup: Supervisor, slot: _Slot) -> None:
        self._sup, self._slot = sup, slot

    def event(self, name: str) -> None:
        self._sup.event(name)

    def progress(self, index: int, samples_per_s: float) -> bool:
        return self._slot.abort is None and self._sup.progress(index, samples_per_s)


class LiveConductor:
    """The training loop's side: hands the search's trials to the HotSwap (main thread)."""

    def __init__(self, runner: LiveRunner, report: Callable[[str], None] | None = None) -> None:
        self.runner = runner
        self.report = report
        self.swap: HotSwap | None = None
        self._slot: _Slot | None = None
        self._final: Config | None = None  # the winner, once the search is done
        self._first = True
        self._deaths = contextlib.ExitStack()

    def attach(self, swap: HotSwap) -> None:
        self.swap = swap
        self.runner.loader_ready(swap)

    def next_step(self) -> Step | None:
        self._length_asked()
        if self._first:  # the loop waits for the search's first trial (its baseline) once
            self._first = False
            self._deaths.enter_context(_internals.worker_deaths_deferred(only_while_waiting=True))
            slot = self.runner.take(wait_s=60.0)
        else:
            slot = self.runner.take(wait_s=0.0)
        if slot is None:
            return self._winner()
        assert self.swap is not None
        config = slot.config or self.runner.own
        if self.runner.batch_size_fixed and config.batch_size != self.runner.own.batch_size:
            self._refuse(slot, config)  # asked before the search heard the length was asked
            return None
        self._slot = slot
        cuda.reset_cuda_peaks()
        sup = slot.sup = Supervisor(
            self.runner.root_pid,
            limits=slot.request.limits,
            should_stop=slot.request.should_stop,
            find_gpu=cuda.nvml_index_for_current_device,  # the training's own process
            rests_fail=False,
        )
        sup.workers = config.num_workers
        sup.__enter__()
        asked = slot.request.window
        window = window_for(config, window_s=asked.window_s, whole_epoch=asked.whole_epoch)
        return Step(
            config,
            window,
            phase=slot.request.phase,
            sink=_Sink(sup, slot),
            worker_timeout_s=slot.request.limits.worker_timeout_s,
        )

    def _length_asked(self) -> None:
        """Once the script has asked the loader's length, its batch size stays its own: a
        schedule or a step count sized by ``len(loader)`` (a ``OneCycleLR`` raises at the step
        past its last) counts on that many batches per epoch. A real run keeps every sample,
        so a smaller batch size would give an epoch more steps than it was told, a larger one
        fewer (the schedule would not complete). The search hears it through
        ``batch_size_fixed``, whenever the length is first asked (a scheduler made at the first
        step asks after the tuning has begun)."""
        swap = self.swap
        if self.runner.batch_size_fixed is None and swap is not None and length_asked(swap.loader):
            own = self.runner.own.batch_size
            self.runner.batch_size_fixed = (
                f"the script asked the loader's length (a schedule or a step count sized by "
                f"it?): another batch size than its own {own} would change its steps per "
                "epoch; `loadertune search --batch-sizes` and `loadertune run` change it "
                "from the start instead"
            )

    def _refuse(self, slot: _Slot, config: Config) -> None:
        """Answer ``slot`` without running it: its batch size is no longer the loop's to change."""
        result = TrialResult(config, phase=slot.request.phase)
        result.failure = Failure(
            FailureKind.BATCH_SIZE_REJECTED,
            f"batch size {config.batch_size} not tried: {self.runner.batch_size_fixed}",
            "the batch size stays the script's own during this run",
        )
        slot.result = result
        slot.done.set()

    def _winner(self) -> Step | None:
        """Once the search is done: the winner, if it is not the setting running already."""
        final = self.runner.winner
        if final is not None and self.runner.batch_size_fixed:
            final = self._at_own_batch(final)
        if final is None or final == self._final:
            return None
        self._final = final
        self._deaths.close()  # from now on, a failure is the run's own, as without loadertune
        current = self.swap.current if self.swap is not None else None
        if current is not None and current.step.config == final and current.meter is None:
            return None
        return Step(final)

    def _at_own_batch(self, final: Config) -> Config:
        """The setting to run once the length was asked after the search had finished: the
        winner at another batch size gives way to the best measured at the script's own (or,
        if none was, its own setting), even when the winner is running already."""
        own = self.runner.own
        if final.batch_size == own.batch_size:
            return final
        kept = self.runner.best_at_own or own
        if kept != self._final and self.report is not None:
            self.report(
                f"loadertune: the script asked the loader's length after the tuning picked "
                f"batch size {final.batch_size}: the run goes on at its own {own.batch_size}, "
                f"with {kept.label()} (the best measured there); the saved winner "
                f"({final.label()}) sets it from the start next time"
            )
        return kept

    def finished(self, outcome: Outcome) -> bool:
        self._length_asked()  # before the search hears the result and plans the next
        slot, self._slot = self._slot, None
        if slot is None:
            return True
        config = outcome.step.config
        epoch_samples = self.runner.epoch_lengths.scale(outcome.epoch_samples)
        known = self.runner.epoch_samples
        if epoch_samples and (known is None or epoch_samples < known):
            # the loop ends its epochs early, or a batch sampler's batches told the length
            self.runner.epoch_samples = epoch_samples
            self.runner.loader_info["epoch_samples"] = epoch_samples
        result = TrialResult(config, phase=slot.request.phase, epoch_samples=epoch_samples)
        sup = slot.sup
        assert sup is not None
        if outcome.measurement is not None:
            result.measurement = outcome.measurement
            result.resources = sup.window_ended(outcome.measurement.window_s)
            result.pruned = sup.pruned
            result.failure = slot.abort
            empty_window(result)
        elif outcome.no_batches is not None:
            result.failure = Failure(
                FailureKind.NO_BATCHES,
                f"the loader yielded no batches: {outcome.no_batches}",
                "this batch size is larger than the data",
            )
        elif outcome.error is not None:
            result.failure = failures.classify_exception(
                outcome.error,
                where="loader",
                worker_signals=outcome.worker_signals,
                num_workers=config.num_workers,
            )
            if outcome.loaded_with is not None:
                result.failure = failures.with_this_setting_only(
                    result.failure, outcome.loaded_with.label()
                )
        sup.__exit__(None, None, None)
        result.cuda_peak_allocated_bytes, result.cuda_peak_reserved_bytes = cuda.cuda_peaks()
        result.cuda_capacity_bytes = cuda.cuda_capacity()
        result.cuda_device = cuda.cuda_bus_id()
        result.extra["loader"] = self.runner.loader_info
        slot.result = result
        slot.done.set()
        return result.failure is None  # a failed setting gives way to the last good one

    def close(self) -> None:
        """The loop is done (main thread): restore what the tuning changed."""
        self._deaths.close()


class LiveRunner(BaseRunner):
    """The search's side (its own thread): each ``run`` waits for the training loop to measure
    the setting. See the module docstring.

    Args:
        loader_info: what a script's loader says of itself (index, call site...), for the
            recommendation's workload; filled in when the loop first iterates the loader.
    """

    in_process = True  # its memory budget sits on top of the training's own
    replays = False  # one batch fed again and again is no training batch
    user_error = ScriptError

    def __init__(self) -> None:
        self.uses_cuda = torch.cuda.is_available()
        self.epoch_samples: int | None = None
        self.epoch_lengths = EpochLengths()  # the loader's epochs, as the loop takes them
        self.bytes_per_sample: float | None = None
        self.loader_info: dict[str, Any] = {}
        self.own = Config(1)  # the loader's settings when the loop first iterated it
        self.winner: Config | None = None  # set when the search is done
        # the best measured at ``own``'s batch size: the run's, if its length is asked too late
        self.best_at_own: Config | None = None
        self.root_pid = os.getpid()
        self._slots: queue.Queue[_Slot] = queue.Queue()
        self._ended = threading.Event()
        self._after: list[Callable[[], None]] = []  # work put off until the training is over
        self._after_lock = threading.Lock()

    # -- the training loop's side (main thread) ----------------------------------------------------

    def loader_ready(self, swap: HotSwap) -> None:
        loader: DataLoader[Any] = swap.loader
        self.own = dl.settings_of(loader)
        self.epoch_samples = swap.epoch_samples(self.own)
        dataset = type(loader.dataset)
        self.loader_info.update(
            settings=self.own.loader_kwargs(),
            epoch_samples=self.epoch_samples,
            dataset=f"{dataset.__module__}.{dataset.__qualname__}",
            batch_sampler=loader.batch_size is None,
        )

    def take(self, wait_s: float) -> _Slot | None:
        """The next trial the search asks for (waiting up to ``wait_s``), or None."""
        try:
            return self._slots.get(timeout=wait_s) if wait_s > 0 else self._slots.get_nowait()
        except queue.Empty:
            return None

    def end(self) -> None:
        """The training run is over (or interrupted): the search stops."""
        self._ended.set()

    def idle(self) -> None:
        """The training is over (main thread, once the search's thread is done): do the work
        put off until now (:meth:`when_idle`)."""
        with self._after_lock:
            work, self._after = self._after, []
        for job in work:
            atexit.unregister(job)
            job()

    def close(self) -> None:
        """Nothing to release: the workers belong to the loop's HotSwap."""

    def when_idle(self, work: Callable[[], None]) -> None:
        """Put ``work`` off until the training is over (:meth:`idle`; at the interpreter's
        exit, where nothing calls it). Writing the study (an SQLite set-up, then a copy) costs
        a fraction of a second of CPU and slows the training's epoch by more: this thread holds
        the GIL in pure Python while the training thread wants it back after every
        operator."""
        with self._after_lock:
            if not self._ended.is_set():
                self._after.append(work)
                atexit.register(work)
                return
        work()

    # -- the search's side -------------------------------------------------------------------------

    def _trial(self, config: Config | None, request: TrialRequest) -> TrialResult:
        slot = _Slot(config, request)
        self._slots.put(slot)
        while not slot.done.wait(0.1):
            if self._ended.is_set():
                raise RunEnded("the training run ended before the tuning")
            sup = slot.sup
            hit = sup.sampler.budget_hit if sup is not None else None
            if hit is not None and slot.abort is None and request.limits.memory_budget_bytes:
                slot.abort = failures.memory_budget(hit, request.limits.memory_budget_bytes)
        assert slot.result is not None
        return slot.result
