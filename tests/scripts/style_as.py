from _data import Latency
from torch.utils.data import DataLoader as DL

for x, y in DL(Latency(), 16, True):  # positional batch_size and shuffle
    pass
