"""Tiny datasets the framework scripts share (no downloads), and a collate function that, when
``$LOADERTUNE_TEST_LOG`` names a folder, writes what each batch really was: its length and the
worker that made it, per trial process (so a test can check, from inside the trial, that a
trial ran the setting it recorded)."""

import os
import time

import torch
from torch.utils.data import Dataset, default_collate, get_worker_info

# The frameworks train on the CPU, except where ``$LOADERTUNE_TEST_CUDA`` is 1 (the GPU checks,
# scripts/gpu_checks.sh): then they place the model and batches where they would by default.
ON_CPU = os.environ.get("LOADERTUNE_TEST_CUDA") != "1"
ACCELERATOR = "cpu" if ON_CPU else "gpu"  # Lightning's name


def collate(samples):
    """``default_collate``, noting each batch's length and worker when asked to."""
    folder = os.environ.get("LOADERTUNE_TEST_LOG")
    if folder:
        info = get_worker_info()
        owner = os.getppid() if info is not None else os.getpid()  # the training process
        worker = info.id if info is not None else "main"
        with open(os.path.join(folder, f"{owner}.log"), "a") as fh:
            fh.write(f"{len(samples)} {worker}\n")
    return default_collate(samples)


class Features(Dataset):
    """Feature vectors with a little I/O latency per sample, so workers can help."""

    def __init__(self, n: int = 4096, dim: int = 16, sleep_s: float = 0.0002) -> None:
        self.n, self.dim, self.sleep_s = n, dim, sleep_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        g = torch.Generator().manual_seed(i)
        return torch.randn(self.dim, generator=g), i % 2


class ValFeatures(Features):
    """The validation split: another class, so a test can tell which loader was tuned."""


class Tokens(Dataset):
    """Token ids for a tiny transformer, as dicts (what the Hugging Face Trainer takes)."""

    def __init__(self, n: int = 2048, length: int = 16, vocab: int = 64) -> None:
        self.n, self.length, self.vocab = n, length, vocab

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        time.sleep(0.0002)
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(0, self.vocab, (self.length,), generator=g)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": i % 2}
