"""Few file descriptors (ulimit -n 64) and samples of many small tensors: each tensor in flight
from a worker holds a descriptor, so many workers with deep prefetch run out."""

import resource

import torch
from torch.utils.data import DataLoader, Dataset

resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))


class Many(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        return [torch.zeros(2) for _ in range(8)]


for batch in DataLoader(Many(), batch_size=4):
    pass
