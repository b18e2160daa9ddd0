"""The frontier of what this machine can run: settings not worth trying, from what failed.

A setting that asks for at least as much of a resource that already ran out (host memory,
shared memory, file descriptors) would fail the same way; a batch the GPU-memory model predicts
will need more than :data:`UNVERIFIED_REACH` times what fits (with the margin) is not tried
either; and a batch size that ran out of GPU memory is never recommended.

Why a reach beyond the prediction: the line fitted on small batches under-predicts what fits
near the memory limit (docs/design.md). A batch between the two is tried: running out is a
trial's recorded failure, and it rules out every larger batch.
"""

from __future__ import annotations

from loadertune.config import Config
from loadertune.measure.failures import RESOURCE_KINDS
from loadertune.search import memory
from loadertune.search.memory import MemoryModel
from loadertune.trials import TrialResult
from loadertune.units import MIB

UNVERIFIED_REACH = 2.0  # batches up to this multiple of the predicted largest are still tried


def dominated(config: Config, failed: Config, kind: str) -> bool:
    """Would ``config`` fail like ``failed`` did? True when it asks for at least as much of
    the resource that ran out."""
    if kind == "pickle_error":  # no worker can receive the dataset
        return config.num_workers > 0
    if config == failed:  # the same setting fails the same way: never run it twice
        return True
    if kind == "dataset_error_with_setting" and failed.num_workers:  # state lost at the
        # workers' start (a handle made in the main process): as many workers lose it too
        return config.num_workers >= failed.num_workers
    if kind == "batch_size_rejected":  # the user's code fails at this batch size, any loading
        return config.batch_size == failed.batch_size
    if kind == "oom":  # GPU memory grows with the batch, not the workers; pinning the batch
        # adds none (its copy is host memory), so an unpinned batch that ran out rules out the
        # pinned one too, but not the other way round (pinning itself may fail as "out of
        # memory", a page-locked host allocation)
        return config.batch_size >= failed.batch_size and (
            config.pin_memory == failed.pin_memory or not failed.pin_memory
        )
    if kind == "timeout" and failed.num_workers:  # too slow to start or to deliver: more
        # workers start slower still, whatever their prefetch
        return config.num_workers >= failed.num_workers and config.batch_size >= failed.batch_size
    if kind not in RESOURCE_KINDS or failed.num_workers == 0:
        return False
    return (
        config.num_workers >= failed.num_workers
        and config.batch_size >= failed.batch_size
        and config.in_flight_batches >= failed.in_flight_batches
    )


class Frontier:
    """Failures and GPU-memory points seen so far, and what they rule out.

    Args:
        margin: share of GPU memory kept free when predicting the largest batch.
    """

    def __init__(self, *, margin: float) -> None:
        self.margin = margin
        self.failed: list[tuple[Config, str]] = []
        self._points: list[tuple[int, int]] = []  # (batch size, CUDA peak reserved)
        self._capacities: list[int] = []
        self._largest_ok = 0  # the largest batch that ran

    def learn(self, result: TrialResult) -> None:
        if result.failure is not None:
            self.failed.append((result.config, result.failure.kind))
            return
        if result.ok:
            self._largest_ok = max(self._largest_ok, result.config.batch_size)
            if result.cuda_peak_reserved_bytes:
                self._points.append((result.config.batch_size, result.cuda_peak_reserved_bytes))
        if result.cuda_capacity_bytes:
            self._capacities.append(result.cuda_capacity_bytes)

    def learn_previous(self, ran: list[Config], failed: list[tuple[Config, str]]) -> None:
        """What an earlier run of the study measured and saw fail."""
        self.failed.extend(failed)
        self._largest_ok = max([self._largest_ok, *(c.batch_size for c in ran)])

    @property
    def oom_batch_sizes(self) -> list[int]:
        return sorted({c.batch_size for c, kind in self.failed if kind == "oom"})

    def memory_model(self) -> tuple[MemoryModel | None, int | None]:
        """The fitted peak-memory line and the GPU capacity (Nones without CUDA)."""
        capacity = min(self._capacities) if self._capacities else None
        return memory.fit(self._points), capacity

    def rules_out(self, config: Config) -> str | None:
        """Why ``config`` is not worth running, or None."""
        for failed, kind in self.failed:
            if dominated(config, failed, kind):
                return f"at least as demanding as {failed.label()}, which failed ({kind})"
        if config.batch_size <= self._largest_ok:
            return None  # a batch this large already ran
        model, capacity = self.memory_model()
        if model is None or capacity is None:
            return None
        limit = model.max_batch_size(capacity, margin=self.margin)
        if limit is None or config.batch_size <= UNVERIFIED_REACH * limit:
            return None
        return (
            f"batch_size {config.batch_size} is predicted to need "
            f"{model.predict(config.batch_size) / MIB:,.0f} MiB of GPU memory, more than "
            f"{UNVERIFIED_REACH:g}x the batch predicted to fit in "
            f"{(1 - self.margin) * capacity / MIB:,.0f} MiB"
        )

    def may_win(self, config: Config) -> bool:
        """False for a batch size that ran out of GPU memory (or a larger one)."""
        oom = self.oom_batch_sizes
        return not oom or config.batch_size < oom[0]
