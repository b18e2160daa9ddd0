import torch.utils.data as tud

from _data import Latency

loader = tud.DataLoader(Latency(), batch_size=16)
for _ in range(2):
    for x, y in loader:
        pass
