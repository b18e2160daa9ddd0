"""The affine GPU-memory model, from measured points and OOMs with the real message text."""

from __future__ import annotations

import pytest

from loadertune.measure.failures import classify_text
from loadertune.search.memory import MIB, fit, largest_safe_batch

# A ResNet-ish model trained with Adam: 25 M parameters x 4 bytes x 4 (weights, grads, 2 moments)
# = 400 MB fixed, and 6 MiB of activations and their gradients per sample.
FIXED, PER_SAMPLE = 400 * MIB, 6 * MIB


def peak(bs: int) -> int:
    return int(FIXED + PER_SAMPLE * bs)


def test_two_points_fix_the_line() -> None:
    model = fit([(32, peak(32)), (64, peak(64))])
    assert model is not None
    assert model.fixed_bytes == pytest.approx(FIXED, rel=1e-6)
    assert model.per_sample_bytes == pytest.approx(PER_SAMPLE, rel=1e-6)
    assert model.to_dict()["per_sample_mib"] == pytest.approx(6.0)


def test_one_batch_size_is_not_enough() -> None:
    assert fit([(32, peak(32)), (32, peak(32) + MIB)]) is None
    assert fit([]) is None


def test_noisy_points_are_averaged_and_the_error_reported() -> None:
    points = [
        (16, peak(16) + 3 * MIB),
        (16, peak(16) - 3 * MIB),
        (64, peak(64)),
        (128, peak(128) + 20 * MIB),
    ]
    model = fit(points)
    assert model is not None
    assert model.per_sample_bytes == pytest.approx(PER_SAMPLE, rel=0.05)
    assert 0 < model.max_error < 0.05


def test_largest_batch_keeps_the_margin() -> None:
    model = fit([(32, peak(32)), (64, peak(64))])
    capacity = 16 * 1024 * MIB  # a 16 GiB card
    full = model.max_batch_size(capacity, margin=0.0)
    safe = model.max_batch_size(capacity, margin=0.10)
    assert full == (capacity - FIXED) // PER_SAMPLE
    assert safe is not None and safe < full
    assert model.predict(safe) <= 0.9 * capacity < model.predict(safe + 1)
    with pytest.raises(ValueError, match="margin"):
        model.max_batch_size(capacity, margin=1.5)


def test_nothing_fits_when_the_model_alone_is_too_big() -> None:
    model = fit([(32, peak(32)), (64, peak(64))])
    assert model.max_batch_size(300 * MIB) is None


def test_largest_safe_batch_never_reaches_a_batch_that_ran_out_of_memory() -> None:
    """accelerate-style: the OOM is faked with the real message text; its batch is never tried."""
    oom = classify_text(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. "
        "GPU 0 has a total capacity of 15.77 GiB of which 1.02 GiB is free.",
        where="step",
    )
    assert oom.kind == "oom" and not oom.user_bug
    model = fit([(32, peak(32)), (64, peak(64))])
    candidates = [32, 64, 128, 256, 512, 1024, 2048]
    capacity = 16 * 1024 * MIB
    assert largest_safe_batch(model, capacity, candidates=candidates, oom_at=[]) == 2048
    assert largest_safe_batch(model, capacity, candidates=candidates, oom_at=[1024]) == 512
    assert largest_safe_batch(model, 4 * 1024 * MIB, candidates=candidates, oom_at=[]) == 512
    assert largest_safe_batch(None, None, candidates=candidates, oom_at=[64]) == 32
    assert largest_safe_batch(model, capacity, candidates=candidates, oom_at=[32]) is None
