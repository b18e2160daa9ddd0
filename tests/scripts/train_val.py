"""Train and validation loaders; the validation loader is created first, the training one is
iterated first."""

import torch
from torch.utils.data import DataLoader

from _data import Latency

val = DataLoader(Latency(n=512, sleep_s=0.0), batch_size=64)
train = DataLoader(Latency(), batch_size=16, shuffle=True, num_workers=1)
model = torch.nn.Linear(8, 3)
for epoch in range(5):
    for x, y in train:
        torch.nn.functional.cross_entropy(model(x), y).backward()
    with torch.no_grad():
        for x, y in val:
            model(x)
