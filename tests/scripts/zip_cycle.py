"""A main loader zipped with a small auxiliary one that ``itertools.cycle`` repeats: the cycle
takes the auxiliary loader's batches first at each step, so it yields last before every step of
its first pass. The main loader, whose epoch is the training's, is the one to tune."""

import itertools

import torch
from torch.utils.data import DataLoader

from _data import Latency

main = DataLoader(Latency(n=4000), batch_size=16, shuffle=True)
aux = DataLoader(Latency(n=800, sleep_s=0.0), batch_size=16, shuffle=True)
model = torch.nn.Linear(8, 3)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(5):
    for (x, y), (xa, ya) in zip(main, itertools.cycle(aux)):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss = loss + torch.nn.functional.cross_entropy(model(xa), ya)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
