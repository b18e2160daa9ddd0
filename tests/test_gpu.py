"""The GPU paths, against a real card: NVML sampling, pinned copies, the memory model, CUDA OOM,
CUDA in a forked worker. Skipped without CUDA (conftest); run them on the device machine."""

from __future__ import annotations

import os
import threading

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset

from loadertune.config import Config
from loadertune.measure import nvml
from loadertune.search.memory import fit
from loadertune.trials import Limits, cuda, window_for
from loadertune.trials.inline import InlineRunner

pytestmark = [pytest.mark.gpu, pytest.mark.slow]
LIMITS = Limits(timeout_s=120, startup_s=60, hang_s=30)


class Images(Dataset):
    """Random 3x64x64 images, cheap to load: the GPU step dominates."""

    def __init__(self, n: int = 20000, side: int = 64) -> None:
        self.n, self.side = n, side

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(i)
        return torch.rand(3, self.side, self.side, generator=g), i % 10


def cnn(width: int = 64) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(width, width, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(width, 2 * width, 3, padding=1, stride=2),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(2 * width, 10),
    ).cuda()


def train_step_for(model: nn.Module):
    opt = torch.optim.Adam(model.parameters())

    def step(batch) -> None:
        x, y = batch
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def run(runner: InlineRunner, config: Config, phase: str = "search", window_s: float = 1.0):
    window = window_for(config, window_s=window_s)
    return runner.run(config, window=window, limits=LIMITS, phase=phase)


def test_nvml_sees_the_gpu_and_samples_a_busy_window() -> None:
    gpus = nvml.visible_gpus()
    assert gpus and gpus[0].memory_total_bytes > 0
    runner = InlineRunner(Images(), step=train_step_for(cnn()))
    result = run(runner, Config(256, 4, 2, pin_memory=True), window_s=2.0)
    assert result.ok, result.failure
    assert result.cuda_device is not None and result.cuda_peak_reserved_bytes
    usage = result.resources
    assert usage is not None and usage.gpu_index is not None
    assert usage.gpu_util_percent, "NVML samples over the window"
    assert max(usage.gpu_util_percent) > 0


def test_pinned_copies_are_at_least_as_fast_as_pageable() -> None:
    rates = cuda.transfer_rates(torch.rand(256, 3, 224, 224), repeats=20)
    assert rates is not None
    # both copies measured (which is faster varies with the machine's load: scripts/ compares)
    assert all(0 < rates[k] < float("inf") for k in ("pinned_gb_per_s", "pageable_gb_per_s"))
    runner = InlineRunner(Images(), step=None)  # no step: loading + the copy to the GPU
    assert runner.uses_cuda
    replay = run(runner, Config(128), phase="replay")
    assert replay.transfer and replay.transfer["pinned_samples_per_s"] > 0


def test_memory_model_predicts_a_batch_that_fits_and_an_oom_is_recovered() -> None:
    """The line fitted at small batches predicts a batch that fits. It may be cautious (on an
    H100 this model ran at twice the prediction: see loadertune.search.frontier), so the batch
    that must run out of memory is one whose first activation alone outgrows the card."""
    width, side = 128, 128
    model = cnn(width=width)
    step = train_step_for(model)
    runner = InlineRunner(Images(n=100000, side=side), step=step)
    points = []
    for bs in (16, 32, 64):
        result = run(runner, Config(bs), phase="replay", window_s=0.5)
        assert result.ok, result.failure
        points.append((bs, result.cuda_peak_reserved_bytes))
        capacity = result.cuda_capacity_bytes
    fitted = fit(points)
    assert fitted is not None and fitted.per_sample_bytes > 0 and fitted.max_error < 0.25
    predicted = fitted.max_batch_size(capacity, margin=0.10)
    assert predicted is not None and predicted > 64
    fits = run(runner, Config(predicted), phase="replay", window_s=0.3)
    assert fits.ok, f"the predicted batch {predicted} ran out of memory: {fits.failure}"
    first_activation = width * side * side * 4  # float32 bytes per sample
    too_big = run(runner, Config(int(1.2 * capacity / first_activation)), phase="replay")
    assert too_big.error == "oom", too_big.failure
    after = run(runner, Config(32), phase="replay", window_s=0.3)  # recovers after an OOM
    assert after.ok


def test_a_trial_after_a_larger_batch_reads_its_own_peak() -> None:
    """The allocator's cache from a larger batch is not the next trial's peak (not yet run on
    a GPU: written after the device time of the session that found it was spent)."""
    runner = InlineRunner(Images(n=100000, side=128), step=train_step_for(cnn(width=128)))
    large = run(runner, Config(128), phase="replay", window_s=0.5)
    small = run(runner, Config(16), phase="replay", window_s=0.5)
    assert large.ok and small.ok, (large.failure, small.failure)
    assert small.cuda_peak_reserved_bytes < 0.5 * large.cuda_peak_reserved_bytes


class CudaInDataset(Images):
    def __getitem__(self, i: int):
        return torch.ones(4, device="cuda"), 0


def test_cuda_in_a_forked_worker_is_named() -> None:
    torch.cuda.init()  # the parent holds a CUDA context, as a training process does
    runner = InlineRunner(CudaInDataset())
    result = run(runner, Config(8, 2, 2))
    assert result.error == "cuda_in_fork", result.failure
    assert "spawn" in result.failure.advice  # type: ignore[union-attr]


def test_a_gpu_search_searches_pin_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """...and its pinned trials end without a traceback from torch's pin-memory thread (on
    58b1825 this test printed 15, ConnectionResetError receiving a batch from a worker that
    the trial's end had killed; none once that thread is stopped first)."""
    from loadertune import tune_loader

    raised: list[str] = []
    monkeypatch.setattr(
        threading, "excepthook", lambda a: raised.append(f"{a.thread.name}: {a.exc_value!r}")
    )
    rec = tune_loader(
        Images(),
        batch_size=[128, 256],
        step=train_step_for(cnn()),
        budget_s=45,
        verbose=False,
        resume=False,
        seed=0,
    )
    assert rec.search["space"]["pin_memory"] == [False, True]
    assert rec.diagnosis["winner"].get("gpu_util_mean") is not None
    assert rec.diagnosis["memory"]["gpu"]["capacity_mib"] > 0
    assert os.environ.get("CUDA_VISIBLE_DEVICES") is None or rec.hardware.gpus
    assert not raised, raised
