"""Lightning with a LightningDataModule: the loaders are created inside ``train_dataloader()``
and ``val_dataloader()``, which Lightning calls."""

import argparse

import lightning as L
from torch.utils.data import DataLoader

from _frameworks import ACCELERATOR, Features, ValFeatures, collate
from lightning_fit import Classifier


class Data(L.LightningDataModule):
    def setup(self, stage=None):
        self.train_set, self.val_set = Features(), ValFeatures(n=500)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=32, shuffle=True, collate_fn=collate)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=50, collate_fn=collate)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=20)
    trainer = L.Trainer(
        max_epochs=parser.parse_args().epochs,
        accelerator=ACCELERATOR,
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Classifier(), datamodule=Data())
