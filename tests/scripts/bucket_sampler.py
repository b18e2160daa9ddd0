"""A batch sampler of the script's own (bucketing samples by length, say): it has a length, and
no ``batch_size`` attribute, so only its batches tell how many samples an epoch holds."""

import random

from torch.utils.data import DataLoader, Sampler

from _data import Latency


class Buckets(Sampler):
    def __init__(self, n: int, size: int) -> None:
        self.n, self.size, self.epoch = n, size, 0

    def __iter__(self):
        order = list(range(self.n))
        random.Random(self.epoch).shuffle(order)
        self.epoch += 1
        return iter([order[i : i + self.size] for i in range(0, self.n, self.size)])

    def __len__(self) -> int:
        return -(-self.n // self.size)


dataset = Latency(n=1000, sleep_s=0.0002)
loader = DataLoader(dataset, batch_sampler=Buckets(len(dataset), 20))
for epoch in range(50):
    for x, y in loader:
        pass
