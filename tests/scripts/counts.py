"""Records the samples its loop receives: one JSON line per finished epoch in the file argv[1],
for argv[2] epochs (the test reads that nothing was lost or duplicated within an epoch)."""

import json
import sys

from torch.utils.data import DataLoader

from _data import Latency

out, epochs = sys.argv[1], int(sys.argv[2])
loader = DataLoader(Latency(n=600, sleep_s=0.0004), batch_size=16, shuffle=True)
for epoch in range(epochs):
    seen: list[int] = []
    batches = 0
    for x, _ in loader:
        seen += x[:, 0].long().tolist()
        batches += 1
    with open(out, "a") as fh:
        fh.write(json.dumps({"epoch": epoch, "batches": batches, "samples": seen}) + "\n")
