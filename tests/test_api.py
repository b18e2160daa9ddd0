"""tune_loader and load_recommendation, end to end on real loaders."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from loadertune import (
    ConfigError,
    NoRecommendationError,
    Recommendation,
    UserCodeError,
    load_recommendation,
    tune_loader,
)
from loadertune.hardware import current_key

from workloads import FaultDataset, SleepDataset, TensorDataset


def tune(dataset, **kw) -> Recommendation:
    kw = {"budget_s": 12, "window_s": 0.3, "verbose": False, "seed": 0, "resume": False, **kw}
    return tune_loader(dataset, **kw)


@pytest.mark.slow
def test_tunes_a_latency_bound_dataset_and_saves_it(tmp_path) -> None:
    collated = []

    def collate(samples):
        collated.append(len(samples))
        return torch.stack(samples)

    rec = tune(
        SleepDataset(n=30000, sleep_s=0.0005),
        batch_size=32,
        collate_fn=collate,
        step=lambda batch: batch.sum(),
    )
    assert set(rec.loader_kwargs) == {
        "batch_size",
        "num_workers",
        "prefetch_factor",
        "pin_memory",
        "persistent_workers",
    }
    assert rec.loader_kwargs["num_workers"] >= 2  # latency-bound: workers overlap the waits
    # Both settings measured and recorded (which one wins from given rates: test_confirm.py)
    assert rec.samples_per_s and 0 < rec.samples_per_s < float("inf")
    assert rec.baseline_samples_per_s and 0 < rec.baseline_samples_per_s < float("inf")
    assert rec.speedup and 0 < rec.speedup < float("inf")
    assert isinstance(rec.within_noise, bool)
    assert collated, "the user's collate_fn was used"
    assert rec.diagnosis["bottleneck"] in ("input", "compute", "balanced")
    assert rec.diagnosis["ceiling_samples_per_s"] > 0
    for t in rec.trials:  # the record other tools read
        assert isinstance(t.params, dict) and "num_workers" in t.params
        assert (t.samples_per_s is None) == (t.error is not None or t.skipped is not None)
    path = rec.save(tmp_path / "rec.json")
    kwargs = load_recommendation(path)
    assert kwargs == rec.loader_kwargs
    batch = next(iter(DataLoader(SleepDataset(n=64), **kwargs)))
    assert batch.shape[0] == rec.loader_kwargs["batch_size"]


@pytest.mark.slow
def test_a_dataset_bug_stops_with_the_traceback() -> None:
    with pytest.raises(UserCodeError, match="bug in the dataset") as info:
        tune(FaultDataset("raise", at=10), batch_size=8)
    assert "corrupt sample" in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_workers": 4}, "num_workers is what loadertune tunes"),
        ({"batch_sizes": [1]}, "unknown DataLoader argument"),
        ({"batch_size": [0, 32]}, "every batch size must be a positive int"),
        ({"batch_size": []}, "empty list"),
        ({"max_workers": 10**6}, "more than anything sensible"),
        ({"baseline": {"num_workers": 2, "shuffle": True}}, "baseline takes only"),
        ({"budget_s": -1}, "budget_s must be a positive number"),
        (
            {"baseline": {"num_workers": 0, "prefetch_factor": 2}},
            "prefetch_factor needs num_workers > 0",
        ),
    ],
)
def test_bad_arguments_are_clear_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        tune(TensorDataset(n=100), **kwargs)


@pytest.mark.parametrize(
    ("dataset", "message"),
    [
        (object(), r"dataset is a builtins.object object, not a Dataset"),
        (iter(range(10)), r"not a Dataset"),
        (type("NoLen", (Dataset,), {"__getitem__": lambda self, i: i})(), r"has no __len__"),
    ],
)
def test_what_is_not_a_dataset_is_said_to_be_so(dataset: object, message: str) -> None:
    """Issue 14: not "the dataset raised an error" (a UserCodeError with torch's traceback)."""
    with pytest.raises(ConfigError, match=message):
        tune(dataset)


@pytest.mark.slow
def test_a_list_is_dataset_enough() -> None:
    rec = tune([float(i) for i in range(256)], batch_size=16, n_trials=2)
    assert rec.loader_kwargs["batch_size"] == 16


def test_an_empty_dataset_is_refused() -> None:
    with pytest.raises(ConfigError, match="empty"):
        tune(TensorDataset(n=0))


def test_load_recommendation_says_what_the_file_has(tmp_path) -> None:
    with pytest.raises(NoRecommendationError, match="does not exist"):
        load_recommendation(tmp_path / "missing.json")
    from loadertune.results import store

    store.save_entry(tmp_path / "rec.json", "other-box", {"loader_kwargs": {"batch_size": 8}})
    with pytest.raises(NoRecommendationError, match=r"no entry for this machine.*other-box"):
        load_recommendation(tmp_path / "rec.json")
    assert load_recommendation(tmp_path / "rec.json", hardware_key="other-box") == {"batch_size": 8}
    store.save_entry(tmp_path / "rec.json", current_key(), {"loader_kwargs": {"batch_size": 16}})
    assert load_recommendation(tmp_path / "rec.json") == {"batch_size": 16}


def test_load_recommendation_picks_this_workloads_entry(tmp_path) -> None:
    """Issue 14: one entry per machine and workload; a dataset names its own."""
    from loadertune.results import store

    path = tmp_path / "rec.json"
    tensors, sleepy = TensorDataset(n=8), SleepDataset(n=8)
    for dataset, bs in ((tensors, 64), (sleepy, 16)):
        kind = f"{type(dataset).__module__}.{type(dataset).__qualname__}"
        entry = {
            "loader_kwargs": {"batch_size": bs},
            "workload": {"kind": "dataset", "dataset": kind},
        }
        store.save_entry(path, current_key(), entry)
    assert load_recommendation(path, workload=tensors) == {"batch_size": 64}
    assert load_recommendation(path, workload=sleepy) == {"batch_size": 16}
    assert load_recommendation(path, workload="dataset workloads.SleepDataset") == {
        "batch_size": 16
    }
    with pytest.raises(NoRecommendationError, match=r"2 entries for this machine .* Say which"):
        load_recommendation(path)
    with pytest.raises(
        NoRecommendationError,
        match=r"no entry for dataset workloads.FaultDataset on this machine .*other workloads only",
    ):
        load_recommendation(path, workload=FaultDataset("raise"))
