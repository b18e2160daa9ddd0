"""A hand-written loop with Hugging Face Accelerate: ``prepare`` rebuilds both loaders (the
validation one is passed first)."""

import argparse

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader

from _frameworks import ON_CPU, Features, ValFeatures, collate

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=20)
epochs = parser.parse_args().epochs
accelerator = Accelerator(cpu=ON_CPU)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
train = DataLoader(Features(), batch_size=32, shuffle=True, collate_fn=collate)
val = DataLoader(ValFeatures(n=500), batch_size=50, collate_fn=collate)
val, model, optimizer, train = accelerator.prepare(val, model, optimizer, train)

for epoch in range(epochs):
    model.train()
    for x, y in train:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        accelerator.backward(loss)
        optimizer.step()
    model.eval()
    with torch.no_grad():
        for x, y in val:
            model(x)
