"""Each worker keeps every sample it makes: memory grows ~4 MiB per sample."""

import torch
from torch.utils.data import DataLoader

from _data import Latency


class Hog(Latency):
    kept = []

    def __getitem__(self, i):
        self.kept.append(torch.ones(1 << 20))
        return super().__getitem__(i)


for x, y in DataLoader(Hog(sleep_s=0.0), batch_size=8):
    pass
