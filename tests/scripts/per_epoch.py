"""A new DataLoader every epoch, as many scripts do (issue 14)."""

import torch
from torch.utils.data import DataLoader

from _data import Latency

dataset = Latency(n=300)
model = torch.nn.Linear(8, 3)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(1000):
    for x, y in DataLoader(dataset, batch_size=16, shuffle=True):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
