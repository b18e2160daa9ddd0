"""Where a DataLoader's batches in flight live: each worker's PSS, the main process's, and the
used space of ``/dev/shm``, at prefetch factors 1 and 4, with the buffers full (the loop waits
after its first batch). The search's RAM cap counts a worker's memory as seen, plus its
batches in flight apart (``search/probe.py:space_for``); this is the check that the batches
are not in the worker's memory already.

    python scripts/bench_worker_memory.py [--mb 1] [--batch 32] [--workers 2]
"""

from __future__ import annotations

import argparse
import shutil
import time

import psutil
import torch
from torch.utils.data import DataLoader, Dataset

MIB = 2**20


class Samples(Dataset[torch.Tensor]):
    def __init__(self, mb: float) -> None:
        self.numel = int(mb * MIB) // 4  # float32

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.ones(self.numel)


def measure(args: argparse.Namespace, prefetch: int) -> None:
    shm_before = shutil.disk_usage("/dev/shm").used
    loader = DataLoader(
        Samples(args.mb),
        batch_size=args.batch,
        num_workers=args.workers,
        prefetch_factor=prefetch,
    )
    it = iter(loader)
    next(it)
    time.sleep(args.settle_s)  # every worker fills its share of the buffer
    workers = [p.memory_full_info().pss / MIB for p in psutil.Process().children(recursive=True)]
    main = psutil.Process().memory_full_info().pss / MIB
    shm = (shutil.disk_usage("/dev/shm").used - shm_before) / MIB
    in_flight = args.workers * prefetch * args.batch * args.mb
    print(
        f"prefetch {prefetch}: {in_flight:.0f} MiB in flight; worker PSS "
        f"{', '.join(f'{w:.0f}' for w in workers)} MiB; main PSS {main:.0f} MiB; "
        f"/dev/shm +{shm:.0f} MiB"
    )
    del it


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=1.0, help="MiB per sample")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--settle-s", type=float, default=4.0)
    args = parser.parse_args()
    for prefetch in (1, 4):
        measure(args, prefetch)


if __name__ == "__main__":
    main()
