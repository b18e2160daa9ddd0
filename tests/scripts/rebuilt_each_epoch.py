"""A new DataLoader every epoch, made by a function (its order seeded by the epoch, as a
curriculum may be): records each finished epoch's samples and the loader's settings as the
loop saw them, one JSON line each in the file argv[1], for argv[2] epochs. With argv[3]
``grow`` the batch size doubles after epoch 2 (a schedule of batch sizes)."""

import json
import sys

import torch
from torch.utils.data import DataLoader

from _data import Latency

out, epochs = sys.argv[1], int(sys.argv[2])
grow = sys.argv[3:] == ["grow"]
data = Latency(n=600, sleep_s=0.0004)


def make_loader(epoch: int) -> DataLoader:
    size = 32 if grow and epoch > 2 else 16
    order = torch.Generator().manual_seed(epoch)
    return DataLoader(data, batch_size=size, shuffle=True, generator=order)


for epoch in range(epochs):
    loader = make_loader(epoch)
    seen: list[int] = []
    lengths: list[int] = []
    for x, _ in loader:
        seen += x[:, 0].long().tolist()
        lengths.append(len(x))
    line = {"samples": seen, "lengths": lengths, "workers": loader.num_workers}
    with open(out, "a") as fh:
        fh.write(json.dumps(line) + "\n")
