"""Workers that take seconds to start (as under 'spawn', where each imports torch and the script
again): their first batch comes later than a trial's hang limit, and they are not hung."""

import time

import torch
from torch.utils.data import DataLoader

from _data import Latency


def slow_start(worker_id: int) -> None:
    time.sleep(2.5)


loader = DataLoader(Latency(), batch_size=16, num_workers=2, worker_init_fn=slow_start)
model = torch.nn.Linear(8, 3)
for _ in range(3):
    for x, y in loader:
        torch.nn.functional.cross_entropy(model(x), y).backward()
