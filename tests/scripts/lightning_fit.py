"""Lightning as most people use it: ``trainer.fit(model, train_loader, val_loader)``, with the
default sanity check (which iterates the validation loader first)."""

import argparse

import lightning as L
import torch
from torch.utils.data import DataLoader

from _frameworks import ACCELERATOR, Features, ValFeatures, collate


class Classifier(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2)
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.cross_entropy(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=20)
    epochs = parser.parse_args().epochs
    train = DataLoader(Features(), batch_size=32, shuffle=True, collate_fn=collate)
    val = DataLoader(ValFeatures(n=500), batch_size=50, collate_fn=collate)
    trainer = L.Trainer(
        max_epochs=epochs,
        accelerator=ACCELERATOR,
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Classifier(), train, val)
