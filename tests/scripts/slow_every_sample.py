"""Every sample waits 0.5 s, one worker's batch of one at a time: a persistent setting's start-up
measured after a window is one batch's fetch from idle workers, unless it waits for the batches
still queued before it (see test_script.py)."""

import time

import torch
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __len__(self) -> int:
        return 4000

    def __getitem__(self, i: int):
        time.sleep(0.5)
        return torch.zeros(4)


loader = DataLoader(Slow(), batch_size=1, num_workers=2)
for _ in range(2):
    for x in loader:
        pass
