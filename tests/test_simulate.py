"""scripts/simulate.py: the real search driver on simulated workloads, in simulated time."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from loadertune.config import Config
from loadertune.measure.meter import WindowSpec
from loadertune.trials.contract import Limits

BUDGET = 30.0
# A trial's limit reaches 1 s past the deadline, plus teardown (up to ~1.3 s for 256 workers).
OVERSHOOT = 2.5
# A search that raises ran its probe past the deadline: each probe trial gets a limit of >= 2 s.
OVERSHOOT_RAISED = OVERSHOOT + 3 * 2.1


@pytest.fixture(scope="module")
def sim():
    path = Path(__file__).resolve().parents[1] / "scripts" / "simulate.py"
    spec = importlib.util.spec_from_file_location("simulate", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["simulate"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("mode", ["inline", "script"])
def test_searches_on_simulated_workloads_are_sane(sim, mode: str) -> None:
    seed = 20240611
    returned = 0
    for index in range(5):
        w = sim.draw_workload(seed, index)
        t0 = time.perf_counter()
        trace: list = []
        score, outcome = sim.run_one(w, mode, seed=seed, budget_s=BUDGET, trace=trace)
        assert time.perf_counter() - t0 < 10  # simulated time: no trial really runs
        if outcome is None:
            assert score.error and score.ratio == 0.0
            assert 0 < score.sim_s <= BUDGET + OVERSHOOT_RAISED
            continue
        # No trial starts past the deadline, and one of the exploration or the confirmation
        # still running there is cut (``Limits.ends_by``): workload 4's in script mode,
        # 256-sample batches the probe expected 3x faster, took 8.8 s of the 5.8 s left before.
        assert 0 < score.sim_s <= BUDGET + OVERSHOOT
        returned += 1
        assert score.elapsed_s == pytest.approx(score.sim_s)  # the driver read the fake clock
        pick = outcome.winner
        assert pick.batch_size in w.offered
        assert outcome.space.rejects(pick) is None or pick == outcome.baseline
        assert sim.failure_kind(w, pick, mode) is None  # a setting that would fail never wins
        assert 0 < score.ratio <= 1.05
        assert score.ratio <= score.ratio_space + 1e-9  # the space is a part of the true grid
        assert score.ratio_space <= 1.05
        assert score.true_value >= sim.epoch_rate(w, w.baseline) * (1 - 1e-9)
    assert returned >= 3


def test_a_noiseless_trial_measures_the_model(sim) -> None:
    w = sim.draw_workload(3, 0)
    w = sim.dataclasses.replace(w, noise_sigma=0.0, sub_sigma=0.0, epoch_samples=None)
    clock = sim.FakeClock()
    runner = sim.SimRunner(w, "inline", clock, np.random.default_rng(0))
    runner.rng = np.random.default_rng(1)
    sim.OUTLIER_P, saved = 0.0, sim.OUTLIER_P
    try:
        for config in (Config(w.baseline.batch_size), Config(w.baseline.batch_size, 3, 2)):
            if sim.failure_kind(w, config, "inline"):
                continue
            before = clock.now
            result = runner.run(
                config,
                window=WindowSpec(warmup_batches=3, window_s=1.0),
                limits=Limits(timeout_s=1e6, startup_s=1e6, hang_s=1e6),
            )
            assert result.ok
            assert result.samples_per_s == pytest.approx(sim.epoch_rate(w, config))
            assert clock.now - before == pytest.approx(result.wall_s)
            assert result.wall_s >= 1.0  # at least the window
    finally:
        sim.OUTLIER_P = saved


def test_the_slow_drift_is_shared_by_trials_close_in_time_and_forgotten_after_its_time(
    sim,
) -> None:
    """Half a trial's noise is the machine's drift: two settings measured a second apart see
    nearly the same factor, two minutes apart independent ones, and its spread is what was asked."""
    drift = sim.Drift(0.2, 10.0, np.random.default_rng(3), now=0.0)
    close, far, t = [], [], 0.0
    for _ in range(2000):
        a = math.log(drift.factor(t))
        close.append((a, math.log(drift.factor(t + 1.0))))
        t += 120.0
        far.append((a, math.log(drift.factor(t))))
    corr = [float(np.corrcoef(np.array(pairs).T)[0, 1]) for pairs in (close, far)]
    assert corr[0] > 0.85 and abs(corr[1]) < 0.1, corr
    assert float(np.std([a for a, _ in far])) == pytest.approx(0.2, rel=0.1)


def test_the_true_best_beats_every_setting_of_its_grid(sim) -> None:
    rng = np.random.default_rng(5)
    for index in range(5):
        w = sim.draw_workload(11, index)
        best, config = sim.grid_best(w, sim.true_grid(w), "inline")
        assert sim.epoch_rate(w, config) == pytest.approx(best)
        for _ in range(50):
            n = int(rng.integers(0, 257))
            c = Config(
                int(rng.choice(w.offered)),
                n,
                int(rng.choice([1, 2, 4, 8])) if n else None,
                bool(w.gpu and rng.random() < 0.5),
                bool(n and w.epoch_samples and rng.random() < 0.5),
            )
            if sim.failure_kind(w, c, "inline") is None:
                assert sim.epoch_rate(w, c) <= best * (1 + 1e-9)


def test_the_oracle_compares_the_best_with_its_closest_rival_below_the_bar(sim) -> None:
    """The rival is the fastest setting below 0.95 of the best; without noise the oracle never
    picks it, with this workload's noise it sometimes does (scored at the rival's ratio)."""
    saved = sim.OUTLIER_P
    picked_rival = compared = 0
    try:
        for index in range(6):
            w = sim.draw_workload(13, index)
            best, _ = sim.grid_best(w, sim.true_grid(w), "inline")
            rival, config = sim.grid_best(w, sim.true_grid(w), "inline", below=0.95 * best)
            assert rival < 0.95 * best
            if rival == 0:  # every setting that runs is within 0.95 of the best: no rival
                assert sim.run_oracle(w, "inline", seed=13, budget_s=20.0) is None
                continue
            assert sim.epoch_rate(w, config) == pytest.approx(rival)
            compared += 1
            ratio = sim.run_oracle(w, "inline", seed=13, budget_s=20.0)
            assert ratio in (None, 1.0, pytest.approx(rival / best))
            sim.OUTLIER_P = 0.0
            quiet = sim.dataclasses.replace(w, noise_sigma=0.0, sub_sigma=0.0)
            assert sim.run_oracle(quiet, "inline", seed=13, budget_s=20.0) in (None, 1.0)
            sim.OUTLIER_P = saved
            noisy = sim.dataclasses.replace(w, noise_sigma=0.3)
            for seed in range(5):
                picked_rival += (sim.run_oracle(noisy, "inline", seed=seed, budget_s=5.0) or 1) < 1
    finally:
        sim.OUTLIER_P = saved
    assert compared >= 3
    assert picked_rival > 0  # 30% noise and a 5 s budget: not every comparison comes out right


def test_a_live_tuning_is_scored_against_the_run_s_own_setting(sim) -> None:
    """The live mode runs the real driver without replays at the run's own batch size, and
    its cost shrinks as the run grows (the tuning's seconds are a fixed part of it)."""
    seed = 777
    scored = 0
    for index in range(4):
        w = sim.draw_workload(seed, index)
        live = sim.run_live(w, seed=seed, budget_s=BUDGET, policy=sim.LIVE_POLICIES["live"])
        if live is None:
            continue
        scored += 1
        assert 0 < live.tuning_s <= BUDGET + OVERSHOOT_RAISED
        assert live.best >= live.own and live.winner > 0
        assert live.ideal_ratio() <= 1.0
        short, long_ = live.time_ratio(120.0), live.time_ratio(36_000.0)
        # a long run tends to the winner's rate; the tuning's cost or gain weighs less
        assert long_ == pytest.approx(live.own / live.winner, rel=0.02)
        assert short > 0
    assert scored >= 2


def test_a_batchs_fixed_fetch_cost_makes_a_larger_batch_cheaper_per_sample(sim) -> None:
    """The fetch's fixed CPU per batch (the sampler, the dataset calls, collate's overhead) is
    spread over the batch: in-process loading and each worker's time per sample fall with a
    larger batch, by exactly that cost, and without it they do not."""
    w = dataclasses.replace(sim.draw_workload(31337, 0), fetch_s=1e-3, step_a=0.0, step_b=0.0)
    w = dataclasses.replace(w, gpu=False, h2d_s_per_byte=0.0)
    bare = dataclasses.replace(w, fetch_s=0.0)

    def per_sample(wl, bs: int) -> float:  # in-process
        return 1 / sim.steady_rate(wl, bs, 0, None, False)

    assert per_sample(w, 32) - per_sample(w, 256) == pytest.approx(1e-3 / 32 - 1e-3 / 256)
    assert per_sample(bare, 32) == pytest.approx(per_sample(bare, 256))
    gap = sim.worker_time(w, 4, 32) - sim.worker_time(w, 4, 256)
    assert gap > 0 and sim.worker_time(bare, 4, 32) == pytest.approx(sim.worker_time(bare, 4, 256))
    assert sim.draw_workload(31337, 0).fetch_s > 0  # drawn for every workload


@pytest.mark.parametrize("fork_server", [True, False])
def test_a_later_launch_forked_from_the_server_skips_the_imports(sim, fork_server: bool) -> None:
    """A loader that cannot change setting mid-epoch: every trial is a launch. The first pays
    the whole process start; with the fork server, each later one that start less the
    interpreter's and the imports' share (``import_s``)."""
    w = sim.dataclasses.replace(
        sim.draw_workload(5, 1), hot_swap=False, noise_sigma=0.0, sub_sigma=0.0
    )
    assert 0.3 * w.process_start_s <= w.import_s <= 0.8 * w.process_start_s
    runner = sim.SimRunner(w, "script", sim.FakeClock(), np.random.default_rng(0))
    runner.fork_server = fork_server
    config = Config(w.baseline.batch_size)
    walls = [
        runner.run(
            config,
            window=WindowSpec(warmup_batches=2, window_s=0.5),
            limits=Limits(timeout_s=1e6, startup_s=1e6, hang_s=1e6),
        ).wall_s
        for _ in range(3)
    ]
    saved = walls[0] - statistics.median(walls[1:])
    expected = w.import_s if fork_server else 0.0
    assert saved == pytest.approx(expected, abs=0.15 * w.process_start_s)
    assert runner.n_launches == 3


def test_a_baseline_that_takes_half_the_budget_leaves_a_setting_with_workers_tried(sim) -> None:
    """A baseline of 7 batches of 3.9 s (256 samples of 14 ms each, no workers) took 30 s of
    60; judged at half their predicted rate and with the baseline's launch as every trial's
    overhead, every setting with workers seemed to need 26 s or more, and the search ended at
    35 s with the baseline, 0.035 of the best. Before any setting is explored the judgement
    is the optimistic one: a setting with workers runs."""
    w = sim.draw_workload(11984145, 236)
    assert w.baseline.num_workers == 0 and w.offered == (256,)
    trace: list = []
    score, outcome = sim.run_one(w, "script", seed=11984145, budget_s=60.0, trace=trace)
    assert outcome is not None
    explored = [line for line in trace if line.phase == "search"]
    assert explored and outcome.winner.num_workers > 0
    assert score.ratio > 10 * sim.epoch_rate(w, w.baseline) / sim.epoch_rate(w, score.true_best)
