"""Trains argv[1] epochs of 600 samples, then raises, as a script whose code after training
fails (a checkpoint's upload, a final evaluation); argv[2] "mid": it raises inside its loop
instead, in its second epoch's 10th step."""

import sys

from torch.utils.data import DataLoader

from _data import Latency

epochs = int(sys.argv[1])
mid = sys.argv[2:] == ["mid"]
loader = DataLoader(Latency(n=600, sleep_s=0.0004), batch_size=16, shuffle=True)
for epoch in range(epochs):
    for i, (x, _) in enumerate(loader):
        if mid and epoch == 1 and i == 9:
            raise RuntimeError("a bug in the step")
raise RuntimeError("the checkpoint's upload failed")
