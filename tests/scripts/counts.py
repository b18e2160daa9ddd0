"""Records the samples its loop receives: one JSON line per finished epoch in the file argv[1],
for argv[2] epochs (the test reads that nothing was lost or duplicated within an epoch), with the
length of each batch. Optional: argv[3] workers of its own (persistent, prefetching 4 each),
argv[4] samples per epoch."""

import json
import sys

from torch.utils.data import DataLoader

from _data import Latency

out, epochs = sys.argv[1], int(sys.argv[2])
workers = int(sys.argv[3]) if len(sys.argv) > 3 else 0
n = int(sys.argv[4]) if len(sys.argv) > 4 else 600
own = {"num_workers": workers, "persistent_workers": True, "prefetch_factor": 4} if workers else {}
loader = DataLoader(Latency(n=n, sleep_s=0.0004), batch_size=16, shuffle=True, **own)
for epoch in range(epochs):
    seen: list[int] = []
    lengths: list[int] = []
    for x, _ in loader:
        seen += x[:, 0].long().tolist()
        lengths.append(len(x))
    with open(out, "a") as fh:
        fh.write(json.dumps({"epoch": epoch, "lengths": lengths, "samples": seen}) + "\n")
