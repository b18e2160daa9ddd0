"""Sizes a OneCycleLR by ``epochs * len(loader)``, as many training scripts do: the scheduler
raises at the step past its last. Records each finished epoch's batch count and samples in the
file argv[1] (one JSON line each), for argv[2] epochs. With argv[3] ``lazy`` the scheduler is
made at the first step (the length is asked once the loop, and a tuning, has begun)."""

import json
import sys

import torch
from torch.utils.data import DataLoader

from _data import Latency

out, epochs = sys.argv[1], int(sys.argv[2])
lazy = sys.argv[3:] == ["lazy"]
loader = DataLoader(Latency(n=480, sleep_s=0.0004), batch_size=16, shuffle=True)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)


def schedule() -> torch.optim.lr_scheduler.OneCycleLR:
    return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=epochs * len(loader))


sched = None if lazy else schedule()
for epoch in range(epochs):
    seen: list[int] = []
    batches = 0
    for x, _ in loader:
        opt.step()
        sched = sched or schedule()
        sched.step()  # ValueError: "Tried to step ... times" past epochs * len(loader)
        seen += x[:, 0].long().tolist()
        batches += 1
    with open(out, "a") as fh:
        fh.write(json.dumps({"epoch": epoch, "batches": batches, "samples": seen}) + "\n")
