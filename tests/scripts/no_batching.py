"""A dataset whose items are whole batches: ``DataLoader(batch_size=None)``, no automatic
batching. The loop checks each batch's shape, as a model's loss would: a loader re-batched by
a trial (a batch of 1 of them) fails it."""

import time

import torch
from torch.utils.data import DataLoader, Dataset


class Batches(Dataset):
    def __len__(self) -> int:
        return 400

    def __getitem__(self, i: int):
        time.sleep(0.0005)
        return torch.full((16, 8), float(i)), torch.zeros(16, dtype=torch.long)


loader = DataLoader(Batches(), batch_size=None, shuffle=True)
for epoch in range(50):
    for x, y in loader:
        if x.shape != (16, 8) or y.shape != (16,):
            raise RuntimeError(f"expected a batch of 16, got {tuple(x.shape)}")
