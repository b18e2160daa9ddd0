from torch.utils.data import DataLoader

from _data import Latency


class MyLoader(DataLoader):
    def __init__(self, dataset, **kwargs):
        super().__init__(dataset, batch_size=16, **kwargs)


loader = MyLoader(Latency(), drop_last=True)
for x, y in loader:
    pass
