"""How many samples a batch holds: exactly, from the batch sampler, or from its structure."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping
from typing import Any


def structure_count(batch: Any) -> int:
    """Samples in a batch of unknown size: the leading dimension of its first tensor-like leaf.

    A list of plain objects (strings, dicts of scalars) counts its length. A custom collate's
    object (a dataclass, a class with attributes) counts by its first attribute with a leading
    dimension; one with none, by its ``len()``, else 1.
    """
    shape = getattr(batch, "shape", None)
    if shape is not None and len(shape) > 0:
        return int(shape[0])
    if isinstance(batch, Mapping):
        return structure_count(next(iter(batch.values()))) if batch else 0
    if isinstance(batch, (list, tuple)):
        if batch and (
            getattr(batch[0], "shape", None) is not None or isinstance(batch[0], Mapping)
        ):
            return structure_count(batch[0])
        return len(batch)
    fields = _attributes(batch)
    for value in fields:
        value_shape = getattr(value, "shape", None)
        if value_shape is not None and len(value_shape) > 0:
            return int(value_shape[0])
    with contextlib.suppress(TypeError):
        return len(batch)
    return 1


def _attributes(batch: Any) -> list[Any]:
    """A custom batch object's attribute values, in their order (a dataclass's fields)."""
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        return [getattr(batch, f.name, None) for f in dataclasses.fields(batch)]
    try:
        return list(vars(batch).values())
    except TypeError:  # no __dict__ (a number, a string)
        return []


class FixedCount:
    """Exact count for a regular batch sampler: ``batch_size``, but an epoch's short last batch.

    A class rather than a closure so the meter can read it inline on its hot path.
    """

    def __init__(
        self, batch_size: int, epoch_samples: int | None = None, drop_last: bool = False
    ) -> None:
        self.batch_size = batch_size
        self.short_at, self.short = -1, batch_size  # index in the epoch of the short batch
        if epoch_samples is not None and not drop_last and epoch_samples % batch_size:
            self.short_at, self.short = divmod(epoch_samples, batch_size)

    def __call__(self, batch: Any, index_in_epoch: int) -> int:
        return self.short if index_in_epoch == self.short_at else self.batch_size


def structure_counter(batch: Any, index_in_epoch: int) -> int:
    return structure_count(batch)
