import sys

from torch.utils.data import DataLoader

from _data import Latency

assert __name__ == "__main__"
if __name__ == "__main__":
    expected = sys.argv[1:]
    if expected != ["--epochs", "3", "--lr", "0.1"]:
        raise SystemExit(f"unexpected arguments {expected}")
    loader = DataLoader(Latency(), batch_size=16, shuffle=True)
    for epoch in range(3):
        for x, y in loader:
            x.sum()
