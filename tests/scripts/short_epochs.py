"""Epochs the loop ends early: ``break`` after N steps (argv[1]; 0: whole epochs), as a script
with a fixed number of steps per epoch does; ``peek`` (argv[2]) first takes one batch alone,
as a script that looks at a batch's shape does. The loader holds 100 batches of 16."""

import sys

from torch.utils.data import DataLoader

from _data import Latency

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 0
loader = DataLoader(Latency(n=1600, sleep_s=0.0001), batch_size=16, shuffle=True)
if "peek" in sys.argv[2:]:
    x, y = next(iter(loader))
for epoch in range(200):
    for i, (x, y) in enumerate(loader):
        if steps and i + 1 == steps:
            break
