"""Gradient accumulation: the optimizer steps once every 16 batches, so the loader that feeds it
is known only after 32 batches, when a short window has filled already."""

import torch
from torch.utils.data import DataLoader

from _data import Latency

model = torch.nn.Linear(8, 3)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(Latency(n=4000, sleep_s=0.001), batch_size=16)
for epoch in range(20):
    for i, (x, y) in enumerate(loader):
        torch.nn.functional.cross_entropy(model(x), y).backward()
        if i % 16 == 15:
            optimizer.step()
            optimizer.zero_grad()
