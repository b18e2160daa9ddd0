"""Run trials in this process, on a dataset object and a step function (``tune_loader``).

Why not a fresh process per trial: a process forked after torch has used its OpenMP thread pool
deadlocks in its first parallel kernel (torch's own workers avoid it by running one thread), so a
forked trial could not run the user's step as it really runs. Trials therefore run here, like the
user's training would, and are contained instead: a watchdog thread stops a hung trial or one over
the memory budget by killing its workers (the loader then raises) and, as a last resort,
interrupting the main thread; every worker the trial started is gone when it returns. Scripts get
full process isolation in :mod:`loadertune.trials.script.runner`.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import psutil
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from loadertune import signals
from loadertune.config import Config
from loadertune.errors import UserCodeError
from loadertune.measure.failures import Failure, FailureKind, classify_exception
from loadertune.measure.meter import Meter, WindowSpec
from loadertune.measure.resources import multiprocessing_helper
from loadertune.trials import cuda, handles, leftovers, lifeline
from loadertune.trials import loader as dl
from loadertune.trials import torch_internals as _internals
from loadertune.trials.contract import BaseRunner, Limits, TrialRequest, TrialResult
from loadertune.trials.supervisor import Supervisor


def _children() -> dict[int, psutil.Process]:
    try:
        return {p.pid: p for p in psutil.Process().children(recursive=True)}
    except psutil.Error:
        return {}


def kill_new_children(before: set[int], grace_s: float = 3.0) -> int:
    """SIGKILL every descendant of this process not in ``before`` (multiprocessing's own helpers
    excepted; the workers they started are not spared); return how many there were."""
    new = [
        p for pid, p in _children().items() if pid not in before and not multiprocessing_helper(p)
    ]
    for p in new:
        with contextlib.suppress(psutil.Error):
            p.kill()
    gone, _ = psutil.wait_procs(new, timeout=grace_s)
    _internals.tell_multiprocessing({p.pid: p.returncode for p in gone})
    leftovers.remove_leftovers(p.pid for p in gone)
    return len(new)


class _Watchdog:
    """Stops an in-process trial the supervisor says must stop."""

    def __init__(self, sup: Supervisor, before: set[int], interrupt_grace_s: float = 3.0) -> None:
        self._sup = sup
        self._before = before
        self._grace_s = interrupt_grace_s
        self._done = threading.Event()
        # Held while the trial's end is marked, and while the interrupt is sent: an interrupt is
        # sent only while the trial runs (one sent as the trial ended by itself reached the
        # code after it as a KeyboardInterrupt: the next test, or the user's program).
        self._ending = threading.Lock()
        self._main = (
            threading.get_ident() if threading.current_thread() is threading.main_thread() else None
        )
        self.failure: Failure | None = None
        self.interrupted = False
        self._thread = threading.Thread(target=self._run, name="loadertune-watchdog", daemon=True)

    def __enter__(self) -> _Watchdog:
        # The interrupt needs Python's own SIGINT handler. A process started in the background
        # by a shell without job control (nohup, `cmd &` in a script) inherits SIGINT ignored,
        # and a hung step would never be interrupted: restore the handler for the trial.
        self._sigint = signal.getsignal(signal.SIGINT) if self._main is not None else None
        if self._main is not None and not callable(self._sigint):
            signal.signal(signal.SIGINT, signal.default_int_handler)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            with self._ending:
                self._done.set()
            self._thread.join(timeout=5)
        finally:  # (an interrupt sent just before the end is raised here)
            if self._main is not None and not callable(self._sigint):
                signal.signal(signal.SIGINT, self._sigint)

    def _run(self) -> None:
        while not self._done.wait(0.1):
            failure = self._sup.expired()
            if failure is None:
                continue
            self.failure = failure
            kill_new_children(self._before, grace_s=1.0)  # next() in the loop now raises
            if self._done.wait(self._grace_s) or self._main is None:
                return
            with self._ending:
                if not self._done.is_set():  # stuck outside the loader (in the step)
                    self.interrupted = True
                    signal.pthread_kill(self._main, signal.SIGINT)
            return


class InlineRunner(BaseRunner):
    """Trials over ``dataset`` in this process; see the module docstring.

    Args:
        dataset: any map-style or iterable dataset.
        step: ``step(batch)``, the user's training step; None to tune loading alone (with CUDA, the
            batch is then copied to the GPU, as training would).
        fixed: the user's other DataLoader arguments (collate_fn, sampler, shuffle...), untouched.
    """

    def __init__(
        self,
        dataset: Dataset[Any],
        *,
        step: Callable[[Any], Any] | None = None,
        fixed: Mapping[str, Any] | None = None,
    ) -> None:
        self.dataset = dataset
        self.fixed = dict(fixed or {})
        self.in_process = True
        self.user_error = UserCodeError
        self.cuda_available = torch.cuda.is_available()
        self._user_step = step
        self.uses_cuda = self._step_uses_cuda()
        self._where = "loader"
        self.bytes_per_sample: float | None = None
        self._transfer: dict[str, float] | None = None
        self.gpu_index: int | None = None
        self.epoch_samples = self._epoch_length()
        self._sharding_checked = False
        found = handles.fork_warning(
            dataset, self.fixed.get("multiprocessing_context"), self.fixed.get("worker_init_fn")
        )
        self._handles_warning = [found] if found else []  # with the first trial's result

    def _step_uses_cuda(self) -> bool:
        """pin_memory is worth searching when the batch goes to the GPU: ours without a step; the
        user's step once CUDA is in use in this process (a model on the GPU, or a step that ran
        there: asked again after each trial, so the probe's trials decide before the space is
        built)."""
        return self.cuda_available and (self._user_step is None or torch.cuda.is_initialized())

    def _epoch_length(self) -> int | None:
        """Samples per epoch at batch size 1 (None: unknown); a loader without workers is free."""
        return dl.epoch_samples(
            DataLoader(self.dataset, **dl.apply_settings(self.fixed, Config(1)))
        )

    def _step(self, config: Config) -> Callable[[Any], Any] | None:
        if self._user_step is not None:
            return self._user_step
        if self.cuda_available:
            device = torch.device("cuda", torch.cuda.current_device())
            return lambda batch: cuda.to_device(batch, device, config.pin_memory)
        return None

    def _loader(self, config: Config, limits: Limits) -> DataLoader[Any]:
        # the workers die with this process, even SIGKILLed (see lifeline)
        kwargs = lifeline.wrap_worker_init(dl.apply_settings(self.fixed, config))
        if config.num_workers and not kwargs.get("timeout"):
            kwargs["timeout"] = limits.worker_timeout_s  # a hung worker: a clean error in next()
        return DataLoader(self.dataset, **kwargs)

    def _batches(self, loader: DataLoader[Any], config: Config, replay: bool) -> Any:
        """What the meter wraps each epoch: the loader, or one cached batch again and again."""
        if not replay:
            return loader
        first = next(dl.started(loader))
        if self.bytes_per_sample is None:
            self.bytes_per_sample = dl.bytes_per_sample(first)
        self._transfer = cuda.transfer_rates(first)
        return dl.Repeat(first)

    def _trial(self, config: Config | None, request: TrialRequest) -> TrialResult:
        if config is None:
            raise ValueError("an in-process trial needs explicit settings")
        window, limits = request.window, request.limits
        replay = request.phase == "replay"
        warnings = self._check_sharding(config) + self._handles_warning
        self._handles_warning = []  # (said once)
        result = TrialResult(config, phase=request.phase)
        before = set(_children())
        cuda.reset_cuda_peaks()
        sup = Supervisor(
            os.getpid(),
            limits=limits,
            should_stop=request.should_stop,
            gpu_index=self.gpu_index,
            find_gpu=cuda.nvml_index_for_current_device,  # the first trial may be what starts CUDA
        )
        sup.workers = 0 if replay else config.num_workers
        dog = _Watchdog(sup, before)
        step = self._step(config)
        held = _Held()
        self._where = "loader"

        def measure() -> None:
            with sup, dog, dl.quiet_worker_warning():
                self._measure(result, held, config, window, limits, sup, step, replay)

        with _internals.worker_deaths_deferred():
            error = _internals.contained(measure)  # classified below, once the workers are down
            # The teardown runs finalizers (torch's shutdown, the queues' feeder joins, the
            # collection), where Python drops an exception: a Ctrl-C there would be lost.
            with signals.held():
                _internals.settle(
                    functools.partial(
                        self._settle, result, held, error, dog, config, before, replay
                    )
                )
                if not isinstance(error, KeyboardInterrupt) or dog.interrupted:
                    error = None  # (its traceback's frames are freed here, held too)
        if error is not None:
            raise error  # the user's Ctrl-C: cleaned up; the search records it
        if result.failure is not None:
            result.failure = sup.explain(result.failure)
            result.resources = result.resources or sup.usage_so_far()
        result.extra["warnings"] = warnings
        return result

    def _measure(
        self,
        result: TrialResult,
        held: _Held,
        config: Config,
        window: WindowSpec,
        limits: Limits,
        sup: Supervisor,
        step: Callable[[Any], Any] | None,
        replay: bool,
    ) -> None:
        held.loader = loader = self._loader(config, limits)
        result.epoch_samples = dl.epoch_samples(loader)
        held.batches = self._batches(loader, config, replay)
        held.meter = meter = Meter(
            window,
            count=dl.sample_counter(loader),
            sink=sup,
            sync=cuda.cuda_sync,
            measure_cpu=config.num_workers == 0 and not replay,
        )
        self._loop(meter, held.batches, step)
        measurement = meter.result() if meter.done else meter.finish_now()
        if measurement is None:
            raise _TooShort(result.epoch_samples, config, window)
        result.measurement = measurement
        result.resources = sup.window_ended(measurement.window_s)
        result.pruned = sup.pruned
        if result.epoch_samples is None and measurement.n_batches and not replay:
            # a batch sampler of the user's own, with a length and no batch_size: its batches
            mean = measurement.n_samples / measurement.n_batches
            result.epoch_samples = dl.epoch_samples(loader, mean)
            self.epoch_samples = self.epoch_samples or result.epoch_samples
        if not replay and not measurement.reentry_s and config.num_workers and result.epoch_samples:
            measurement.reentry_s.append(self._reentry(loader, meter))

    def _settle(
        self,
        result: TrialResult,
        held: _Held,
        error: BaseException | None,
        dog: _Watchdog,
        config: Config,
        before: set[int],
        replay: bool,
    ) -> None:
        """Classify the failure, if any, and take the trial down. Safe to run twice."""
        if error is not None and result.failure is None:
            if isinstance(error, _TooShort):
                result.failure = error.failure()
            elif isinstance(error, KeyboardInterrupt):
                result.failure = dog.failure if dog.interrupted else None
            else:
                it = held.meter.iterator if held.meter is not None else None
                result.failure = dog.failure or classify_exception(
                    error,
                    where=self._where,
                    worker_signals=_internals.dead_worker_signals(it, error),
                    num_workers=config.num_workers,
                )
        # Every iterator that could run torch's shutdown later from __del__: the meter's, a
        # persistent loader's, and any the failure's traceback holds (an epoch that failed
        # while starting). Their pin-memory threads stop first, as in torch's own shutdown
        # (one receiving a batch from a worker being killed raises in its thread and prints a
        # traceback), then the workers are killed (joining dead ones is immediate), then the
        # iterators shut down.
        iterators = _internals.iterators_in(error)
        if held.meter is not None:
            iterators.append(held.meter.iterator)
            held.meter.release()
        if held.loader is not None:
            iterators.append(getattr(held.loader, "_iterator", None))  # persistent workers
        for iterator in iterators:
            _internals.stop_pin_thread(iterator)
        result.orphans_killed = kill_new_children(before)
        for iterator in iterators:
            _internals.shut_down(iterator)
        held.loader = held.batches = held.meter = None
        gc.collect()
        result.orphans_killed += kill_new_children(before)
        result.cuda_peak_allocated_bytes, result.cuda_peak_reserved_bytes = cuda.cuda_peaks()
        result.cuda_capacity_bytes = cuda.cuda_capacity()
        if replay and self._transfer is not None:
            result.transfer, self._transfer = self._transfer, None
        if torch.cuda.is_initialized():
            result.cuda_device = cuda.cuda_bus_id()
            if result.failure is not None:
                torch.cuda.empty_cache()  # after an OOM, give the allocator a clean slate
            if self.gpu_index is None:
                self.gpu_index = cuda.nvml_index_for_current_device()
        self.uses_cuda = self._step_uses_cuda()

    def _check_sharding(self, config: Config) -> list[str]:
        """Once, for an IterableDataset: warn when its workers yield duplicate samples."""
        if self._sharding_checked or not isinstance(self.dataset, IterableDataset):
            return []
        self._sharding_checked = True
        before = set(_children())
        try:
            with dl.quiet_worker_warning():
                dup = dl.duplicated_across_workers(
                    self.dataset,
                    batch_size=config.batch_size,
                    collate_fn=self.fixed.get("collate_fn"),
                )
        except Exception:  # the trial itself will meet and classify the same error
            dup = False
        finally:
            gc.collect()
            kill_new_children(before)
        return [dl.UNSHARDED_WARNING] if dup else []

    def _loop(self, meter: Meter, batches: Any, step: Callable[[Any], Any] | None) -> None:
        while not meter.done:
            n = 0
            for batch in meter.wrap(batches):
                n += 1
                if step is not None:
                    self._where = "step"
                    step(batch)
                    self._where = "loader"
            if n == 0:  # an empty epoch: nothing more will come
                return

    def _reentry(self, loader: DataLoader[Any], meter: Meter) -> float:
        """Seconds from ``iter(loader)`` to the first batch of a new epoch (start-up per epoch),
        from where an epoch's end leaves the workers: idle
        (:func:`~loadertune.trials.torch_internals.end_epoch_now`)."""
        if loader.persistent_workers:
            _internals.end_epoch_now(meter.iterator)
        meter.release()  # drop the old epoch's iterator (and its workers, unless persistent)
        t = time.perf_counter()
        it = dl.started(loader)
        next(it)
        elapsed = time.perf_counter() - t
        del it
        return elapsed

    def close(self) -> None:
        gc.collect()


class _Held:
    """What a trial holds while it runs, so that taking it down can release all of it."""

    loader: DataLoader[Any] | None = None
    batches: Any = None
    meter: Meter | None = None


class _TooShort(Exception):
    def __init__(self, epoch_samples: int | None, config: Config, window: WindowSpec) -> None:
        self.epoch_samples = epoch_samples
        self.config = config
        self.window = window

    def failure(self) -> Failure:
        return Failure(
            FailureKind.NO_BATCHES,
            f"the loader produced no batch to measure ({self.epoch_samples} samples per epoch at "
            f"batch_size={self.config.batch_size}, drop_last may drop them all)",
            "use a smaller batch size, or drop_last=False",
        )
