"""Fails with text that rich would take for markup (as gloo's errors do)."""

from torch.utils.data import DataLoader

from _data import Latency

for x, y in DataLoader(Latency(n=400), batch_size=16):
    raise RuntimeError("[/__w/pytorch/third_party/gloo/pair.cc:553] Connection closed [bold]x")
