"""Train a small classifier with PyTorch Lightning, from a LightningDataModule (CPU-fast).

The data are synthetic feature vectors made by the Dataset itself, with a little I/O latency per
sample (``--latency-ms``, as reading small files would have), so that DataLoader workers can
help. The DataModule has training, validation and test loaders; only the training loader is
tuned (the one that feeds the optimizer), though Lightning iterates the validation loader first.

Run it as is (needs the ``frameworks`` extra: ``pip install -e ".[frameworks]"``)::

    python examples/train_lightning.py --epochs 2

Let loadertune find the fastest settings for its training loader, unmodified, then train with
them::

    loadertune search examples/train_lightning.py --budget 60
    loadertune run examples/train_lightning.py -- --epochs 5
"""

from __future__ import annotations

import argparse
import time

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset


class Features(Dataset):
    """``n`` feature vectors of 16 values and a binary label, each made from its index."""

    def __init__(self, n: int, latency_s: float, seed: int = 0) -> None:
        self.n, self.latency_s, self.seed = n, latency_s, seed

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.latency_s)  # stands for reading a sample from storage
        x = torch.randn(16, generator=torch.Generator().manual_seed(self.seed * 1_000_003 + i))
        return x, int(x[:4].sum() > 0)


class Data(L.LightningDataModule):
    def __init__(self, batch_size: int, latency_s: float) -> None:
        super().__init__()
        self.batch_size, self.latency_s = batch_size, latency_s

    def setup(self, stage: str | None = None) -> None:
        self.train_set = Features(4096, self.latency_s, seed=0)
        self.val_set = Features(512, self.latency_s, seed=1)
        self.test_set = Features(512, self.latency_s, seed=2)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=128)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(self.test_set, batch_size=128)


class Classifier(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2)
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_acc", (self.net(x).argmax(1) == y).float().mean())

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_acc", (self.net(x).argmax(1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--latency-ms", type=float, default=0.2)
    args = parser.parse_args()
    trainer = L.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    data = Data(args.batch_size, args.latency_ms / 1000)
    model = Classifier()
    trainer.fit(model, datamodule=data)
    trainer.test(model, datamodule=data)


if __name__ == "__main__":
    main()
