"""Run trials in this process, on a dataset object and a step function (``tune_loader``).

Why not a fresh process per trial: a process forked after torch has used its OpenMP thread pool
deadlocks in its first parallel kernel (torch's own workers avoid it by running one thread), so a
forked trial could not run the user's step as it really runs. Trials therefore run here, like the
user's training would, and are contained instead: a watchdog thread stops a hung trial or one over
the memory budget by killing its workers (the loader then raises) and, as a last resort,
interrupting the main thread; every worker the trial started is gone when it returns. Scripts get
full process isolation in :mod:`loadertune.script`.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import os
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import psutil
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from loadertune import nvml
from loadertune.failures import Failure, classify_exception
from loadertune.meter import Meter, WindowSpec, fixed_count, structure_counter
from loadertune.space import Config
from loadertune.trial import Limits, ShouldStop, Supervisor, TrialResult

_WORKER_COUNT_WARNING = r"This DataLoader will create \d+ worker processes"


def batch_nbytes(batch: Any) -> int:
    """Bytes of the tensors and arrays in a batch (strings and scalars count nothing)."""
    if isinstance(batch, torch.Tensor):
        return batch.element_size() * batch.nelement()
    nbytes = getattr(batch, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    if isinstance(batch, Mapping):
        return sum(batch_nbytes(v) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return sum(batch_nbytes(v) for v in batch)
    return 0


def to_device(batch: Any, device: torch.device, non_blocking: bool) -> Any:
    """Move every tensor of a batch to ``device`` (the default step when CUDA is present)."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, Mapping):
        return {k: to_device(v, device, non_blocking) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        moved = [to_device(v, device, non_blocking) for v in batch]
        return type(batch)(*moved) if hasattr(batch, "_fields") else type(batch)(moved)
    return batch


def cuda_sync() -> None:
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def cuda_gpu_index() -> int | None:
    """NVML index of the current CUDA device, or None when CUDA is not in use."""
    if not torch.cuda.is_initialized():
        return None
    ordinal = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(ordinal)
    bus = getattr(props, "pci_bus_id", None)
    if bus is not None:
        bus_id = f"{getattr(props, 'pci_domain_id', 0):08x}:{bus:02x}:{getattr(props, 'pci_device_id', 0):02x}.0"
        index = nvml.index_for_bus_id(bus_id)
        if index is not None:
            return index
    gpus = nvml.visible_gpus()
    return gpus[ordinal].index if ordinal < len(gpus) else None


def _children() -> dict[int, psutil.Process]:
    try:
        return {p.pid: p for p in psutil.Process().children(recursive=True)}
    except psutil.Error:
        return {}


def kill_new_children(before: set[int], grace_s: float = 3.0) -> int:
    """SIGKILL every descendant of this process not in ``before``; return how many there were."""
    new = [p for pid, p in _children().items() if pid not in before]
    for p in new:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(new, timeout=grace_s)
    return len(new)


class _Watchdog:
    """Stops an in-process trial the supervisor says must stop."""

    def __init__(self, sup: Supervisor, before: set[int], interrupt_grace_s: float = 3.0) -> None:
        self._sup = sup
        self._before = before
        self._grace_s = interrupt_grace_s
        self._done = threading.Event()
        self._main = threading.get_ident() if threading.current_thread() is threading.main_thread() else None
        self.failure: Failure | None = None
        self.interrupted = False
        self._thread = threading.Thread(target=self._run, name="loadertune-watchdog", daemon=True)

    def __enter__(self) -> _Watchdog:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._done.wait(0.1):
            failure = self._sup.expired()
            if failure is None:
                continue
            self.failure = failure
            kill_new_children(self._before, grace_s=1.0)  # next() in the loop now raises
            if not self._done.wait(self._grace_s) and self._main is not None:
                self.interrupted = True  # stuck outside the loader (in the step): interrupt it
                signal.pthread_kill(self._main, signal.SIGINT)
            return


class InlineRunner:
    """Trials over ``dataset`` in this process; see the module docstring.

    Args:
        dataset: any map-style or iterable dataset.
        step: ``step(batch)``, the user's training step; None to tune loading alone (with CUDA, the
            batch is then copied to the GPU, as training would).
        fixed: the user's other DataLoader arguments (collate_fn, sampler, shuffle...), untouched.
    """

    def __init__(self, dataset: Dataset[Any], *, step: Callable[[Any], Any] | None = None,
                 fixed: Mapping[str, Any] | None = None) -> None:
        self.dataset = dataset
        self.fixed = dict(fixed or {})
        self.in_process = True
        self.cuda_available = torch.cuda.is_available()
        self.uses_cuda = self.cuda_available and step is None
        self._user_step = step
        self._where = "loader"
        self.bytes_per_sample: float | None = None
        self.gpu_index: int | None = None
        self.epoch_samples = self._epoch_length()

    def _epoch_length(self) -> int | None:
        sampler = self.fixed.get("sampler") or self.fixed.get("batch_sampler")
        target = sampler if sampler is not None else self.dataset
        if isinstance(target, IterableDataset) and not hasattr(target, "__len__"):
            return None
        try:
            n = len(target)  # type: ignore[arg-type]
        except TypeError:
            return None
        if self.fixed.get("batch_sampler") is not None:
            return None  # a count of batches, not samples
        return n

    def epoch_samples_for(self, batch_size: int) -> int | None:
        n = self.epoch_samples
        if n is not None and self.fixed.get("drop_last"):
            return n // batch_size * batch_size
        return n

    def _step(self, config: Config) -> Callable[[Any], Any] | None:
        if self._user_step is not None:
            return self._user_step
        if self.cuda_available:
            device = torch.device("cuda", torch.cuda.current_device())
            return lambda batch: to_device(batch, device, config.pin_memory)
        return None

    def _loader(self, config: Config, limits: Limits) -> DataLoader[Any]:
        kwargs = {**self.fixed, **config.loader_kwargs()}
        if "batch_sampler" in self.fixed:
            kwargs.pop("batch_size")
        if config.num_workers and not kwargs.get("timeout"):
            kwargs["timeout"] = limits.hang_s  # a hung worker becomes a clean error in next()
        return DataLoader(self.dataset, **kwargs)

    def _counter(self, config: Config) -> Callable[[Any, int], int]:
        if isinstance(self.dataset, IterableDataset) or "batch_sampler" in self.fixed:
            return structure_counter
        return fixed_count(config.batch_size, self.epoch_samples, bool(self.fixed.get("drop_last")))

    def _batches(self, loader: DataLoader[Any], config: Config, replay: bool) -> Any:
        """What the meter wraps each epoch: the loader, or one cached batch again and again."""
        if not replay:
            return loader
        first = next(iter(loader))
        if self.bytes_per_sample is None:
            self.bytes_per_sample = batch_nbytes(first) / max(1, structure_counter(first, 0))
        return _Repeat(first)

    def run(self, config: Config, *, window: WindowSpec, limits: Limits, phase: str = "search",
            should_stop: ShouldStop | None = None) -> TrialResult:
        t0 = time.perf_counter()
        replay = phase == "replay"
        result = TrialResult(config, phase=phase, epoch_samples=self.epoch_samples_for(config.batch_size))
        before = set(_children())
        if torch.cuda.is_initialized():
            torch.cuda.reset_peak_memory_stats()
        sup = Supervisor(os.getpid(), limits=limits, should_stop=should_stop, gpu_index=self.gpu_index)
        dog = _Watchdog(sup, before)
        step = self._step(config)
        loader = batches = meter = None
        self._where = "loader"
        try:
            with sup, dog, warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=_WORKER_COUNT_WARNING)
                loader = self._loader(config, limits)
                batches = self._batches(loader, config, replay)
                meter = Meter(window, count=self._counter(config), sink=sup, sync=cuda_sync,
                              measure_cpu=config.num_workers == 0 and not replay)
                self._loop(meter, batches, step)
                measurement = meter.result() if meter.done else meter.finish_now()
                if measurement is None:
                    raise _TooShort(self.epoch_samples_for(config.batch_size), config, window)
                result.measurement = measurement
                result.resources = sup.window_ended()
                result.pruned = sup.pruned
                if not replay and not measurement.reentry_s and config.num_workers and result.epoch_samples:
                    measurement.reentry_s.append(self._reentry(loader, meter))
        except _TooShort as exc:
            result.failure = exc.failure()
        except KeyboardInterrupt:
            if not dog.interrupted:
                raise  # the user's Ctrl-C: clean up below, then let the search record it
            result.failure = dog.failure
        except Exception as exc:
            result.failure = dog.failure or classify_exception(exc, where=self._where)
        finally:
            if meter is not None:
                meter.release()
            del loader, batches, meter
            gc.collect()  # DataLoader iterators shut their workers down when collected
            result.orphans_killed = kill_new_children(before)
            if torch.cuda.is_initialized():
                result.cuda_peak_allocated_bytes = torch.cuda.max_memory_allocated()
                result.cuda_peak_reserved_bytes = torch.cuda.max_memory_reserved()
                if result.failure is not None:
                    torch.cuda.empty_cache()  # after an OOM, give the allocator a clean slate
                if self.gpu_index is None:
                    self.gpu_index = cuda_gpu_index()
        result.bytes_per_sample = self.bytes_per_sample
        result.wall_s = time.perf_counter() - t0
        return result

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
        """Seconds from ``iter(loader)`` to the first batch of a new epoch (start-up per epoch)."""
        meter.release()  # drop the old epoch's iterator (and its workers, unless persistent)
        t = time.perf_counter()
        it = iter(loader)
        next(it)
        elapsed = time.perf_counter() - t
        del it
        return elapsed

    def close(self) -> None:
        gc.collect()


class _Repeat:
    """An endless epoch of one cached batch: the step's rate with loading taken away."""

    def __init__(self, batch: Any) -> None:
        self._batch = batch

    def __iter__(self) -> Iterator[Any]:
        return itertools.repeat(self._batch)


class _TooShort(Exception):
    def __init__(self, epoch_samples: int | None, config: Config, window: WindowSpec) -> None:
        self.epoch_samples = epoch_samples
        self.config = config
        self.window = window

    def failure(self) -> Failure:
        return Failure(
            "too_short",
            f"an epoch ended before the measured window opened ({self.epoch_samples} samples at "
            f"batch_size={self.config.batch_size}, {self.window.warmup_batches} warm-up batches)",
            "use a larger dataset or a smaller batch size for tuning",
        )
