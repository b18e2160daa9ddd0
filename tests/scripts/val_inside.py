"""A validation pass inside the training epoch every 40 steps (Lightning's val_check_interval,
the Hugging Face Trainer's eval_steps), each far longer than those 40 steps' loading: argv[1]
"val" runs it, anything else leaves it out; argv[2], optional: the training loader's samples
(20,000)."""

import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

from _data import Latency


class SlowVal(Dataset):
    def __len__(self) -> int:
        return 120

    def __getitem__(self, i: int):
        time.sleep(0.01)
        return torch.zeros(8), 0


validate = len(sys.argv) > 1 and sys.argv[1] == "val"
n = int(sys.argv[2]) if len(sys.argv) > 2 else 20000
train = DataLoader(Latency(n=n), batch_size=16, shuffle=True)
val = DataLoader(SlowVal(), batch_size=8)
model = torch.nn.Linear(8, 3)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for epoch in range(3):
    for step, (x, y) in enumerate(train):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        if validate and step % 40 == 39:
            with torch.no_grad():
                for xv, _ in val:
                    model(xv)
