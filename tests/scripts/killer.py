"""Workers die (SIGKILL, as the OOM killer does) when there are 3 or more of them."""

import os
import signal

import torch
from torch.utils.data import DataLoader, get_worker_info

from _data import Latency


class Fragile(Latency):
    def __getitem__(self, i):
        info = get_worker_info()
        if info is not None and info.num_workers >= 3 and i > 50:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().__getitem__(i)


loader = DataLoader(Fragile(), batch_size=16, shuffle=True)
for epoch in range(3):
    for x, y in loader:
        torch.mm(x.T, x)
