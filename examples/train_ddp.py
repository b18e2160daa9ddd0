"""Train a small classifier with DistributedDataParallel on the CPU (gloo), as torchrun runs it.

The data are synthetic feature vectors made by the Dataset itself, with a little I/O latency per
sample (``--latency-ms``), split across the ranks by a ``DistributedSampler``; each epoch ends
with a validation pass whose loss is averaged over the ranks.

Run it as torchrun would (two ranks on this machine)::

    torchrun --standalone --nproc-per-node 2 examples/train_ddp.py --epochs 2

Let loadertune tune it: every trial runs both ranks under torch's launcher, each rank's
training loader with the trial's setting; the result is for world size 2. Then train with it::

    loadertune search --nproc-per-node 2 examples/train_ddp.py --budget 90
    loadertune run --nproc-per-node 2 examples/train_ddp.py -- --epochs 5
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Features(Dataset):
    """``n`` feature vectors of 16 values and a binary label, each made from its index."""

    def __init__(self, n: int, latency_s: float, seed: int = 0) -> None:
        self.n, self.latency_s, self.seed = n, latency_s, seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.latency_s)  # stands for reading a sample from storage
        x = torch.randn(16, generator=torch.Generator().manual_seed(self.seed * 1_000_003 + i))
        return x, int(x[:4].sum() > 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--latency-ms", type=float, default=0.3)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)  # the ranks share the CPUs
    latency_s = args.latency_ms / 1000
    train_set, val_set = Features(4096, latency_s, seed=0), Features(512, latency_s, seed=1)
    train_sampler = DistributedSampler(train_set, shuffle=True)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
    val_loader = DataLoader(
        val_set, batch_size=128, sampler=DistributedSampler(val_set, shuffle=False)
    )
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(args.epochs):
        train_sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
        model.train()
        for x, y in train_loader:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        model.eval()
        loss = torch.zeros(2)
        with torch.no_grad():
            for x, y in val_loader:
                loss += torch.tensor([torch.nn.functional.cross_entropy(model(x), y).item(), 1.0])
        dist.all_reduce(loss)  # (sum of batch losses, batches) over the ranks
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: validation loss {loss[0] / loss[1]:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
