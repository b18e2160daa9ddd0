"""torchrun DDP as it is often written: a ``DistributedSampler`` with ``set_epoch``, a
validation loader on its own sampler, the loss all-reduced, rank 0 printing. Held back while
issue 11 was built; its search counted the two ranks as loader workers in the resource figures."""

import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from _frameworks import collate


class Slow(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 12, generator=g)
        self.y = torch.randint(0, 2, (n,), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        time.sleep(0.0003)
        return self.x[i], self.y[i]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=30)
    a = p.parse_args()
    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(12, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    train_set, val_set = Slow(3000, 0), Slow(300, 1)
    train_sampler = DistributedSampler(train_set)
    val_sampler = DistributedSampler(val_set, shuffle=False)
    train_loader = DataLoader(train_set, batch_size=25, sampler=train_sampler, collate_fn=collate)
    val_loader = DataLoader(val_set, batch_size=75, sampler=val_sampler, collate_fn=collate)
    for epoch in range(a.epochs):
        train_sampler.set_epoch(epoch)
        model.train()
        for x, y in train_loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        model.eval()
        total = torch.zeros(1)
        with torch.no_grad():
            for x, y in val_loader:
                total += torch.nn.functional.cross_entropy(model(x), y, reduction="sum")
        dist.all_reduce(total)
        if rank == 0:
            print(f"epoch {epoch} val {total.item() / len(val_set):.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
