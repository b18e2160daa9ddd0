"""GPU memory is affine in the batch size: fit it, and predict the largest batch that fits.

The source documents' formula: memory ≈ model part + batch_size × per-sample part. The model part
is the parameters times 1 (inference), 2 (SGD), 3 (SGD with momentum) or 4 (Adam), plus buffers;
the per-sample part is activations and their gradients. Two measured peaks fix the line; a third
checks it. Memory creeps up over a real training run, so the prediction keeps a margin (10% by
default) rather than filling the card, and a predicted batch is only recommended after a trial
at that size ran without running out of memory.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from typing import Any

from loadertune.units import MIB


@dataclass(frozen=True)
class MemoryModel:
    """``peak_bytes ≈ fixed_bytes + per_sample_bytes * batch_size``, from measured points.

    Attributes:
        fixed_bytes: the model part (parameters, gradients, optimizer state, buffers, CUDA context
            use counted by the allocator).
        per_sample_bytes: what each sample of a batch adds (activations and their gradients).
        points: the (batch_size, peak_bytes) pairs it was fitted on.
        max_error: the largest relative error of the fit on those points (0 with two points).
    """

    fixed_bytes: float
    per_sample_bytes: float
    points: tuple[tuple[int, int], ...]
    max_error: float

    def predict(self, batch_size: int) -> float:
        return self.fixed_bytes + self.per_sample_bytes * batch_size

    def max_batch_size(self, capacity_bytes: float, *, margin: float = 0.10) -> int | None:
        """The largest batch whose predicted peak stays within ``(1 - margin) * capacity``.

        None when even the fixed part does not fit, or when memory does not grow with the batch
        (nothing bounds it).
        """
        if not 0 <= margin < 1:
            raise ValueError(f"margin must be in [0, 1), but got {margin!r}.")
        room = (1 - margin) * capacity_bytes - self.fixed_bytes
        if room <= 0 or self.per_sample_bytes <= 0:
            return None
        return math.floor(room / self.per_sample_bytes)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(fixed_mib=self.fixed_bytes / MIB, per_sample_mib=self.per_sample_bytes / MIB)
        return data


def fit(points: list[tuple[int, int]]) -> MemoryModel | None:
    """Least-squares line through (batch_size, peak_bytes); None with fewer than two batch sizes.

    Several peaks at one batch size are averaged first (the allocator's peaks vary a little).
    """
    by_size: dict[int, list[int]] = {}
    for bs, peak in points:
        if peak and peak > 0:
            by_size.setdefault(int(bs), []).append(int(peak))
    if len(by_size) < 2:
        return None
    xs = sorted(by_size)
    ys = [statistics.fmean(by_size[x]) for x in xs]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sxx
    intercept = mean_y - slope * mean_x
    errors = [abs(intercept + slope * x - y) / y for x, y in zip(xs, ys, strict=True)]
    return MemoryModel(
        fixed_bytes=intercept,
        per_sample_bytes=slope,
        points=tuple((x, int(y)) for x, y in zip(xs, ys, strict=True)),
        max_error=max(errors),
    )


def largest_safe_batch(
    model: MemoryModel | None,
    capacity_bytes: float | None,
    *,
    candidates: list[int],
    oom_at: list[int],
    margin: float = 0.10,
) -> int | None:
    """The largest candidate batch size to try: within the model's prediction (with margin) and
    below every size that already ran out of memory. None when nothing is known to fit."""
    limit = math.inf
    if oom_at:
        limit = min(oom_at) - 1
    if model is not None and capacity_bytes:
        predicted = model.max_batch_size(capacity_bytes, margin=margin)
        if predicted is not None:
            limit = min(limit, predicted)
    fitting = [c for c in candidates if c <= limit]
    return max(fitting) if fitting else None
