"""How fast a worker's private memory grows (the diagnosis's copy-on-read figure) on datasets
that copy on read and datasets that do not, so the threshold sits between them.

    python scripts/bench_copy_on_read.py [--reps 2] [--budget 10]

Each dataset is tuned with ``tune_loader`` (batch 256, up to 2 workers, the baseline at 2) and
the per-worker growth of every trial with workers is printed, with the median the diagnosis
reads and its verdict (``analysis.COPY_ON_READ_BYTES_PER_S``).
"""

from __future__ import annotations

import argparse
import statistics

import torch
from torch.utils.data import Dataset, TensorDataset

from loadertune import tune_loader
from loadertune.results.analysis import COPY_ON_READ_BYTES_PER_S
from loadertune.units import MIB


class Records(Dataset):
    """Python objects: a forked worker copies each page it touches (reference counts)."""

    def __init__(self, n: int = 2_000_000) -> None:
        self.items = [{"id": i, "label": i % 10} for i in range(n)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> torch.Tensor:
        item = self.items[i]
        return torch.tensor([item["id"], item["label"]], dtype=torch.float32)


class Computed(Dataset):
    """Holds one int; every sample is computed."""

    def __len__(self) -> int:
        return 20_000

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((64,), float(i))


DATASETS = {
    "2M dicts (copies on read)": Records,
    "TensorDataset 50000x32": lambda: TensorDataset(torch.randn(50_000, 32)),
    "computed (holds one int)": Computed,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--budget", type=float, default=10.0)
    args = parser.parse_args()
    print(f"threshold: {COPY_ON_READ_BYTES_PER_S / MIB:.0f} MiB/s per worker")
    for name, make in DATASETS.items():
        dataset = make()
        for rep in range(args.reps):
            rec = tune_loader(
                dataset,
                batch_size=256,
                shuffle=True,
                max_workers=2,
                baseline={"num_workers": 2},
                budget_s=args.budget,
                window_s=0.3,
                verbose=False,
                resume=False,
            )
            per_trial = [
                (t.resources.worker_uss_growth_bytes_per_s or 0.0) / t.resources.n_workers / MIB
                for t in rec.trials
                if t.config.num_workers and t.resources and t.resources.n_workers
            ]
            host = rec.diagnosis["memory"]["host"]
            growth = host["worker_uss_growth_bytes_per_s"]
            median = "-" if growth is None else f"{growth / MIB:.1f}"
            print(
                f"{name}, run {rep + 1}: per trial {min(per_trial):.1f}..{max(per_trial):.1f} "
                f"MiB/s (median {statistics.median(per_trial):.1f}); the winner's median "
                f"{median} MiB/s; copy_on_read={host['copy_on_read']}"
            )


if __name__ == "__main__":
    main()
