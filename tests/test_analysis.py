"""Tests of loadertune.results.analysis: bottleneck thresholds, GPU histogram, per-setting
evidence."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils.data import Dataset

from loadertune import tune_loader
from loadertune.config import Config
from loadertune.measure.failures import Failure
from loadertune.measure.meter import Measurement
from loadertune.measure.resources import ResourceUsage
from loadertune.results.analysis import ceilings, describe_trial, gpu_histogram
from loadertune.search.probe import Estimates
from loadertune.search.stop import (
    COMPUTE_BOUND_GAIN,
    INPUT_BOUND_BLOCKED,
    bottleneck,
    loader_keeps_up,
)
from loadertune.trials import TrialResult

from workloads import SleepDataset, TensorDataset, sleep_step


def _ok(rate: float, blocked: float, gpu: list[int] | None = None) -> TrialResult:
    m = Measurement(
        samples_per_s=rate,
        sub_window_samples_per_s=[rate] * 4,
        blocked_fraction=blocked,
        first_batch_s=0.01,
        warmup_s=0.1,
        window_s=1.0,
        n_samples=int(rate),
        n_batches=max(1, int(rate) // 32),
        complete=True,
    )
    res = ResourceUsage(gpu_index=0, gpu_util_percent=gpu) if gpu is not None else None
    return TrialResult(config=Config(32, 2), phase="confirm", measurement=m, resources=res)


def _failed() -> TrialResult:
    return TrialResult(config=Config(32, 2), failure=Failure("timeout", "hung", "spawn"))


@pytest.mark.parametrize(
    ("blocked", "noise", "expected"),
    [
        (0.5, 0.0, "input"),
        (0.01, 0.0, "compute"),
        (0.1, 0.0, "balanced"),
        (1.0, 0.0, "input"),
        (0.0, 0.0, "compute"),
        (INPUT_BOUND_BLOCKED, 0.0, "input"),
        (0.19, 0.0, "balanced"),
        (0.06, 0.0, "balanced"),  # a perfect loader would win back 6.4%: resolvable
        (0.045, 0.0, "compute"),  # 4.7%: below what any machine resolves
        # the same 6% blocked on a machine whose windows spread by 20%: not resolvable
        (0.06, 0.20, "compute"),
        (0.12, 0.20, "balanced"),
        # noise never hides a loop that waits a fifth of its time or more
        (INPUT_BOUND_BLOCKED, 1.0, "input"),
    ],
)
def test_bottleneck(blocked: float, noise: float, expected: str) -> None:
    assert bottleneck(blocked, noise) == expected


def test_compute_bound_band_edge() -> None:
    edge = COMPUTE_BOUND_GAIN / (1 + COMPUTE_BOUND_GAIN)  # blocked fraction of a 5% gain
    assert bottleneck(edge * 0.999) == "compute"
    assert bottleneck(edge * 1.01) == "balanced"


def test_gpu_histogram_bands() -> None:
    hist = gpu_histogram([0, 5, 9, 10, 49, 50, 89, 90, 99, 100])
    assert list(hist) == ["0-10%", "10-50%", "50-90%", "90-100%"]
    assert hist == {
        "0-10%": pytest.approx(0.3),
        "10-50%": pytest.approx(0.2),
        "50-90%": pytest.approx(0.2),
        "90-100%": pytest.approx(0.3),
    }


@pytest.mark.parametrize("samples", [[0], [100] * 7, [0, 99, 0, 99, 0], list(range(101))])
def test_gpu_histogram_fractions_sum_to_one(samples: list[int]) -> None:
    assert sum(gpu_histogram(samples).values()) == pytest.approx(1.0)


def test_gpu_histogram_starved_gpu_swings() -> None:
    """A GPU waiting for data: mostly idle or saturated, little in between."""
    hist = gpu_histogram([0, 0, 99, 100, 0, 98, 0, 0])
    assert hist["0-10%"] + hist["90-100%"] == pytest.approx(1.0)
    assert hist["10-50%"] == hist["50-90%"] == 0.0


def test_gpu_histogram_empty() -> None:
    assert gpu_histogram([]) == {"0-10%": 0.0, "10-50%": 0.0, "50-90%": 0.0, "90-100%": 0.0}


def test_describe_trial_takes_medians() -> None:
    out = describe_trial([_ok(100.0, 0.5), _ok(300.0, 0.1), _ok(200.0, 0.3)])
    assert out is not None
    assert out["blocked_fraction"] == pytest.approx(0.3)
    assert out["samples_per_s"] == pytest.approx(200.0)
    assert out["bottleneck"] == "input"
    assert "gpu_util_mean" not in out
    assert "gpu_util_histogram" not in out


def test_describe_trial_says_when_every_window_was_a_whole_epoch() -> None:
    """A winner measured in whole epochs is held to the ceiling by its epoch rate: an epoch of a
    few batches has no steady rate (a 6-batch epoch's "steady" figure read 183% of the ceiling
    where its epoch rate was 62%)."""
    whole = [_ok(5000.0, 0.5), _ok(7000.0, 0.5)]
    for r in whole:
        assert r.measurement is not None
        r.measurement.whole_epoch = True
        r.epoch_samples = 384
        r.config = Config(64, 3, 2, persistent_workers=True)
        r.measurement.reentry_s = [0.2]
    out = describe_trial(whole)
    assert out is not None and out["whole_epochs"] is True
    assert out["epoch_samples_per_s"] < out["samples_per_s"] / 2
    assert describe_trial([_ok(100.0, 0.5)])["whole_epochs"] is False  # type: ignore[index]


def test_describe_trial_ignores_failed_results() -> None:
    out = describe_trial([_failed(), _ok(100.0, 0.01), _failed(), _ok(120.0, 0.03)])
    assert out is not None
    assert out["samples_per_s"] == pytest.approx(110.0)
    assert out["blocked_fraction"] == pytest.approx(0.02)
    assert out["bottleneck"] == "compute"


def test_describe_trial_without_any_success() -> None:
    assert describe_trial([]) is None
    assert describe_trial([_failed(), _failed()]) is None


def test_describe_trial_gpu_evidence() -> None:
    out = describe_trial([_ok(100.0, 0.4, gpu=[0, 100]), _ok(100.0, 0.4, gpu=[0, 50, 100, 100])])
    assert out is not None
    assert out["gpu_util_mean"] == pytest.approx(350 / 6)
    assert sum(out["gpu_util_histogram"].values()) == pytest.approx(1.0)
    assert out["gpu_util_histogram"]["90-100%"] == pytest.approx(0.5)


def test_ceilings() -> None:
    assert ceilings(None) == {}
    est = Estimates(
        load_s_per_sample=0.001,
        load_cpu_fraction=0.1,
        worker_s_per_sample=0.001,
        step_s_per_sample=0.0005,
        step_cpu_per_sample=0.0005,
        usable_cpus=2,
        max_workers=16,
        consumer_ceiling=2000.0,
        loader_ceiling=16000.0,
        cpu_ceiling=3333.0,
    )
    out = ceilings(est)
    assert out["achievable_samples_per_s"] == 2000.0
    assert out["limiting_stage"] == "consumer"
    assert out["io_bound_loading"] is True
    assert out["workers_needed"] == est.workers_needed()
    assert out["transfer_samples_per_s"] is None


# -- diagnoses of real workloads whose bottleneck is known by construction ----------------------

_TUNE = {"budget_s": 12, "window_s": 0.3, "verbose": False, "seed": 0, "resume": False}


@pytest.mark.slow
def test_a_sleep_bound_loader_is_input_bound_and_below_its_ceiling() -> None:
    rec = tune_loader(SleepDataset(n=30000, sleep_s=0.001), batch_size=32, **_TUNE)
    d = rec.diagnosis
    assert d["baseline"]["bottleneck"] == "input"
    assert d["ceilings"]["io_bound_loading"] is True
    # the wait, not a rule, sets the worker range: with enough workers to cover a 1 ms wait,
    # the loader outruns what the 2 CPUs can hand over, so either may be the limiting stage
    assert d["ceilings"]["limiting_stage"] in ("loader", "cpu")
    assert d["ceilings"]["workers_needed"] > 2 * rec.hardware.usable_cpus
    # the measured winner and the estimated achievable rate are recorded
    assert rec.samples_per_s and 0 < rec.samples_per_s < float("inf")
    assert 0 < d["ceiling_samples_per_s"] < float("inf")
    assert any("waits on I/O" in a for a in d["advice"])
    assert [s["num_workers"] for s in d["scaling"]] == sorted(
        s["num_workers"] for s in d["scaling"]
    )


@pytest.mark.slow
def test_a_step_bound_loop_is_compute_bound_and_stops_early() -> None:
    # Far from every boundary: 16 rows of an in-memory tensor cost ~0.05 ms here (0.2 ms on a
    # slow, loaded CPU), 1% of a 20 ms step; the compute-bound band ends near 5%.
    rec = tune_loader(TensorDataset(n=200_000), batch_size=16, step=sleep_step(0.02), **_TUNE)
    d = rec.diagnosis
    assert d["bottleneck"] == "compute"
    assert rec.search["stop_reason"] == "compute_bound"
    assert d["ceilings"]["limiting_stage"] in ("consumer", "cpu")
    assert rec.samples_per_s and 0 < rec.samples_per_s < float("inf")
    assert 0 < d["ceiling_samples_per_s"] < float("inf")
    assert any("step is the bottleneck" in a for a in d["advice"])


def _estimates(consumer: float) -> Estimates:
    return Estimates(
        load_s_per_sample=0.0001,
        load_cpu_fraction=1.0,
        worker_s_per_sample=0.0001,
        step_s_per_sample=1 / consumer,
        step_cpu_per_sample=0.0,
        usable_cpus=2,
        max_workers=3,
        consumer_ceiling=consumer,
        loader_ceiling=20000.0,
        cpu_ceiling=20000.0,
    )


def _baseline(rate: float, blocked: float, sub: list[float]) -> TrialResult:
    result = _ok(rate, blocked)
    assert result.measurement is not None
    result.measurement.sub_window_samples_per_s = sub
    return result


@pytest.mark.parametrize(
    ("blocked", "sub", "keeps_up"),
    [
        (0.02, [1000.0] * 4, True),
        # 6% blocked: a better loader wins back 6.4%, resolvable on a quiet machine ...
        (0.06, [1000.0] * 4, False),
        # ... and not where the window's own rates spread by 20%
        (0.06, [900.0, 1000.0, 1100.0, 1000.0], True),
        (0.25, [900.0, 1000.0, 1100.0, 1000.0], False),
    ],
)
def test_the_early_stop_weighs_the_blocked_time_against_the_noise(
    blocked: float, sub: list[float], keeps_up: bool
) -> None:
    base = _baseline(1000.0, blocked, sub)
    assert loader_keeps_up(base, _estimates(consumer=1050.0)) is keeps_up


def test_no_early_stop_when_the_loader_keeps_up_by_slowing_the_step() -> None:
    base = _baseline(1000.0, 0.01, [1000.0] * 4)  # never waits, but at 2/3 of the step's rate
    assert loader_keeps_up(base, _estimates(consumer=1500.0)) is False
    assert loader_keeps_up(None, _estimates(consumer=1500.0)) is False
    assert loader_keeps_up(base, None) is False


def test_no_early_stop_when_workers_started_at_every_epoch_cost_the_epoch_its_time() -> None:
    """Steady, the loop never waits; but each epoch of 2,000 samples (2 s at the step's rate)
    first waits 2 s for its workers to start: persistent workers would double the epoch's
    rate, which the blocked fraction of a steady window never shows."""
    base = dataclasses.replace(_baseline(1000.0, 0.01, [1000.0] * 4), epoch_samples=2000)
    assert base.measurement is not None
    base.measurement.first_batch_s = 2.0
    assert base.epoch_samples_per_s == pytest.approx(500.0)
    assert loader_keeps_up(base, _estimates(consumer=1050.0)) is False
    base.measurement.first_batch_s = 0.01  # a start that costs the epoch nothing: stop
    assert loader_keeps_up(base, _estimates(consumer=1050.0)) is True


@pytest.mark.slow
def test_copy_on_read_is_flagged_with_its_cause() -> None:
    class Records(Dataset):  # Python objects: forked workers copy the pages they touch
        def __init__(self, n: int = 2_000_000) -> None:
            self.items = [{"id": i, "label": i % 10} for i in range(n)]

        def __len__(self) -> int:
            return len(self.items)

        def __getitem__(self, i: int):
            # a sample joins 8 records (as a recommender's features would): each touch of a
            # record writes its reference count, and the worker copies the page it sits on
            rows = [self.items[(i * 7919 + k * 104729) % len(self.items)] for k in range(8)]
            return torch.tensor([[r["id"], r["label"]] for r in rows], dtype=torch.float32)

    rec = tune_loader(
        Records(), batch_size=256, shuffle=True, max_workers=2, baseline={"num_workers": 2}, **_TUNE
    )
    host = rec.diagnosis["memory"]["host"]
    assert host["copy_on_read"] is True
    assert any("copy-on-read" in a and "numpy" in a for a in rec.diagnosis["advice"])


@pytest.mark.slow
def test_a_tensor_dataset_is_not_told_it_copies_on_read() -> None:
    """A worker's first batches grow its memory by several MiB/s (8-9 in a new user's searches
    of a TensorDataset): no copy-on-read advice to keep samples in tensors that already are."""
    rec = tune_loader(
        TensorDataset(n=50_000),
        batch_size=256,
        shuffle=True,
        max_workers=2,
        baseline={"num_workers": 2},
        **_TUNE,
    )
    assert rec.diagnosis["memory"]["host"]["copy_on_read"] is False
    assert not any("copy-on-read" in a for a in rec.diagnosis["advice"])


def test_balanced_when_the_loop_waits_a_little() -> None:
    results = [_ok(1000.0, blocked=0.12)]
    assert describe_trial(results)["bottleneck"] == "balanced"


def test_more_workers_than_cpus_names_a_cause_only_where_the_probe_saw_it() -> None:
    """A winner with more workers than CPUs: "because the loading waits on I/O" only when the
    probe found it so; a new user's pure-CPU loading, probed while other processes held the
    CPUs, was told its "workers wait"."""
    import dataclasses as dc
    from types import SimpleNamespace

    from loadertune.hardware import detect
    from loadertune.results.advice import _advise_oversubscribed

    hw = detect()
    winner = Config(32, hw.usable_cpus + 3, 2)
    io = dc.replace(_estimates(1e6), load_cpu_fraction=0.1)
    for est, why in ((io, True), (dc.replace(io, load_cpu_fraction=0.9), False), (None, False)):
        outcome = SimpleNamespace(winner=winner, estimates=est)
        line = _advise_oversubscribed(outcome, hw, {})  # type: ignore[arg-type]
        assert line is not None and "best setting measured here" in line
        assert ("waits on I/O" in line) is why
    fits = SimpleNamespace(winner=Config(32, hw.usable_cpus, 2), estimates=io)
    assert _advise_oversubscribed(fits, hw, {}) is None  # type: ignore[arg-type]


def test_others_share_of_the_cpus_is_a_median_and_unknown_under_a_quota() -> None:
    import dataclasses as dc
    import os
    from types import SimpleNamespace

    from loadertune.hardware import detect
    from loadertune.results.analysis import others_cpu_percent

    cpus = len(os.sched_getaffinity(0))
    trials = [_ok(1000.0, 0.1) for _ in range(3)]
    for t, busy in zip(trials, (10.0, 50.0, 90.0), strict=True):
        t.resources = ResourceUsage(cpu_percent_others=busy * cpus)
    outcome = SimpleNamespace(trials=trials)
    hw = dc.replace(detect(), cpu_quota=None)
    assert others_cpu_percent(outcome, hw) == pytest.approx(50.0)  # type: ignore[arg-type]
    quota = dc.replace(hw, cpu_quota=0.5, logical_cpus=max(1, hw.logical_cpus))
    assert others_cpu_percent(outcome, quota) is None  # type: ignore[arg-type]


@pytest.mark.slow
def test_a_search_beside_busy_processes_says_its_figures_moved_with_them() -> None:
    """Every CPU kept busy by another process while the trials run: the diagnosis warns that the
    figures moved with that load (a new user's search beside a test run said 10.29x where a
    plain loop timed 1.25x)."""
    import contextlib
    import os
    import signal
    import subprocess
    import sys

    # Not this process's children (they would be taken for its workers): started in the
    # background by a shell that exits, each pinned to one CPU.
    spin_pids = []
    for cpu in sorted(os.sched_getaffinity(0)):
        code = f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile 1: pass"
        shell = f"{sys.executable} -c '{code}' >/dev/null 2>&1 & echo $!"
        out = subprocess.run(["sh", "-c", shell], capture_output=True, text=True, check=True)
        spin_pids.append(int(out.stdout))
    try:
        rec = tune_loader(TensorDataset(n=20_000), batch_size=64, max_workers=2, **_TUNE)
    finally:
        for pid in spin_pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert any("other processes kept" in w for w in rec.diagnosis["warnings"]), rec.diagnosis


def _cpu_loading(**changes: object) -> Estimates:
    """Estimates of CPU-bound loading (every CPU second of it computing) that limits the
    worker pipeline: 2 ms a sample to load, 0.5 ms a sample to step."""
    est = Estimates(
        load_s_per_sample=0.002,
        load_cpu_fraction=1.0,
        worker_s_per_sample=0.002,
        step_s_per_sample=0.0005,
        step_cpu_per_sample=0.0005,
        usable_cpus=2,
        max_workers=2,
        consumer_ceiling=2000.0,
        loader_ceiling=1000.0,
        cpu_ceiling=800.0,
    )
    return dataclasses.replace(est, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("winner", "est", "decoding", "in_process"),
    [
        # decoding on the CPUs is what limits training: say so
        (Config(32, 2, 2), _cpu_loading(), True, False),
        # a new user's Lightning run on an in-memory TensorDataset: in-process loading wins
        # (handing a batch over costs more than making it); it was told both to decode less
        # and that loading in-process is fastest
        (
            Config(64, 0),
            _cpu_loading(
                load_s_per_sample=2e-6,
                worker_s_per_sample=1e-4,
                loader_ceiling=2e4,
                cpu_ceiling=5e4,
                in_process_samples_per_s=2.5e4,
            ),
            False,
            True,
        ),
        # examples/train_images.py on 2 CPUs: decoding (0.53 ms a sample) shares the CPUs with
        # a step of 1.2 ms; the CPUs limit, and cheaper decoding frees them for the step
        (
            Config(32, 0),
            _cpu_loading(
                load_s_per_sample=5.3e-4,
                worker_s_per_sample=5.3e-4,
                step_s_per_sample=1.2e-3,
                step_cpu_per_sample=1.2e-3,
                consumer_ceiling=831.0,
                loader_ceiling=3400.0,
                cpu_ceiling=687.0,
            ),
            True,
            False,
        ),
        # the step's ceiling is the lowest: loading is not what limits training
        (Config(32, 2, 2), _cpu_loading(consumer_ceiling=500.0), False, False),
        # the CPUs limit, but loading costs little beside the step: the step holds the CPUs
        (
            Config(32, 2, 2),
            _cpu_loading(load_s_per_sample=1e-5, step_s_per_sample=1e-3, step_cpu_per_sample=1e-3),
            False,
            False,
        ),
    ],
)
def test_decoding_advice_only_where_decoding_limits_training(
    winner: Config, est: Estimates, decoding: bool, in_process: bool
) -> None:
    from types import SimpleNamespace

    from loadertune.hardware import detect
    from loadertune.results.advice import _advise_in_process, _advise_loading

    outcome = SimpleNamespace(winner=winner, winner_estimates=est)
    diag = {"bottleneck": "input"}
    line = _advise_loading(outcome, detect(), diag)  # type: ignore[arg-type]
    assert (line is not None and "decoding" in line) is decoding
    assert (_advise_in_process(outcome, detect(), diag) is not None) is in_process  # type: ignore[arg-type]


@pytest.mark.parametrize(("gain", "clear"), [(12.0, True), (2.0, False)])
def test_on_a_busy_machine_only_a_gap_no_load_explains_is_clear(gain: float, clear: bool) -> None:
    """No rounds compared the winner with the baseline and other processes kept the machine
    busy: the sub-windows of one window share its moment's load, so a 2x gain is not clear,
    but a 12x one is (it had read "within the noise: keeping yours loses nothing")."""
    import dataclasses as dc
    import os
    from types import SimpleNamespace

    from loadertune.hardware import detect
    from loadertune.results.analysis import clearly_better

    cpus = len(os.sched_getaffinity(0))
    base, win = _ok(150.0, 0.9), _ok(150.0 * gain, 0.05)
    base.config, win.config = Config(32), Config(128, 2, 2)
    base.measurement.sub_window_samples_per_s = [140.0, 160.0, 150.0, 155.0]
    win.measurement.sub_window_samples_per_s = [150.0 * gain * f for f in (0.95, 1.05, 1.0)]
    for t in (base, win):
        t.resources = ResourceUsage(cpu_percent_others=50.0 * cpus)
    outcome = SimpleNamespace(
        winner=win.config,
        baseline=base.config,
        confirmation=None,
        trials=[base, win],
        results_for=lambda c: [t for t in (base, win) if t.config == c],
    )
    hw = dc.replace(detect(), cpu_quota=None)
    assert clearly_better(outcome, hw) is clear  # type: ignore[arg-type]
