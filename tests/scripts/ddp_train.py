"""DistributedDataParallel as torchrun runs it: ``torchrun --nproc-per-node 2 ddp_train.py``
(gloo on the CPU)."""

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from _frameworks import Features, collate

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=50)
epochs = parser.parse_args().epochs
dist.init_process_group("gloo")
torch.set_num_threads(1)
dataset = Features()
sampler = DistributedSampler(dataset, shuffle=True)
loader = DataLoader(dataset, batch_size=32, sampler=sampler, collate_fn=collate)
model = DistributedDataParallel(torch.nn.Linear(16, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
for epoch in range(epochs):
    sampler.set_epoch(epoch)
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
dist.destroy_process_group()
print("rank", os.environ["RANK"], "done")
