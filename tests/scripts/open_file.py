"""A dataset that opens a file in ``__init__`` and reads each record with ``seek`` then
``read``: right without workers, and wrong in forked workers, which share its offset. One JSON
line per epoch in the file argv[1], for argv[2] epochs: the samples received, the records read
wrong, and the loader's num_workers."""

import json
import struct
import sys
import tempfile

import torch
from torch.utils.data import DataLoader, Dataset

N = 400


class Records(Dataset):
    def __init__(self) -> None:
        self.f = tempfile.TemporaryFile()  # noqa: SIM115 (opened once: one offset for all)
        self.f.write(b"".join(struct.pack("<q", i) for i in range(N)))

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int):
        self.f.seek(8 * i)
        (j,) = struct.unpack("<q", self.f.read(8))
        return torch.tensor([i, j])


out, epochs = sys.argv[1], int(sys.argv[2])
loader = DataLoader(Records(), batch_size=16, shuffle=True)
for epoch in range(epochs):
    seen, wrong = [], 0
    for batch in loader:
        seen += batch[:, 0].tolist()
        wrong += int((batch[:, 0] != batch[:, 1]).sum())
    with open(out, "a") as fh:
        line = {"epoch": epoch, "samples": seen, "wrong": wrong, "workers": loader.num_workers}
        fh.write(json.dumps(line) + "\n")
