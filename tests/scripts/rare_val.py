"""A validation loader (#1) iterated once per training epoch; argv[1]: the training epoch's
samples (1 ms each: 4000 make a training epoch of 4 s between two validation passes)."""

import sys

from torch.utils.data import DataLoader

from _data import Latency

train_samples = int(sys.argv[1]) if len(sys.argv) > 1 else 4000
val = DataLoader(Latency(n=256, sleep_s=0.002), batch_size=64)
train = DataLoader(Latency(n=train_samples, sleep_s=0.001), batch_size=16, shuffle=True)
for epoch in range(1000):
    for x, y in val:
        pass
    for x, y in train:
        pass
