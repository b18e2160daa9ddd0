"""A sibling module the test scripts import: proves the script's directory is on sys.path."""

import time

import torch
from torch.utils.data import Dataset


class Latency(Dataset):
    """Samples that wait a little (I/O latency), so more workers help."""

    def __init__(self, n: int = 20000, sleep_s: float = 0.0004) -> None:
        self.n, self.sleep_s = n, sleep_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        time.sleep(self.sleep_s)
        return torch.full((8,), float(i)), i % 3
