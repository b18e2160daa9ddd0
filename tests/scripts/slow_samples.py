"""Slow samples read by two workers: each probe trial of this script takes seconds, so a test can
interrupt a search after its baseline and before its probe is done (issue 14)."""

import time

import torch
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __len__(self) -> int:
        return 4000

    def __getitem__(self, i: int):
        time.sleep(0.04)
        return torch.full((8,), float(i))


loader = DataLoader(Slow(), batch_size=8, num_workers=2)
for _ in range(3):
    for x in loader:
        pass
