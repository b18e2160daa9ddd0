"""A custom collate that returns an object showing no batch size: a class with ``__slots__``
holding the samples' tensors in a list (no leading dimension, no ``len()``), as a batch of
variable-length sequences may be. The loader holds 100 batches of 16."""

import torch
from torch.utils.data import DataLoader

from _data import Latency


class Sequences:
    __slots__ = ("items",)

    def __init__(self, items: list[torch.Tensor]) -> None:
        self.items = items


def collate(samples: list[tuple[torch.Tensor, int]]) -> Sequences:
    return Sequences([x for x, _ in samples])


loader = DataLoader(Latency(n=1600, sleep_s=0.0001), batch_size=16, collate_fn=collate)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(200):
    for batch in loader:
        loss = sum(model(x).sum() for x in batch.items)
        opt.zero_grad()
        loss.backward()
        opt.step()
