"""What loadertune reads off a torch DataLoader and its batches.

Shared by the in-process runner and by a script's trial process: how many samples an epoch and a
batch hold, how many bytes a sample takes, the loader's own settings, and the CUDA facts a trial
reports (which device, its peak memory).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sysconfig
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset
from torch.utils.data.dataloader import _BaseDataLoaderIter

from loadertune import nvml
from loadertune.meter import FixedCount, structure_count, structure_counter
from loadertune.space import Config

WORKER_COUNT_WARNING = r"This DataLoader will create \d+ worker processes"


@contextlib.contextmanager
def quiet_worker_warning() -> Iterator[None]:
    """Silence DataLoader's "more workers than CPUs" warning: trying that is the point."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=WORKER_COUNT_WARNING)
        yield


def apply_settings(arguments: Mapping[str, Any], config: Config) -> dict[str, Any]:
    """The user's DataLoader arguments with ``config`` applied, every combination kept valid:
    a batch sampler keeps deciding the batch, and without workers the worker-only arguments
    (``prefetch_factor``, ``persistent_workers``, ``multiprocessing_context``) go."""
    out = dict(arguments)
    out.update(config.loader_kwargs())
    if out.get("batch_sampler") is not None:
        out.pop("batch_size")
    if config.num_workers == 0:
        for key in ("prefetch_factor", "multiprocessing_context"):
            out.pop(key, None)
        out["persistent_workers"] = False
    return out


def epoch_samples(loader: DataLoader[Any]) -> int | None:
    """Samples per epoch; None when unknown (an iterable without ``__len__``, a batch sampler)."""
    if isinstance(loader.dataset, IterableDataset):
        try:
            return len(loader.dataset)  # type: ignore[arg-type]
        except TypeError:
            return None
    if loader.batch_size is None:  # a user batch_sampler, or no automatic batching
        return None
    try:
        n = len(loader.sampler)  # type: ignore[arg-type]
    except TypeError:
        return None
    return n // loader.batch_size * loader.batch_size if loader.drop_last else n


def sample_counter(loader: DataLoader[Any]) -> Callable[[Any, int], int]:
    """Count samples per batch: arithmetic for a regular batch sampler, else the batch's shape."""
    if isinstance(loader.dataset, IterableDataset) or loader.batch_size is None:
        return structure_counter
    return FixedCount(loader.batch_size, epoch_samples(loader), loader.drop_last)


def settings_of(loader: DataLoader[Any]) -> Config:
    """The loader's own tuned settings (its batch size is 1 when a batch sampler decides)."""
    batch_size = loader.batch_size or getattr(loader.batch_sampler, "batch_size", None) or 1
    return Config(
        int(batch_size),
        loader.num_workers,
        loader.prefetch_factor if loader.num_workers else None,
        bool(loader.pin_memory),
        bool(loader.persistent_workers),
    )


UNSHARDED_WARNING = (
    "the IterableDataset is not sharded across workers: each worker yields the same samples, so "
    "an epoch holds every sample num_workers times and throughput looks inflated; split the "
    "stream with torch.utils.data.get_worker_info() in __iter__"
)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    try:
        return bool(a == b)
    except Exception:  # arrays and other types without a plain truth value
        return False


def duplicated_across_workers(
    dataset: IterableDataset[Any],
    *,
    batch_size: int | None,
    collate_fn: Callable[[Any], Any] | None = None,
) -> bool:
    """True when two workers yield the same first batch: the stream ignores get_worker_info().

    DataLoader takes batches from its workers in turn, so batch 0 is worker 0's first and batch 1
    is worker 1's first; a sharded stream gives different ones.
    """
    kwargs: dict[str, Any] = {"batch_size": batch_size, "num_workers": 2, "timeout": 60}
    if collate_fn is not None:
        kwargs["collate_fn"] = collate_fn
    it = iter(DataLoader(dataset, **kwargs))
    try:
        first, second = next(it), next(it)
    except StopIteration:
        return False
    finally:
        del it
    return _same(first, second)


_WORKER_DEATH = re.compile(r"DataLoader worker \(pid")


@contextlib.contextmanager
def worker_deaths_ignored() -> Iterator[None]:
    """Silence DataLoader's SIGCHLD handler while a failed loader is taken down.

    When one worker dies, the handler raises in the main thread; while that failure is being
    handled, its siblings die too and the handler would raise again, anywhere. The loader's
    workers are shut down explicitly meanwhile, so nothing is missed. Main thread only (where
    signal handlers live); elsewhere a no-op.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGCHLD, previous)


def is_worker_death(exc: BaseException) -> bool:
    """Whether ``exc`` is DataLoader's report of a dead worker (from next() or SIGCHLD)."""
    return isinstance(exc, RuntimeError) and bool(_WORKER_DEATH.search(str(exc)))


# The frames of DataLoader's main thread waiting for a batch: a multiprocessing queue's poll, or
# a pin-memory thread's queue (Condition.wait). Only there does torch expect its SIGCHLD handler
# to raise.
_WAITING = {
    ("selectors.py", "select"),
    ("connection.py", "wait"),
    ("connection.py", "_poll"),
    ("connection.py", "poll"),
    ("queues.py", "get"),
    ("queue.py", "get"),
    ("threading.py", "wait"),
}
_LIBRARIES = (sysconfig.get_paths()["stdlib"], os.path.dirname(torch.__file__))


def raising_is_safe(frame: Any) -> bool:
    """Whether an exception raised by a signal handler in ``frame`` (the innermost Python frame
    it interrupted) leaves nothing half done: outside the standard library and torch, or where
    torch waits for a batch. Elsewhere inside them it can leak what they were opening (torch's
    open-files probe leaves a temporary file open) or leave a queue half set up (a feeder thread
    interrupted while starting is never told to stop)."""
    if frame is None:
        return True
    caller = frame
    while caller is not None and _place(caller) in _WAITING:
        caller = caller.f_back
    if caller is not frame:  # a wait: torch's wait for a batch, or one inside other work
        return caller is not None and caller.f_code.co_name == "_try_get_data"
    return not frame.f_code.co_filename.startswith(_LIBRARIES)


def _place(frame: Any) -> tuple[str, str]:
    return os.path.basename(frame.f_code.co_filename), frame.f_code.co_name


class _DeferredDeaths:
    """DataLoader's SIGCHLD handler, made to report a dead worker only where that is safe: in
    an unsafe frame the report is kept, and the signal sent again a moment later to raise it."""

    def __init__(
        self,
        handler: Callable[[int, Any], Any],
        *,
        delay_s: float = 0.005,
        send: Callable[[], object] | None = None,
    ) -> None:
        self._handler = handler
        self._delay_s = delay_s
        main = threading.main_thread().ident
        assert main is not None
        # To the main thread itself: a process-wide signal sent from the timer's thread goes to
        # that thread, and the main thread's wait would not be interrupted until its timeout.
        self._send = send or (lambda: signal.pthread_kill(main, signal.SIGCHLD))
        self._active = True
        self._pending: RuntimeError | None = None
        self._timer: threading.Timer | None = None

    def __call__(self, signum: int, frame: Any) -> None:
        try:
            self._handler(signum, frame)
        except RuntimeError as exc:
            if not is_worker_death(exc):
                raise
            # Kept, not re-detected later: by then the dead worker may have been reaped (each
            # Process.start() reaps its siblings) and torch's check would find nothing.
            self._pending = exc
        if self._pending is None:
            return
        if raising_is_safe(frame):
            pending, self._pending = self._pending, None
            raise pending
        if self._timer is None or not self._timer.is_alive():
            self._timer = threading.Timer(self._delay_s, self._again)
            self._timer.daemon = True
            self._timer.start()

    def _again(self) -> None:
        if self._active:
            self._send()

    def close(self) -> None:
        self._active = False
        if self._timer is not None:
            self._timer.cancel()


@contextlib.contextmanager
def worker_deaths_deferred() -> Iterator[None]:
    """Within this block, a dead worker is reported (raised by DataLoader's SIGCHLD handler)
    only where raising leaves nothing half done; see :func:`raising_is_safe`. Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    install = getattr(torch.utils.data._utils.signal_handling, "_set_SIGCHLD_handler", None)
    if callable(install):
        install()  # torch's own handler, set once per process; wrapped below
    handler = signal.getsignal(signal.SIGCHLD)
    if not callable(handler):
        yield
        return
    deferred = _DeferredDeaths(handler)
    signal.signal(signal.SIGCHLD, deferred)
    try:
        yield
    finally:
        deferred.close()
        signal.signal(signal.SIGCHLD, handler)


def contained(fn: Callable[[], Any]) -> BaseException | None:
    """Run ``fn`` and return what it raised (None if nothing), including a sibling worker's
    death that DataLoader's SIGCHLD handler reports while the first failure is being caught."""
    try:
        try:
            fn()
        except BaseException as exc:
            return exc
    except RuntimeError as echo:  # raised inside the handler above, before it returned
        if not is_worker_death(echo):
            raise
        return echo.__context__ or echo
    return None


def settle(fn: Callable[[], Any], attempts: int = 5) -> Any:
    """Run ``fn`` with worker deaths ignored, again if an echo of a worker's death (raised by
    DataLoader's SIGCHLD handler before it was silenced) interrupts it. ``fn`` must be safe to
    run twice."""
    for _ in range(attempts - 1):
        try:
            with worker_deaths_ignored():
                return fn()
        except RuntimeError as exc:
            if not is_worker_death(exc):
                raise
    with worker_deaths_ignored():
        return fn()


def shut_down(iterator: object, timeout_s: float = 5.0) -> bool:
    """Stop a DataLoader iterator's workers now rather than whenever it is collected.

    Torch's shutdown puts a message on each worker's queue; should a queue's lock be left held
    (a report of a dead worker raised inside torch's code, which ``worker_deaths_deferred``
    exists to prevent), that put would block forever: so it runs in a helper thread, abandoned
    after ``timeout_s`` (it marks the iterator shut down on entry, so a later ``__del__`` does
    nothing). The queues are closed whatever happened, also for an iterator whose construction
    was interrupted. Kill the workers first: joining dead workers is immediate. Returns False
    when abandoned.
    """
    if not isinstance(iterator, _BaseDataLoaderIter):
        return True
    shutdown = getattr(iterator, "_shutdown_workers", None)
    started = hasattr(iterator, "_shutdown")  # False: iter() was interrupted mid-construction

    def shutdown_and_close() -> None:
        try:
            if started and callable(shutdown):
                shutdown()
        finally:  # torch skips this when a dead worker left it inconsistent; close is idempotent
            queues = [
                *getattr(iterator, "_index_queues", ()),
                getattr(iterator, "_worker_result_queue", None),
            ]
            for q in queues:
                with contextlib.suppress(Exception):
                    q.cancel_join_thread()
                    q.close()

    thread = threading.Thread(target=shutdown_and_close, name="loadertune-shutdown", daemon=True)
    thread.start()
    thread.join(timeout_s)
    return not thread.is_alive()


def iterators_in(error: BaseException | None) -> list[object]:
    """The DataLoader iterators that ``error``'s tracebacks hold (through their frames)."""
    found: dict[int, object] = {}
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        tb = error.__traceback__
        while tb is not None:
            for value in tb.tb_frame.f_locals.values():
                if isinstance(value, _BaseDataLoaderIter):
                    found[id(value)] = value
            tb = tb.tb_next
        error = error.__cause__ or error.__context__
    return list(found.values())


def dead_worker_signals(iterator: object) -> tuple[int, ...]:
    """Signals that killed a DataLoader iterator's workers, read from their exit codes."""
    codes = (getattr(w, "exitcode", None) for w in getattr(iterator, "_workers", None) or ())
    return tuple(-code for code in codes if isinstance(code, int) and code < 0)


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


def bytes_per_sample(batch: Any) -> float:
    return batch_nbytes(batch) / max(1, structure_count(batch))


def to_device(batch: Any, device: torch.device, non_blocking: bool) -> Any:
    """Move every tensor of a batch to ``device``; ``non_blocking`` pays off with pinned memory."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, Mapping):
        return {k: to_device(v, device, non_blocking) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        moved = [to_device(v, device, non_blocking) for v in batch]
        return type(batch)(*moved) if hasattr(batch, "_fields") else type(batch)(moved)
    return batch


def cuda_sync() -> None:
    """Wait for queued GPU work, if this process uses CUDA (a CPU-GPU sync point)."""
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def cuda_bus_id() -> str | None:
    """PCI bus id of the current CUDA device (as NVML spells it), or None without CUDA in use."""
    if not torch.cuda.is_initialized():
        return None
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    bus = getattr(props, "pci_bus_id", None)
    if bus is None:
        return None
    domain, device = getattr(props, "pci_domain_id", 0), getattr(props, "pci_device_id", 0)
    return f"{domain:08x}:{bus:02x}:{device:02x}.0"


def nvml_index_for_current_device() -> int | None:
    """NVML index of the current CUDA device, or None when CUDA is not in use."""
    if not torch.cuda.is_initialized():
        return None
    bus = cuda_bus_id()
    index = nvml.index_for_bus_id(bus) if bus else None
    if index is not None:
        return index
    ordinal = torch.cuda.current_device()
    gpus = nvml.visible_gpus()
    return gpus[ordinal].index if ordinal < len(gpus) else None


def cuda_capacity() -> int | None:
    """Bytes this process could hold on its GPU: free memory plus what its allocator reserved."""
    if not torch.cuda.is_initialized():
        return None
    free, _total = torch.cuda.mem_get_info()
    return int(free + torch.cuda.memory_reserved())


def _tensors(batch: Any) -> list[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, Mapping):
        return [t for v in batch.values() for t in _tensors(v)]
    if isinstance(batch, (list, tuple)):
        return [t for v in batch for t in _tensors(v)]
    return []


def transfer_rates(batch: Any, *, repeats: int = 10) -> dict[str, float] | None:
    """Host-to-device copy rate of this batch, from pageable and from pinned memory.

    Returns samples/s and GB/s for each, or None without CUDA or without tensors.
    """
    if not torch.cuda.is_available():
        return None
    tensors = [t for t in _tensors(batch) if t.device.type == "cpu"]
    nbytes = sum(t.element_size() * t.nelement() for t in tensors)
    if not nbytes:
        return None
    samples = structure_count(batch)
    device = torch.device("cuda", torch.cuda.current_device())
    out: dict[str, float] = {}
    for name, pinned in (("pageable", False), ("pinned", True)):
        source = [t.pin_memory() if pinned else t for t in tensors]
        for t in source:  # warm-up: allocator, pinned staging buffers
            t.to(device, non_blocking=pinned)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(repeats):
            for t in source:
                t.to(device, non_blocking=pinned)
        torch.cuda.synchronize()  # a CPU-GPU sync point: every copy has landed
        seconds = (time.perf_counter() - t0) / repeats
        out[f"{name}_samples_per_s"] = samples / seconds
        out[f"{name}_gb_per_s"] = nbytes / seconds / 1e9
    return out


def cuda_peaks() -> tuple[int | None, int | None]:
    """(peak allocated, peak reserved) bytes since the last reset, or Nones without CUDA."""
    if not torch.cuda.is_initialized():
        return None, None
    return torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
