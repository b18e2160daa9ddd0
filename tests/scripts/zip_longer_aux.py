"""A training loader zipped with a larger auxiliary one that loads in no time (an unlabelled
set for a consistency loss): ``zip`` ends each epoch with the shorter, the training loader, and
every step waits on it. It is the one to tune, though the auxiliary one yields last and has the
longer epoch."""

import torch
from torch.utils.data import DataLoader, TensorDataset

from _data import Latency

train = DataLoader(Latency(n=4000), batch_size=16, shuffle=True)
aux = DataLoader(TensorDataset(torch.randn(20000, 8)), batch_size=16, shuffle=True)
model = torch.nn.Linear(8, 3)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(5):
    for (x, y), (xa,) in zip(train, aux, strict=False):
        loss = torch.nn.functional.cross_entropy(model(x), y) + 1e-3 * model(xa).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
