from torch.utils.data import DataLoader as DL

from _data import Latency

for x, y in DL(Latency(), 16, True):  # positional batch_size and shuffle
    pass
