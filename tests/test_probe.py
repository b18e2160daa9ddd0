"""Tests of loadertune.probe: estimates from hand-made probe results, and the seed settings."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest

from loadertune.config import Config
from loadertune.hardware import detect
from loadertune.measure.meter import Measurement
from loadertune.measure.resources import ResourceUsage
from loadertune.search.probe import Estimates, estimate, space_for
from loadertune.search.seeds import seed_configs
from loadertune.search.settings import SearchSettings
from loadertune.search.space import START_PREFETCH, SearchSpace
from loadertune.trials import TrialResult


def _result(
    config: Config,
    *,
    samples_per_s: float,
    blocked: float,
    blocked_cpu: float | None = None,
    window_s: float = 1.0,
    cpu_main: float | None = None,
    phase: str = "probe",
) -> TrialResult:
    n = round(samples_per_s * window_s)
    m = Measurement(
        samples_per_s=samples_per_s,
        sub_window_samples_per_s=[samples_per_s] * 4,
        blocked_fraction=blocked,
        first_batch_s=0.01,
        warmup_s=0.05,
        window_s=window_s,
        n_samples=n,
        n_batches=max(1, n // config.batch_size),
        complete=True,
        blocked_cpu_fraction=blocked_cpu,
    )
    resources = ResourceUsage(cpu_percent_main=cpu_main) if cpu_main is not None else None
    return TrialResult(config=config, phase=phase, measurement=m, resources=resources)


def _sleep_bound(
    replay_rate: float = 40000.0,
    *,
    usable_cpus: int = 2,
    max_workers: int = 16,
    transfer: float | None = None,
) -> Estimates:
    """A loader that sleeps 0.5 ms per sample (I/O): blocked 95% of the time, 5% of it on CPU."""
    w0 = _result(Config(64), samples_per_s=1900.0, blocked=0.95, blocked_cpu=0.05)
    w1 = _result(Config(64, 1), samples_per_s=1800.0, blocked=0.9)
    replay = _result(
        Config(64), samples_per_s=replay_rate, blocked=0.0, cpu_main=100.0, phase="replay"
    )
    if transfer is not None:  # a GPU: the replay trial measured host-to-device copies
        replay.transfer = {"pinned_samples_per_s": transfer, "pageable_samples_per_s": transfer / 2}
    return estimate(w0=w0, w1=w1, replay=replay, usable_cpus=usable_cpus, max_workers=max_workers)


def _cpu_bound(replay_rate: float = 5000.0) -> Estimates:
    """A loader computing 1 ms per sample on the CPU."""
    w0 = _result(Config(64), samples_per_s=800.0, blocked=0.8, blocked_cpu=0.97)
    w1 = _result(Config(64, 1), samples_per_s=900.0, blocked=0.5)
    replay = _result(
        Config(64), samples_per_s=replay_rate, blocked=0.0, cpu_main=100.0, phase="replay"
    )
    return estimate(w0=w0, w1=w1, replay=replay, usable_cpus=2, max_workers=3)


# -- estimate -------------------------------------------------------------------------------------


def test_sleep_bound_loader_is_io_bound() -> None:
    est = _sleep_bound()
    assert est.io_bound is True
    assert est.load_cpu_fraction == pytest.approx(0.05)
    assert est.load_s_per_sample == pytest.approx(0.95 / 1900)  # blocked time per sample


def test_cpu_bound_loader_is_not_io_bound() -> None:
    assert _cpu_bound().io_bound is False


def test_loading_that_waited_for_a_cpu_is_not_io_bound() -> None:
    """Loading that computes on a machine whose CPUs other processes hold ran 45% of its time
    and waited for a CPU 50%: it does not wait on I/O (the search took it for that and tried
    8 workers on 2 CPUs)."""
    w0 = _result(Config(64), samples_per_s=800.0, blocked=0.8, blocked_cpu=0.45)
    assert w0.measurement is not None
    w0.measurement.blocked_wait_fraction = 0.5
    replay = _result(Config(64), samples_per_s=5000.0, blocked=0.0, phase="replay")
    est = estimate(w0=w0, w1=None, replay=replay, usable_cpus=2, max_workers=3)
    assert est.load_cpu_fraction == pytest.approx(0.45)  # its CPU cost per sample: the CPU's
    assert est.io_bound is False
    w0.measurement.blocked_wait_fraction = 0.0  # the CPUs were free: it waited on I/O
    assert estimate(w0=w0, w1=None, replay=replay, usable_cpus=2, max_workers=3).io_bound


def test_unmeasured_cpu_fraction_counts_as_cpu_bound() -> None:
    w0 = _result(Config(64), samples_per_s=1000.0, blocked=0.9, blocked_cpu=None)
    replay = _result(Config(64), samples_per_s=10000.0, blocked=0.0, phase="replay")
    est = estimate(w0=w0, w1=None, replay=replay, usable_cpus=2, max_workers=3)
    assert est.load_cpu_fraction == 1.0
    assert est.io_bound is False


def test_slow_single_worker_sets_worker_cost() -> None:
    """Input-bound with one worker: a sample costs the worker 1/rate (transfer included)."""
    est = _sleep_bound()
    assert est.worker_s_per_sample == pytest.approx(1 / 1800)
    w0 = _result(Config(64), samples_per_s=1900.0, blocked=0.95, blocked_cpu=0.05)
    w1_kept_up = _result(Config(64, 1), samples_per_s=1800.0, blocked=0.1)
    replay = _result(Config(64), samples_per_s=40000.0, blocked=0.0, phase="replay")
    est = estimate(w0=w0, w1=w1_kept_up, replay=replay, usable_cpus=2, max_workers=16)
    assert est.worker_s_per_sample == pytest.approx(est.load_s_per_sample)


def _eight_workers_of_large_samples(replay2: TrialResult | None = None) -> Estimates:
    """A baseline of 8 workers at batch 256 that waited for data at 290 samples/s (the probe's
    one-worker trial skipped then), loading in-process at batch 16 at 177."""
    w0 = _result(Config(16), samples_per_s=177.0, blocked=0.23, blocked_cpu=0.97)
    base = _result(Config(256, 8, 2), samples_per_s=290.0, blocked=0.9, phase="baseline")
    replay = _result(Config(256), samples_per_s=3600.0, blocked=0.0, phase="replay")
    return estimate(w0=w0, w1=base, replay=replay, usable_cpus=8, max_workers=18, replay2=replay2)


def test_a_baselines_workers_input_bound_share_its_rate() -> None:
    """A baseline of 8 workers that waited for data (the probe's one-worker trial, skipped
    then) made 290 samples/s: each worker took 8/290 s a sample, not 1/290 (which had
    estimated 9 workers at 2,617 samples/s)."""
    est = _eight_workers_of_large_samples()
    assert est.worker_s_per_sample == pytest.approx(8 / 290)
    assert est.predicted_samples_per_s(9) <= 9 * 290 / 8


def test_a_replay_slower_than_the_whole_loop_was_disturbed() -> None:
    """The step alone cannot run slower than the loop that also loads: a replay below the
    probe's loops (another process took the CPUs while it ran) counts as the loops' rate."""
    est = _sleep_bound(440.0)  # the loops made 1,900 and 1,800 samples/s
    assert est.consumer_ceiling == pytest.approx(1900.0)
    assert est.step_s_per_sample == pytest.approx(1 / 1900)
    assert _sleep_bound(2000.0).consumer_ceiling == pytest.approx(2000.0)  # consistent: kept


def test_a_step_figure_floored_by_a_loop_is_the_loops_rate() -> None:
    """A step ceiling that is only the loop's measured rate (the replay ran slower) is a floor
    under the step's rate."""
    floored = _cpu_bound(replay_rate=500.0)  # the loops made 800 and 900 samples/s
    assert floored.step_floored and floored.consumer_ceiling == pytest.approx(900.0)
    assert floored.hard_ceiling == pytest.approx(900.0)  # the lowest that is no loader's
    assert not _cpu_bound().step_floored


def test_ceilings_of_sleep_bound_loader() -> None:
    est = _sleep_bound()
    assert est.consumer_ceiling == pytest.approx(40000.0)
    assert est.step_s_per_sample == pytest.approx(1 / 40000)
    # 16 workers each at 1/1800 s per sample
    assert est.loader_ceiling == pytest.approx(16 * 1800)
    assert est.cpu_ceiling == pytest.approx(2 / (0.95 / 1900 * 0.05 + 1 / 40000))


@pytest.mark.parametrize(
    "est",
    [
        _sleep_bound(),
        _sleep_bound(2000.0),
        _sleep_bound(transfer=5000.0),
        _cpu_bound(),
        _cpu_bound(100.0),
    ],
)
def test_achievable_is_the_lowest_ceiling_or_a_measured_rate(est: Estimates) -> None:
    ceilings = {
        "consumer": est.consumer_ceiling,
        "loader": est.loader_ceiling,
        "cpu": est.cpu_ceiling,
    }
    if est.transfer_ceiling:
        ceilings["transfer"] = est.transfer_ceiling
    # A rate already measured (num_workers=0) is achievable whatever the ceilings say.
    assert est.achievable == max(est.in_process_samples_per_s, min(ceilings.values()))
    if est.limiting_stage == "main_process":
        assert est.achievable == est.in_process_samples_per_s > min(ceilings.values())
    else:
        assert ceilings[est.limiting_stage] == est.achievable


def test_limiting_stage_follows_the_slowest() -> None:
    assert _sleep_bound().limiting_stage == "loader"
    assert _sleep_bound(2000.0).limiting_stage == "consumer"
    assert _sleep_bound(transfer=5000.0).limiting_stage == "transfer"
    assert _sleep_bound(transfer=5000.0).achievable == 5000.0
    assert _cpu_bound().limiting_stage == "cpu"


def test_workers_needed_at_least_one() -> None:
    # a slow step needs one worker at most (its loops no faster than the step: 0.5 ms of sleep
    # and 10 ms of step a sample)
    w0 = _result(Config(64), samples_per_s=95.0, blocked=0.05, blocked_cpu=0.05)
    w1 = _result(Config(64, 1), samples_per_s=99.0, blocked=0.0)
    replay = _result(Config(64), samples_per_s=100.0, blocked=0.0, cpu_main=100.0, phase="replay")
    est = estimate(w0=w0, w1=w1, replay=replay, usable_cpus=2, max_workers=16)
    assert est.workers_needed() == 1
    # the same with 1 ms of CPU a sample to load and 100 ms of step
    w0 = _result(Config(64), samples_per_s=9.9, blocked=0.01, blocked_cpu=0.97)
    w1 = _result(Config(64, 1), samples_per_s=9.95, blocked=0.0)
    replay = _result(Config(64), samples_per_s=10.0, blocked=0.0, cpu_main=100.0, phase="replay")
    assert estimate(w0=w0, w1=w1, replay=replay, usable_cpus=2, max_workers=3).workers_needed() == 1


def test_workers_needed_grows_when_the_step_gets_faster() -> None:
    needs = [_sleep_bound(rate).workers_needed() for rate in (500.0, 2000.0, 8000.0, 20000.0)]
    assert needs == sorted(needs)
    assert needs[0] < needs[-1]
    # enough workers to produce the achievable rate
    est = _sleep_bound(8000.0)
    assert est.workers_needed() / est.worker_s_per_sample >= est.achievable


@pytest.mark.parametrize(
    "est",
    [
        _sleep_bound(),
        _sleep_bound(2000.0),
        _cpu_bound(),
        _cpu_bound(300.0),
        _sleep_bound(usable_cpus=1, max_workers=8),
    ],
)
def test_predicted_rate_is_monotone_in_workers(est: Estimates) -> None:
    rates = [est.predicted_samples_per_s(w) for w in range(1, est.max_workers + 1)]
    assert all(a <= b for a, b in itertools.pairwise(rates))
    assert all(r <= est.consumer_ceiling and r <= est.cpu_ceiling for r in rates)
    assert rates[-1] <= est.achievable * (1 + 1e-9)
    assert all(r > 0 for r in rates)


def test_predicted_rate_without_workers_takes_turns() -> None:
    est = _sleep_bound()
    assert est.predicted_samples_per_s(0) == pytest.approx(
        1 / (est.load_s_per_sample + est.step_s_per_sample)
    )
    assert est.predicted_samples_per_s(0) <= est.predicted_samples_per_s(est.workers_needed())


def test_predicted_rate_reaches_the_ceiling_with_enough_workers() -> None:
    est = _sleep_bound(2000.0)  # consumer-bound at 2000/s
    need = est.workers_needed()
    assert est.predicted_samples_per_s(need) == pytest.approx(est.achievable)


def test_predicted_rate_never_exceeds_achievable_with_transfer_limit() -> None:
    est = _sleep_bound(transfer=5000.0)
    assert est.predicted_samples_per_s(est.max_workers) <= est.achievable


def test_to_dict_has_derived_fields() -> None:
    est = _sleep_bound()
    data = est.to_dict()
    assert data["io_bound"] is True
    assert data["achievable"] == est.achievable
    assert data["limiting_stage"] == "loader"
    assert data["workers_needed"] == est.workers_needed()
    assert data["usable_cpus"] == 2


# -- seed_configs ---------------------------------------------------------------------------------


def _estimates(need: int, *, usable_cpus: int = 2) -> Estimates:
    """Estimates whose ``workers_needed()`` is ``need``: consumer-bound, 1 ms per worker sample."""
    worker = 0.001
    consumer = (need - 0.5) / (worker * 1.05)
    est = Estimates(
        load_s_per_sample=worker,
        load_cpu_fraction=0.1,
        worker_s_per_sample=worker,
        step_s_per_sample=1 / consumer,
        step_cpu_per_sample=1 / consumer,
        usable_cpus=usable_cpus,
        max_workers=64,
        consumer_ceiling=consumer,
        loader_ceiling=1e9,
        cpu_ceiling=1e9,
    )
    assert est.workers_needed() == need
    return est


_SEED_SPACES = [
    SearchSpace(batch_sizes=(64,), max_workers=8),
    SearchSpace(batch_sizes=(32, 64, 128), max_workers=16),
    SearchSpace(
        batch_sizes=(16, 64, 256), max_workers=4, prefetch_factors=(2,), persistent_workers=(False,)
    ),
    SearchSpace(batch_sizes=(64,), max_workers=0),
    SearchSpace(
        batch_sizes=(64, 128), max_workers=6, pin_memory=(False, True), persistent_workers=(True,)
    ),
    SearchSpace(
        batch_sizes=(64, 512),
        max_workers=12,
        bytes_per_sample=2.0**20,
        max_in_flight_bytes=512.0 * 2**20,
    ),
]


@pytest.mark.parametrize("space", _SEED_SPACES)
@pytest.mark.parametrize("need", [1, 2, 5, 30])
@pytest.mark.parametrize("known", [True, False])
def test_seed_configs_are_distinct_and_inside_the_space(
    space: SearchSpace, need: int, known: bool
) -> None:
    seeds = seed_configs(_estimates(need), space, batch_size=64, epoch_length_known=known)
    assert seeds
    assert len(seeds) <= len(space.batch_sizes) + 5
    assert len(set(seeds)) == len(seeds)
    for seed in seeds:
        assert space.rejects(seed) is None, (seed, space.rejects(seed))


def test_seed_configs_respects_limit() -> None:
    space = SearchSpace(batch_sizes=(32, 64, 128, 256), max_workers=16)
    est = _estimates(5)
    assert len(seed_configs(est, space, batch_size=64, epoch_length_known=True)) == 4 + 5
    assert len(seed_configs(est, space, batch_size=64, epoch_length_known=True, limit=2)) == 2
    assert seed_configs(est, space, batch_size=64, epoch_length_known=True, limit=0) == []
    assert len(seed_configs(est, space, batch_size=64, epoch_length_known=True, limit=50)) >= 9


def test_seed_configs_start_at_the_workers_needed() -> None:
    """With a deeper buffer than torch's default (``START_PREFETCH``); the default is measured
    beside it."""
    space = SearchSpace(batch_sizes=(64,), max_workers=16)
    seeds = seed_configs(_estimates(5), space, batch_size=64, epoch_length_known=True)
    assert seeds[0] == Config(64, 5, START_PREFETCH, False, True)
    assert Config(64, 5, 2, False, True) in seeds
    assert {s.num_workers for s in seeds} >= {4, 5, 6}
    assert all(s.batch_size == 64 for s in seeds)


def test_seed_configs_far_above_the_cpus_start_between_them_and_the_estimate() -> None:
    """60 workers needed on 2 CPUs: waiting alone says so, and storage or memory may cap the
    useful count far lower; start at the geometric mean of 3 and 60 (13), and try 60 too."""
    space = SearchSpace(batch_sizes=(64,), max_workers=64)
    seeds = seed_configs(_estimates(60), space, batch_size=64, epoch_length_known=False)
    assert seeds[0] == Config(64, 13, START_PREFETCH)
    assert Config(64, 60, START_PREFETCH) in seeds


def test_seed_configs_cap_workers_at_max() -> None:
    space = SearchSpace(batch_sizes=(64,), max_workers=3)
    seeds = seed_configs(_estimates(30), space, batch_size=64, epoch_length_known=False)
    assert seeds[0].num_workers == 3
    assert max(s.num_workers for s in seeds) == 3


def test_seed_configs_lead_with_the_batch_size_whose_workers_fit_the_shared_memory() -> None:
    """Every batch size reaches the same ceilings; but more than 2 batches of 256 one-MiB samples in
    flight would overflow the shared-memory budget, where a batch of 16 gets every worker it
    needs. The first trial goes where the workers fit, not to the user's large batch."""
    space = SearchSpace(
        batch_sizes=(16, 256),
        max_workers=16,
        bytes_per_sample=2.0**20,
        max_in_flight_bytes=600.0 * 2**20,
    )
    seeds = seed_configs(_estimates(8), space, batch_size=256, epoch_length_known=True)
    assert seeds[0].batch_size == 16 and seeds[0].num_workers > 1
    assert all(s.num_workers <= 2 for s in seeds if s.batch_size == 256)


def test_seed_configs_without_workers() -> None:
    space = SearchSpace(batch_sizes=(32, 64), max_workers=0)
    seeds = seed_configs(_estimates(4), space, batch_size=64, epoch_length_known=True)
    assert seeds == [Config(64), Config(32)]


def test_seed_configs_persistent_only_when_epoch_length_known() -> None:
    space = SearchSpace(batch_sizes=(64,), max_workers=8)
    known = seed_configs(_estimates(3), space, batch_size=64, epoch_length_known=True)
    unknown = seed_configs(_estimates(3), space, batch_size=64, epoch_length_known=False)
    assert all(s.persistent_workers for s in known if s.num_workers)
    assert not any(s.persistent_workers for s in unknown)


def test_seed_configs_with_cuda_pin_only_the_lead_setting() -> None:
    """Cheaper first: the seeds run unpinned; pinning is tried once, on the lead setting, and
    must win by its own measurement."""
    space = SearchSpace(batch_sizes=(64,), max_workers=8, pin_memory=(False, True))
    seeds = seed_configs(_estimates(3), space, batch_size=64, epoch_length_known=True)
    assert not seeds[0].pin_memory
    assert seeds[1] == dataclasses.replace(seeds[0], pin_memory=True)
    assert not any(s.pin_memory for s in seeds[2:])
    pinned_only = SearchSpace(batch_sizes=(64,), max_workers=8, pin_memory=(True,))
    pinned = seed_configs(_estimates(3), pinned_only, batch_size=64, epoch_length_known=True)
    assert all(s.pin_memory for s in pinned)


def test_seed_configs_include_other_batch_sizes() -> None:
    """With a few worker variants at the user's batch size, every other batch size is seeded."""
    space = SearchSpace(batch_sizes=(32, 64, 128), max_workers=2)
    seeds = seed_configs(_estimates(1), space, batch_size=64, epoch_length_known=True)
    assert {s.batch_size for s in seeds} == {32, 64, 128}
    assert seeds[0].batch_size == 64  # the user's batch size comes first


def test_seed_configs_with_a_large_limit_include_every_batch_size() -> None:
    space = SearchSpace(batch_sizes=(16, 32, 64, 128, 256), max_workers=16)
    seeds = seed_configs(_estimates(5), space, batch_size=64, epoch_length_known=True, limit=20)
    assert {s.batch_size for s in seeds} == set(space.batch_sizes)


def test_seed_configs_include_other_batch_sizes_with_default_limit() -> None:
    space = SearchSpace(batch_sizes=(32, 64, 128), max_workers=16)
    seeds = seed_configs(_estimates(5), space, batch_size=64, epoch_length_known=True)
    assert {s.batch_size for s in seeds} == {32, 64, 128}


def test_seed_configs_fit_the_in_flight_budget() -> None:
    """64 MiB batches, 256 MiB budget: no seed has more than 4 batches in flight."""
    space = SearchSpace(
        batch_sizes=(64,),
        max_workers=16,
        bytes_per_sample=2.0**20,
        max_in_flight_bytes=256.0 * 2**20,
    )
    seeds = seed_configs(_estimates(6), space, batch_size=64, epoch_length_known=True)
    assert seeds
    assert all(s.in_flight_batches <= 4 for s in seeds)


def test_estimates_are_frozen() -> None:
    est = _sleep_bound()
    with pytest.raises(dataclasses.FrozenInstanceError):
        est.max_workers = 3  # type: ignore[misc]
    assert math.isfinite(est.achievable)


# -- the step at other batch sizes ---------------------------------------------------------------


def _replay(batch_size: int, fixed_s: float, per_sample_s: float) -> TrialResult:
    """A replay of a step that takes ``fixed_s + per_sample_s * batch`` seconds a batch."""
    rate = batch_size / (fixed_s + per_sample_s * batch_size)
    return _result(
        Config(batch_size), samples_per_s=rate, blocked=0.0, cpu_main=100.0, phase="replay"
    )


def _two_replays(fixed_s: float, per_sample_s: float) -> Estimates:
    """Loading costs 1 ms of CPU a sample; the step is replayed at batch 32 and 128."""
    w0 = _result(Config(32), samples_per_s=800.0, blocked=0.8, blocked_cpu=0.97)
    w1 = _result(Config(32, 1), samples_per_s=900.0, blocked=0.5)
    return estimate(
        w0=w0,
        w1=w1,
        replay=_replay(32, fixed_s, per_sample_s),
        replay2=_replay(128, fixed_s, per_sample_s),
        usable_cpus=32,
        max_workers=64,
    )


def test_two_replays_tell_the_steps_fixed_cost_and_its_rate_at_every_batch() -> None:
    est = _two_replays(fixed_s=0.02, per_sample_s=1e-4)
    assert est.step_per_batch_s == pytest.approx(0.02)
    for bs in (16, 32, 64, 512):
        assert est.at(bs).consumer_ceiling == pytest.approx(bs / (0.02 + 1e-4 * bs))
    assert est.at(512).cpu_ceiling > est.at(32).cpu_ceiling  # the step's CPU share falls too
    # the workers a batch size needs follow its step's rate
    assert est.at(512).workers_needed() > 3 * est.at(32).workers_needed()
    # a step with no fixed cost is as fast per sample at any batch: nothing changes
    flat = _two_replays(fixed_s=0.0, per_sample_s=1e-3)
    assert flat.step_per_batch_s == pytest.approx(0.0, abs=1e-9)
    assert flat.at(512) == flat


def test_one_replay_leaves_the_step_the_same_at_every_batch() -> None:
    est = _cpu_bound()
    assert est.step_per_batch_s == 0.0 and est.at(512) == est


def test_seeds_at_a_larger_batch_get_the_workers_its_faster_step_needs() -> None:
    """With a step of 20 ms a batch and little per sample, batch 512 runs its step 10x faster
    per sample than batch 32: it goes first, with the workers it needs, then 128, then the
    user's 32 with fewer."""
    est = _two_replays(fixed_s=0.02, per_sample_s=1e-5)
    space = SearchSpace(batch_sizes=(32, 128, 512), max_workers=64, limits={"cpu": 64})
    seeds = [
        c
        for c in seed_configs(est, space, batch_size=32, epoch_length_known=False)
        if c.num_workers
    ]
    assert [c.batch_size for c in seeds[:3]] == [512, 128, 32], seeds
    assert seeds[0].num_workers > 3 * seeds[2].num_workers, seeds


def test_seeds_start_at_the_users_batch_when_no_batch_size_is_predicted_faster() -> None:
    """One replay (no fixed cost known), or a loader that limits every batch size alike: the
    user's batch first, then the others from the smallest (the cheapest trials)."""
    space = SearchSpace(batch_sizes=(16, 64, 256), max_workers=3, limits={"cpu": 3})
    seeds = seed_configs(_cpu_bound(), space, batch_size=64, epoch_length_known=False)
    with_workers = [c for c in seeds if c.num_workers]
    assert [c.batch_size for c in with_workers[:3]] == [64, 16, 256], seeds


def test_a_tied_batch_size_whose_batches_outlast_the_window_is_explored_after_the_others() -> None:
    """Every batch size is predicted alike (the loader limits each): the user's leads, unless a
    batch of it takes more than a quarter of the window at its predicted rate; then the ones
    the window bounds come first (a trial must receive several batches, and slow ones take
    seconds each)."""
    space = SearchSpace(batch_sizes=(16, 64, 256), max_workers=3, limits={"cpu": 3})
    est = _cpu_bound()
    rate = est.at(256).achievable
    slow = 0.9 * 4 * 256 / rate  # a window in which a batch of 256 takes more than a quarter
    seeds = seed_configs(est, space, batch_size=256, epoch_length_known=False, window_s=slow)
    assert [c.batch_size for c in seeds[:3]] == [16, 64, 256], seeds
    # ... and loading in-process at 256, slower still, after every other batch size
    assert seeds.index(Config(256)) > seeds.index(Config(64, 2, START_PREFETCH)), seeds
    seeds = seed_configs(est, space, batch_size=256, epoch_length_known=False, window_s=60.0)
    assert [c.batch_size for c in seeds[:3] if c.num_workers] == [256, 16], seeds
    assert seeds[1] == Config(256), seeds


def test_a_tied_batch_size_whose_rounds_of_workers_outlast_the_window_comes_after_the_others():
    """A batch of 512 alone takes an eighth of the window, but 11 workers deliver in rounds
    of 11 such batches, and a trial waits for whole rounds: the batch sizes whose rounds the
    window bounds go first (in the simulator a first trial of 54 workers at the user's batch
    of 512 took 40 s of a 60 s budget; at batch 64 a round took under 2 s)."""
    est = _sleep_bound(usable_cpus=4, max_workers=64)
    space = SearchSpace(batch_sizes=(16, 64, 512), max_workers=64, limits={"cpu": 64})
    window_s = 8 * 512 / est.achievable
    seeds = seed_configs(est, space, batch_size=512, epoch_length_known=False, window_s=window_s)
    assert [c.batch_size for c in seeds[:3]] == [16, 64, 512], seeds
    assert seeds[0].num_workers == 11, seeds


def test_loading_in_process_at_the_largest_batch_is_seeded_unless_loading_waits_on_io() -> None:
    """The probe measured loading in-process at one batch size; a larger batch spreads the
    fetch's fixed part thinner, which its per-sample figure cannot tell: that setting is tried
    second. Loading that waits on I/O is not tried without workers."""
    space = SearchSpace(batch_sizes=(32, 256), max_workers=3, limits={"cpu": 3})
    seeds = seed_configs(_cpu_bound(), space, batch_size=32, epoch_length_known=False)
    assert seeds[1] == Config(256), seeds
    seeds = seed_configs(_sleep_bound(), space, batch_size=32, epoch_length_known=False)
    assert all(c.num_workers for c in seeds), seeds
    one = SearchSpace(batch_sizes=(32,), max_workers=3, limits={"cpu": 3})
    seeds = seed_configs(_cpu_bound(), one, batch_size=32, epoch_length_known=False)
    assert all(c.num_workers for c in seeds), seeds  # the probe measured it already


def test_the_ram_cap_counts_one_small_batch_per_worker_in_the_ram_left_beside_the_main() -> None:
    """The baseline's 4 workers held 256 MiB each (torch's batches in flight sit in /dev/shm,
    not in a worker's memory) and its main process 1 GiB, of an 8 GiB budget: 7 GiB for the
    workers, each with at least one batch of 16 samples of 1 MiB in flight, 272 MiB: 26 fit.
    The space then turns down each setting whose workers and batches do not fit: a deep buffer
    of large batches where a shallow one of small batches fits."""
    mib, gib = 2**20, 2**30
    base = _result(Config(384, 4, 2), samples_per_s=100.0, blocked=0.9, phase="baseline")
    base.resources = ResourceUsage(n_workers=4, pss_bytes=2 * gib, worker_pss_bytes=256 * mib)
    w0 = _result(Config(16), samples_per_s=50.0, blocked=0.95, blocked_cpu=0.05)
    hw = dataclasses.replace(detect(), usable_cpus=4, shm_free_bytes=None, open_files_limit=2**20)
    space = space_for(
        w0,
        base,
        None,
        hw=hw,
        settings=SearchSettings(max_workers=None),
        batch_sizes=(16, 384),
        uses_cuda=False,
        epoch_samples=None,
        bytes_per_sample=float(mib),
        persistent_workers=False,
        ram_budget_bytes=8 * gib,
    )
    assert space.worker_bytes == 256 * mib
    assert space.workers_ram_bytes == 7 * gib
    assert space.limits["ram"] == (7 * gib) // (272 * mib) == 26
    assert space.rejects(Config(16, 20, 1)) is None  # 20 x 256 + 20 x 16 MiB = 5440 MiB
    assert "RAM" in (space.rejects(Config(384, 8, 2)) or "")  # 8 x 256 + 16 x 384 MiB


def test_seed_configs_lead_in_process_where_it_is_predicted_faster_than_the_workers() -> None:
    """Workers whose hand-over costs more than the loading they take over (8 of them made 290
    samples/s at batch 256 where loading in-process at 512 is predicted faster): the first seed
    loads in-process at the lead batch; the workers at that batch come later."""
    replay2 = _result(Config(512), samples_per_s=7000.0, blocked=0.0, phase="replay")
    est = _eight_workers_of_large_samples(replay2)
    space = SearchSpace(batch_sizes=(16, 64, 256, 512), max_workers=18)
    seeds = seed_configs(est, space, batch_size=256, epoch_length_known=False)
    at = est.at(512)
    assert at.predicted_samples_per_s(0) > at.predicted_samples_per_s(18)
    assert seeds[0] == Config(512)
    assert any(s.batch_size == 512 and s.num_workers > 0 for s in seeds[1:])
