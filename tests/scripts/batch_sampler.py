"""A loader built with a batch sampler (as Accelerate's ``prepare`` builds one): the batch
sampler, not ``batch_size``, decides its batches."""

from torch.utils.data import BatchSampler, DataLoader, RandomSampler

from _data import Latency

dataset = Latency(n=2000, sleep_s=0.0002)
loader = DataLoader(dataset, batch_sampler=BatchSampler(RandomSampler(dataset), 16, False))
for epoch in range(50):
    for x, y in loader:
        pass
