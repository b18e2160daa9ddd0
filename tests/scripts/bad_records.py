"""A dataset with a few bad records (their __getitem__ raises, as a corrupt file's would) and a
loop that catches the error around next() and goes on, as plain torch lets it: one JSON line per
epoch in the file argv[1], for argv[2] epochs, with the samples received and the batches that
raised. Optional: argv[3] workers of its own (persistent, prefetching 4 each); argv[4]
"in-workers": the records are bad in a worker only (as a handle made in the main process that
does not survive the workers' start), and load in the main process."""

import json
import sys

from torch.utils.data import DataLoader, get_worker_info

from _data import Latency

BAD = {17, 123, 250, 391}  # a batch holding one raises, and its samples are lost, as with torch


class WithBadRecords(Latency):
    def __getitem__(self, i: int):
        if i in BAD and (not IN_WORKERS or get_worker_info() is not None):
            raise ValueError(f"record {i} is corrupt")
        return super().__getitem__(i)


out, epochs = sys.argv[1], int(sys.argv[2])
workers = int(sys.argv[3]) if len(sys.argv) > 3 else 0
IN_WORKERS = sys.argv[4:] == ["in-workers"]
own = {"num_workers": workers, "persistent_workers": True, "prefetch_factor": 4} if workers else {}
loader = DataLoader(WithBadRecords(n=480, sleep_s=0.0004), batch_size=16, shuffle=True, **own)
for epoch in range(epochs):
    seen: list[int] = []
    raised = 0
    it = iter(loader)
    while True:
        try:
            x, _ = next(it)
        except StopIteration:
            break
        except ValueError as exc:
            assert "is corrupt" in str(exc), exc
            raised += 1
            continue
        seen += x[:, 0].long().tolist()
    with open(out, "a") as fh:
        fh.write(json.dumps({"epoch": epoch, "samples": seen, "raised": raised}) + "\n")
