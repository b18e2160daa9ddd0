import torch
from torch.utils.data import DataLoader, Dataset


class Broken(Dataset):
    def __len__(self):
        return 1000

    def __getitem__(self, i):
        if i == 3:
            raise ValueError("cannot decode sample 3")
        return torch.zeros(4)


for batch in DataLoader(Broken(), batch_size=4):
    pass
