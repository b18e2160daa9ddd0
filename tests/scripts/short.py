"""Ends before a measured window can fill: one short epoch."""

from torch.utils.data import DataLoader

from _data import Latency

for x, y in DataLoader(Latency(n=400), batch_size=16):
    pass
