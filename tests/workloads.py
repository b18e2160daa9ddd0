"""Small datasets and steps with known behaviour, for tests (importable by scripts too)."""

from __future__ import annotations

import os
import signal
import time

import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info


class SleepDataset(Dataset):
    """Each sample waits ``sleep_s`` (I/O latency): more workers help, even past the CPUs."""

    def __init__(self, n: int = 20000, sleep_s: float = 0.0005, dim: int = 16) -> None:
        self.n, self.sleep_s, self.dim = n, sleep_s, dim

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(self.sleep_s)
        return torch.full((self.dim,), float(i))


class TensorDataset(Dataset):
    """Cheap in-memory samples: workers only add overhead."""

    def __init__(self, n: int = 4096, dim: int = 8) -> None:
        self.data = torch.randn(n, dim)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.data[i]


def _workers() -> int:
    info = get_worker_info()
    return info.num_workers if info is not None else 0


class FaultDataset(Dataset):
    """Misbehaves when loaded by at least ``min_workers`` workers (0: always), at index >= ``at``.

    ``fault``: "raise" (a dataset bug), "sigkill" (as the OOM killer would), "sigbus" (shared
    memory exhausted), "hang" (sleep forever).
    """

    def __init__(self, fault: str, *, min_workers: int = 0, at: int = 5, n: int = 4000) -> None:
        self.fault, self.min_workers, self.at, self.n = fault, min_workers, at, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if (
            i >= self.at
            and _workers() >= self.min_workers
            and (self.min_workers == 0 or _workers() > 0)
        ):
            if self.fault == "raise":
                raise ValueError(f"corrupt sample {i}")
            if self.fault == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            if self.fault == "sigbus":
                os.kill(os.getpid(), signal.SIGBUS)
            if self.fault == "hang":
                time.sleep(3600)
        return torch.zeros(4)


class UnshardedStream(IterableDataset):
    """An IterableDataset that ignores get_worker_info(): every worker yields every sample."""

    def __init__(self, n: int = 2000) -> None:
        self.n = n

    def __iter__(self):  # type: ignore[no-untyped-def]
        for i in range(self.n):
            yield torch.full((4,), float(i))


class ShardedStream(UnshardedStream):
    def __iter__(self):  # type: ignore[no-untyped-def]
        info = get_worker_info()
        start, step = (info.id, info.num_workers) if info else (0, 1)
        for i in range(start, self.n, step):
            yield torch.full((4,), float(i))


def sleep_step(seconds: float):  # type: ignore[no-untyped-def]
    """A step that takes ``seconds`` per batch (a stand-in for a GPU step)."""

    def step(batch: object) -> None:
        time.sleep(seconds)

    return step
