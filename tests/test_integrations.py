"""loadertune.integrations.lightning with a real tiny LightningModule on the CPU (issue 11)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from loadertune import load_recommendation
from loadertune.hardware import current_key
from loadertune.results import store

L = pytest.importorskip("lightning")

from loadertune.integrations.lightning import LoadertuneCallback, fixed_arguments  # noqa: E402

pytestmark = pytest.mark.frameworks


class Points(Dataset):
    def __init__(self, n: int = 1024) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return torch.full((8,), float(i % 7)), i % 2


class ValPoints(Points):
    pass


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(8, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.cross_entropy(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Data(L.LightningDataModule):
    def train_dataloader(self):
        return DataLoader(Points(), batch_size=16, shuffle=True)

    def val_dataloader(self):
        return DataLoader(ValPoints(n=64), batch_size=32)


def _trainer(callback: LoadertuneCallback) -> L.Trainer:
    return L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback],
    )


def test_the_callback_tunes_the_training_loader_saves_and_applies(tmp_path: Path) -> None:
    path = tmp_path / "rec.json"
    callback = LoadertuneCallback(path, budget_s=6, verbose=False, max_workers=2)
    trainer = _trainer(callback)
    val = DataLoader(ValPoints(n=64), batch_size=32)
    trainer.fit(Tiny(), DataLoader(Points(), batch_size=16, shuffle=True), val)
    saved = load_recommendation(path, workload=Points())
    assert callback.applied == saved
    loader = trainer.train_dataloader
    assert (loader.batch_size, loader.num_workers) == (saved["batch_size"], saved["num_workers"])
    assert isinstance(loader.sampler, torch.utils.data.RandomSampler)  # shuffle kept
    assert val.num_workers == 0 and val.batch_size == 32  # the validation loader: untouched
    (entry,) = store.entries_for(path, current_key()).values()
    assert entry["workload"]["dataset"].endswith(".Points")


def test_saved_settings_go_to_a_datamodules_training_loader(tmp_path: Path) -> None:
    path = tmp_path / "rec.json"
    kwargs = {"batch_size": 24, "num_workers": 1, "prefetch_factor": 3}
    workload = {"kind": "dataset", "dataset": f"{Points.__module__}.{Points.__qualname__}"}
    store.save_entry(path, current_key(), {"loader_kwargs": kwargs, "workload": workload})
    callback = LoadertuneCallback(path, tune=False, verbose=False)
    trainer = _trainer(callback)
    trainer.fit(Tiny(), datamodule=Data())
    loader = trainer.train_dataloader
    assert (loader.batch_size, loader.num_workers, loader.prefetch_factor) == (24, 1, 3)
    assert trainer.val_dataloaders.batch_size == 32  # not the validation loader


def test_fixed_arguments_keep_what_is_not_tuned() -> None:
    def collate(batch):
        return batch

    loader = DataLoader(Points(), batch_size=4, shuffle=True, drop_last=True, collate_fn=collate)
    fixed = fixed_arguments(loader)
    assert fixed["shuffle"] is True and fixed["drop_last"] is True
    assert fixed["collate_fn"] is collate
    assert not {"batch_size", "num_workers", "sampler", "dataset"} & set(fixed)
