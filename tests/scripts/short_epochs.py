"""Epochs the loop ends early: ``break`` after N steps (argv[1]; 0: whole epochs), as a script
with a fixed number of steps per epoch does. The loader holds 100 batches of 16."""

import sys

from torch.utils.data import DataLoader

from _data import Latency

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 0
loader = DataLoader(Latency(n=1600, sleep_s=0.0001), batch_size=16, shuffle=True)
for epoch in range(200):
    for i, (x, y) in enumerate(loader):
        if steps and i + 1 == steps:
            break
