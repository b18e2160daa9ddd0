"""Ends before a measured window can fill: one short epoch."""

from _data import Latency
from torch.utils.data import DataLoader

for x, y in DataLoader(Latency(n=400), batch_size=16):
    pass
