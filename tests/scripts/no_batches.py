"""Ten samples, drop_last=True: ``no_batches.py [loop|next] [BATCH_SIZE]`` (default: loop, 4).

With a batch size over 10 the loader yields nothing: the ``loop`` ends without a batch, and
``next`` (``next(iter(loader))``, as scripts do for a sample batch) raises StopIteration.
"""

import sys

import torch
from torch.utils.data import DataLoader

mode = sys.argv[1] if len(sys.argv) > 1 else "loop"
batch_size = int(sys.argv[2]) if len(sys.argv) > 2 else 4
loader = DataLoader(torch.arange(10.0), batch_size=batch_size, drop_last=True)
if mode == "next":
    sample = next(iter(loader))
for epoch in range(100_000):
    for x in loader:
        pass
