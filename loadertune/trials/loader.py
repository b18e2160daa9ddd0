"""What loadertune reads off a torch DataLoader and its batches.

Shared by the in-process runner and by a script's trial process: how many samples an epoch and a
batch hold, how many bytes a sample takes, the loader's own settings, and the CUDA facts a trial
reports (which device, its peak memory).
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset

from loadertune import signals
from loadertune.config import Config
from loadertune.measure.counting import FixedCount, structure_count, structure_counter
from loadertune.trials import messages

# Set while loadertune builds or iterates a loader whose worker count it chose (this thread's).
_QUIET = contextvars.ContextVar("loadertune_quiet_worker_warning", default=False)


class _QuietCheck:
    """``DataLoader.check_worker_number_rationality``, skipped while :data:`_QUIET` is set (the
    check, not a warnings filter: ``warnings.catch_warnings`` is not thread-safe, and each use
    resets the "once per place" memory of every warning, so torch's warning about the script's
    own loaders would come at every epoch of a tuned run instead of once). A descriptor, not a
    function around the check: torch's warning then names the place it names without
    loadertune (a wrapper's frame would make it name this module for the user's own
    loaders)."""

    def __init__(self, check: Callable[..., None]) -> None:
        self.check = check

    def __get__(self, loader: DataLoader[Any] | None, owner: type | None = None) -> Any:
        if loader is not None and _QUIET.get():
            return _skip
        return self.check.__get__(loader, owner)


def _skip() -> None:
    pass


def _install_quiet_check() -> None:
    check = DataLoader.__dict__["check_worker_number_rationality"]
    if not isinstance(check, _QuietCheck):
        DataLoader.check_worker_number_rationality = _QuietCheck(check)  # type: ignore[assignment,method-assign]


@contextlib.contextmanager
def quiet_worker_warning() -> Iterator[None]:
    """No "more workers than CPUs" warning from DataLoader in this block (this thread): trying
    that is the point."""
    _install_quiet_check()
    token = _QUIET.set(True)
    try:
        yield
    finally:
        _QUIET.reset(token)


def started(loader: DataLoader[Any]) -> Iterator[Any]:
    """``iter(loader)``, which forks its workers, with Ctrl-C held until they are up (a Ctrl-C
    in a fork's callbacks is lost: :mod:`loadertune.signals`) and without the "more workers
    than CPUs" warning (:func:`quiet_worker_warning`)."""
    with quiet_worker_warning(), signals.held():
        return iter(loader)


def apply_settings(arguments: Mapping[str, Any], config: Config) -> dict[str, Any]:
    """The user's DataLoader arguments with ``config`` applied, every combination kept valid:
    a batch sampler is rebuilt with the new batch size where its type allows it
    (:func:`resized_batch_sampler`; else it keeps deciding the batch: see
    :func:`batch_size_fixed`), and without workers the worker-only arguments
    (``prefetch_factor``, ``persistent_workers``, ``multiprocessing_context``, ``timeout``) go."""
    out = dict(arguments)
    out.update(config.loader_kwargs())
    if (
        "batch_size" in arguments
        and arguments["batch_size"] is None
        and not out.get("batch_sampler")
    ):
        out["batch_size"] = None  # no automatic batching: the dataset's items are the batches
    batch_sampler = out.get("batch_sampler")
    if batch_sampler is not None:
        out.pop("batch_size")
        if getattr(batch_sampler, "batch_size", None) != config.batch_size:
            resized = resized_batch_sampler(batch_sampler, config.batch_size)
            if resized is not None:
                out["batch_sampler"] = resized
    if config.num_workers == 0:
        for key in ("prefetch_factor", "multiprocessing_context", "timeout"):
            out.pop(key, None)
        out["persistent_workers"] = False
    return out


# Batch samplers that wrap another and keep its batch size (Accelerate's shard of a batch
# sampler across processes, and its sampler that skips the first batches of a resumed epoch):
# rebuilt around a resized inner one. Named, not imported: Accelerate is optional.
_WRAPPERS = {"accelerate.data_loader.BatchSamplerShard", "accelerate.data_loader.SkipBatchSampler"}


def _type_name(obj: object) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def resized_batch_sampler(batch_sampler: Any, batch_size: int) -> Any | None:
    """A copy of ``batch_sampler`` that makes batches of ``batch_size``, or None when its type
    does not allow it: torch's own ``BatchSampler`` (not a subclass, whose batches may follow
    other rules), and the known wrappers of one (``_WRAPPERS``)."""
    if type(batch_sampler) is BatchSampler:
        return BatchSampler(batch_sampler.sampler, batch_size, batch_sampler.drop_last)
    if _type_name(batch_sampler) in _WRAPPERS:
        inner = resized_batch_sampler(batch_sampler.batch_sampler, batch_size)
        if inner is None:
            return None
        wrapper = copy.copy(batch_sampler)
        wrapper.batch_sampler = inner
        if getattr(wrapper, "batch_size", None) is not None:
            wrapper.batch_size = batch_size
        return wrapper
    return None


def batch_size_fixed(batch_sampler: Any) -> str | None:
    """Why a loader built with ``batch_sampler`` cannot be given another batch size, or None
    when it can (no batch sampler, or one :func:`resized_batch_sampler` rebuilds)."""
    if batch_sampler is None or resized_batch_sampler(batch_sampler, 2) is not None:
        return None
    return (
        f"the loader's batch_sampler ({_type_name(batch_sampler)}) decides the batches, and "
        "loadertune cannot rebuild it with another batch size"
    )


def why_batch_size_fixed(loader: DataLoader[Any]) -> str | None:
    """Why ``loader``'s batch size cannot be searched, or None when it can: a batch sampler
    :func:`batch_size_fixed` names, or no automatic batching at all (``batch_size=None``
    without a batch sampler)."""
    if loader.batch_size is not None:
        return None
    if loader.batch_sampler is None:
        return messages.NO_BATCHING
    return batch_size_fixed(loader.batch_sampler)


def epoch_batches(loader: DataLoader[Any]) -> int | None:
    """Batches per epoch, ``len(loader)``; None when unknown (an iterable without a length)."""
    try:
        return len(loader)
    except TypeError:
        return None


def batches_per_epoch(loader: DataLoader[Any]) -> int | None:
    """Batches per epoch, from the batch sampler, for loadertune's own use: ``len(loader)`` on
    a patched loader tells it that the script asked (a trial then keeps every epoch to that
    many batches). None when unknown, and for an ``IterableDataset`` (its workers each give
    their own stream)."""
    if isinstance(loader.dataset, IterableDataset) or loader.batch_sampler is None:
        return None
    try:
        return len(loader.batch_sampler)  # type: ignore[arg-type]
    except TypeError:
        return None


def epoch_samples(loader: DataLoader[Any], mean_batch: float | None = None) -> int | None:
    """Samples per epoch; None when unknown (an iterable without ``__len__``, a batch sampler
    without ``__len__``, or without ``batch_size`` when no ``mean_batch`` was seen: the mean
    samples of the batches it gave, as a bucketing sampler of the user's own gives them)."""
    if isinstance(loader.dataset, IterableDataset):
        try:
            return len(loader.dataset)  # type: ignore[arg-type]
        except TypeError:
            return None
    if loader.batch_size is None:  # a user batch_sampler, or no automatic batching
        return _batch_sampler_samples(loader.batch_sampler, mean_batch)
    try:
        n = len(loader.sampler)  # type: ignore[arg-type]
    except TypeError:
        return None
    return n // loader.batch_size * loader.batch_size if loader.drop_last else n


def _batch_sampler_samples(batch_sampler: Any, mean_batch: float | None = None) -> int | None:
    """Samples an epoch of ``batch_sampler`` yields: exact for torch's ``BatchSampler``, else
    its batches times its ``batch_size`` (a shard pads its last batch to full size), or times
    ``mean_batch`` without one."""
    if batch_sampler is None:
        return None
    if type(batch_sampler) is BatchSampler:
        try:
            n = len(batch_sampler.sampler)  # type: ignore[arg-type]
        except TypeError:
            return None
        size = batch_sampler.batch_size
        return n // size * size if batch_sampler.drop_last else n
    per_batch = getattr(batch_sampler, "batch_size", None)
    try:
        batches = len(batch_sampler)
    except TypeError:
        return None
    if isinstance(per_batch, int) and per_batch > 0:
        return batches * per_batch
    return round(batches * mean_batch) if mean_batch else None


def why_no_batches(loader: DataLoader[Any]) -> str | None:
    """Why an epoch of ``loader`` holds no batch at all, when its length says so up front
    (``drop_last=True`` with fewer samples than a batch, an empty dataset); else None."""
    if epoch_samples(loader) != 0:
        return None
    if isinstance(loader.dataset, IterableDataset):
        return "the dataset is empty (0 samples)"
    sampler, size = loader.sampler, loader.batch_size
    if size is None:  # a batch sampler: torch's own, or a wrapper of it
        inner = loader.batch_sampler
        while inner is not None and not isinstance(inner, BatchSampler):
            inner = getattr(inner, "batch_sampler", None)
        if inner is None:
            return "its batch sampler yields no batch"
        sampler, size = inner.sampler, inner.batch_size
    n = len(sampler)  # type: ignore[arg-type]
    if n == 0:
        return "the dataset is empty (0 samples)"
    return f"drop_last=True with {n} samples < batch_size {size}"


def sample_counter(loader: DataLoader[Any]) -> Callable[[Any, int], int]:
    """Count samples per batch: arithmetic for a regular batch sampler, else the batch's shape."""
    if isinstance(loader.dataset, IterableDataset):
        return structure_counter
    if loader.batch_size is None:
        batch_sampler = loader.batch_sampler
        if type(batch_sampler) is not BatchSampler:
            return structure_counter
        return FixedCount(batch_sampler.batch_size, epoch_samples(loader), batch_sampler.drop_last)
    return FixedCount(loader.batch_size, epoch_samples(loader), loader.drop_last)


_KEPT = (
    "collate_fn",
    "drop_last",
    "worker_init_fn",
    "timeout",
    "generator",
    "multiprocessing_context",
    "pin_memory_device",
    "in_order",
)


def arguments_of(loader: DataLoader[Any]) -> dict[str, Any]:
    """Keyword arguments that build ``loader`` again (as frameworks rebuild a user's loader):
    its dataset, its sampler or batch sampler, its own settings and everything else it keeps."""
    arguments: dict[str, Any] = {"dataset": loader.dataset}
    if loader.batch_size is None and loader.batch_sampler is not None:
        arguments["batch_sampler"] = loader.batch_sampler
    else:
        arguments["batch_size"] = loader.batch_size  # None: no automatic batching
        if not isinstance(loader.dataset, IterableDataset):
            arguments["sampler"] = loader.sampler
    own = settings_of(loader).loader_kwargs()
    if loader.batch_size is None:
        del own["batch_size"]  # the batch sampler's
    arguments.update(own)
    for name in _KEPT:
        if hasattr(loader, name):
            arguments[name] = getattr(loader, name)
    if "batch_sampler" in arguments:
        arguments.pop("drop_last", None)  # the batch sampler's own
    return arguments


def rebuilt(loader: DataLoader[Any], config: Config) -> DataLoader[Any]:
    """A new DataLoader like ``loader`` with ``config`` applied (:func:`apply_settings`)."""
    return DataLoader(**apply_settings(arguments_of(loader), config))


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


class Repeat:
    """An epoch of one cached batch, endless or ``times`` long: the step's rate with loading
    taken away (replay)."""

    def __init__(self, batch: Any, times: int | None = None) -> None:
        self._batch, self._times = batch, times

    def __iter__(self) -> Iterator[Any]:
        if self._times is None:
            return itertools.repeat(self._batch)
        return itertools.repeat(self._batch, self._times)


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
    it = started(DataLoader(dataset, **kwargs))
    try:
        first, second = next(it), next(it)
    except StopIteration:
        return False
    finally:
        del it
    return _same(first, second)


def unsharded_warning(loader: DataLoader[Any]) -> str | None:
    """:data:`UNSHARDED_WARNING` where the loader's IterableDataset yields the same samples in
    every worker; None otherwise, and where trying raises (the trial meets and reports the
    same error itself)."""
    if not isinstance(loader.dataset, IterableDataset):
        return None
    try:
        dup = duplicated_across_workers(
            loader.dataset, batch_size=loader.batch_size, collate_fn=loader.collate_fn
        )
    except Exception:
        return None
    return UNSHARDED_WARNING if dup else None


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
