"""Accelerate as it is often written: gradient accumulation, a scheduler, the evaluation loader
prepared in the same ``prepare()`` call (between the model and the optimizer), metrics gathered,
``accelerator.print``. Held back while issue 11 was built; its search found that a hot-swapping
trial process could not run another batch size on the prepared loader (recorded ``not_applied``)."""

import argparse
import time

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, Dataset

from _frameworks import ON_CPU, collate


class Slow(Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 10, generator=g)
        self.y = torch.randint(0, 3, (n,), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        time.sleep(0.0002)
        return self.x[i], self.y[i]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=20)
    a = p.parse_args()
    accelerator = Accelerator(gradient_accumulation_steps=4, cpu=ON_CPU)
    model = torch.nn.Sequential(torch.nn.Linear(10, 64), torch.nn.GELU(), torch.nn.Linear(64, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, 5)
    train_dl = DataLoader(Slow(4000, 0), batch_size=16, shuffle=True, collate_fn=collate)
    eval_dl = DataLoader(Slow(400, 1), batch_size=100, collate_fn=collate)
    model, eval_dl, opt, train_dl, sched = accelerator.prepare(model, eval_dl, opt, train_dl, sched)
    for epoch in range(a.epochs):
        model.train()
        for step, (x, y) in enumerate(train_dl):
            with accelerator.accumulate(model):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                accelerator.backward(loss)
                opt.step()
                sched.step()
                opt.zero_grad()
        model.eval()
        correct = 0
        for x, y in eval_dl:
            with torch.no_grad():
                pred = model(x).argmax(-1)
            correct += accelerator.gather_for_metrics((pred == y).sum()).item()
        accelerator.print(f"epoch {epoch}: acc {correct / 400:.3f}")


if __name__ == "__main__":
    main()
