"""Tests of loadertune.space: Config, batch-size candidates, the search space and its caps."""

from __future__ import annotations

import itertools
import random

import pytest
from torch.utils.data import DataLoader

from loadertune.config import (
    DEFAULT_BATCH_SIZES,
    TORCH_DEFAULT_PREFETCH,
    TUNED_KEYS,
    Config,
    check_max_workers,
    normalize_batch_sizes,
)
from loadertune.errors import ConfigError
from loadertune.search.space import (
    FDS_PER_WORKER,
    MAX_WORKERS_HARD,
    SearchSpace,
    worker_cap,
)

from workloads import TensorDataset

MIB = 2**20


# -- Config ---------------------------------------------------------------------------------------


def test_config_without_workers_has_no_prefetch_factor() -> None:
    """prefetch_factor is None exactly when num_workers == 0."""
    config = Config(64)
    assert config.num_workers == 0
    assert config.prefetch_factor is None
    assert config.in_flight_batches == 0


def test_config_with_workers_defaults_prefetch_to_torch_default() -> None:
    config = Config(64, 4)
    assert config.prefetch_factor == TORCH_DEFAULT_PREFETCH == 2
    assert config == Config(64, 4, 2)
    assert hash(config) == hash(Config(64, 4, 2))


def test_config_keeps_an_explicit_prefetch_factor() -> None:
    config = Config(64, 3, 4)
    assert config.prefetch_factor == 4
    assert config.in_flight_batches == 12


def test_config_rejects_prefetch_factor_without_workers() -> None:
    with pytest.raises(ConfigError, match=r"prefetch_factor needs num_workers > 0"):
        Config(64, 0, 2)


def test_config_rejects_persistent_workers_without_workers() -> None:
    with pytest.raises(ConfigError, match=r"persistent_workers=True needs num_workers > 0"):
        Config(64, 0, None, False, True)


def test_config_allows_persistent_workers_with_workers() -> None:
    assert Config(64, 1, None, False, True).persistent_workers is True


@pytest.mark.parametrize("batch_size", [True, False, 0, -1, 3.0, "64", None])
def test_config_rejects_bad_batch_size(batch_size: object) -> None:
    """Booleans are ints in Python but never a batch size."""
    with pytest.raises(ConfigError, match=r"batch_size must be a positive int"):
        Config(batch_size)  # type: ignore[arg-type]


@pytest.mark.parametrize("workers", [-1, 1.5, "2", None])
def test_config_rejects_bad_num_workers(workers: object) -> None:
    with pytest.raises(ConfigError, match=r"num_workers must be an int >= 0"):
        Config(64, workers)  # type: ignore[arg-type]


@pytest.mark.parametrize("prefetch", [0, -2])
def test_config_rejects_prefetch_factor_below_one(prefetch: int) -> None:
    with pytest.raises(ConfigError, match=r"prefetch_factor must be >= 1"):
        Config(64, 2, prefetch)


def test_config_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"batch_size"):
        Config(0)


def test_config_is_frozen() -> None:
    config = Config(64, 2)
    with pytest.raises(AttributeError):
        config.num_workers = 3  # type: ignore[misc]


def test_loader_kwargs_omits_prefetch_factor_without_workers() -> None:
    kwargs = Config(32).loader_kwargs()
    assert "prefetch_factor" not in kwargs
    assert kwargs == {
        "batch_size": 32,
        "num_workers": 0,
        "pin_memory": False,
        "persistent_workers": False,
    }


def test_loader_kwargs_with_workers_has_every_tuned_key() -> None:
    kwargs = Config(32, 2, 4, True, True).loader_kwargs()
    assert set(kwargs) == set(TUNED_KEYS)
    assert kwargs == {
        "batch_size": 32,
        "num_workers": 2,
        "prefetch_factor": 4,
        "pin_memory": True,
        "persistent_workers": True,
    }


@pytest.mark.parametrize("config", [Config(16), Config(16, 2), Config(16, 2, 8, False, True)])
def test_loader_kwargs_are_accepted_by_dataloader(config: Config) -> None:
    """DataLoader itself accepts the kwargs (no workers start until iteration)."""
    loader = DataLoader(TensorDataset(n=64), **config.loader_kwargs())
    assert loader.batch_size == config.batch_size
    assert loader.num_workers == config.num_workers
    assert loader.prefetch_factor == config.prefetch_factor
    assert loader.persistent_workers == config.persistent_workers


@pytest.mark.parametrize(
    ("config", "label"),
    [
        (Config(64), "bs=64 w=0"),
        (Config(64, 4), "bs=64 w=4 pf=2"),
        (Config(64, 4, 2, True, True), "bs=64 w=4 pf=2 pin persist"),
        (Config(8, 0, None, True), "bs=8 w=0 pin"),
        (Config(128, 1, 8, False, True), "bs=128 w=1 pf=8 persist"),
    ],
)
def test_label(config: Config, label: str) -> None:
    assert config.label() == label


def test_from_kwargs_ignores_other_keys() -> None:
    config = Config.from_kwargs(
        {"batch_size": 32, "num_workers": 2, "shuffle": True, "drop_last": True, "collate_fn": None}
    )
    assert config == Config(32, 2, 2)


def test_from_kwargs_treats_none_as_absent() -> None:
    """DataLoader's prefetch_factor=None with workers means torch's default."""
    config = Config.from_kwargs({"batch_size": 32, "num_workers": 3, "prefetch_factor": None})
    assert config.prefetch_factor == 2


def test_from_kwargs_takes_batch_size_argument_when_missing() -> None:
    assert Config.from_kwargs({"num_workers": 1}, batch_size=16) == Config(16, 1)
    # the kwargs' own batch size wins over the fallback
    assert Config.from_kwargs({"batch_size": 8}, batch_size=16).batch_size == 8


def test_from_kwargs_without_batch_size_raises() -> None:
    with pytest.raises(ConfigError, match=r"batch_size is missing"):
        Config.from_kwargs({"num_workers": 2})


@pytest.mark.parametrize(
    "config", [Config(32), Config(32, 1), Config(64, 4, 8, True, True), Config(1, 0, None, True)]
)
def test_from_kwargs_round_trips_loader_kwargs(config: Config) -> None:
    assert Config.from_kwargs(config.loader_kwargs()) == config


def test_from_kwargs_validates() -> None:
    with pytest.raises(ConfigError, match=r"prefetch_factor needs num_workers > 0"):
        Config.from_kwargs({"batch_size": 32, "num_workers": 0, "prefetch_factor": 4})


# -- normalize_batch_sizes ------------------------------------------------------------------------


def test_normalize_none_gives_defaults() -> None:
    assert normalize_batch_sizes(None) == DEFAULT_BATCH_SIZES
    assert list(DEFAULT_BATCH_SIZES) == sorted(DEFAULT_BATCH_SIZES)


def test_normalize_int() -> None:
    assert normalize_batch_sizes(48) == (48,)


def test_normalize_list_sorted_and_deduplicated() -> None:
    assert normalize_batch_sizes([256, 32, 64, 32]) == (32, 64, 256)
    assert normalize_batch_sizes(iter([8, 4])) == (4, 8)
    assert normalize_batch_sizes((1,)) == (1,)


def test_normalize_empty_list_raises() -> None:
    with pytest.raises(ConfigError, match=r"empty list"):
        normalize_batch_sizes([])


@pytest.mark.parametrize("value", [0, -8, [32, 0], [32, -1], [16, 2.5], [16, "32"]])
def test_normalize_rejects_non_positive_or_non_int(value: object) -> None:
    with pytest.raises(ConfigError, match=r"positive int"):
        normalize_batch_sizes(value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [True, False])
def test_normalize_rejects_bool(value: bool) -> None:
    with pytest.raises(ConfigError, match=r"an int or a list of ints"):
        normalize_batch_sizes(value)


def test_normalize_rejects_bool_in_list() -> None:
    with pytest.raises(ConfigError, match=r"positive int.*True"):
        normalize_batch_sizes([32, True])


# -- SearchSpace.rejects --------------------------------------------------------------------------


def _space(**overrides: object) -> SearchSpace:
    base: dict[str, object] = {
        "batch_sizes": (32, 64),
        "max_workers": 4,
        "prefetch_factors": (1, 2, 4),
        "pin_memory": (False,),
        "persistent_workers": (False, True),
    }
    base.update(overrides)
    return SearchSpace(**base)  # type: ignore[arg-type]


def test_rejects_accepts_a_config_inside() -> None:
    space = _space()
    assert space.rejects(Config(32)) is None
    assert space.rejects(Config(64, 4, 4, False, True)) is None


def test_rejects_batch_size_not_a_candidate() -> None:
    assert _space().rejects(Config(48)) == "batch_size 48 is not a candidate (32, 64)"


def test_rejects_too_many_workers() -> None:
    reason = _space().rejects(Config(32, 5))
    assert reason == "num_workers 5 > max_workers 4"


def test_rejects_prefetch_factor_not_a_candidate() -> None:
    reason = _space().rejects(Config(32, 2, 8))
    assert reason is not None
    assert "prefetch_factor 8 is not a candidate" in reason


def test_rejects_persistent_workers_not_searched() -> None:
    space = _space(persistent_workers=(False,))
    reason = space.rejects(Config(32, 2, 2, False, True))
    assert reason == "persistent_workers=True is not searched"
    space = _space(persistent_workers=(True,))
    reason = space.rejects(Config(32, 2, 2, False, False))
    assert reason == "persistent_workers=False is not searched"
    # without workers persistent_workers is always False, and not a reason
    assert space.rejects(Config(32)) is None


def test_rejects_pin_memory_without_cuda() -> None:
    assert _space().rejects(Config(32, 0, None, True)) == "pin_memory needs CUDA"


def test_rejects_pin_memory_false_when_not_searched() -> None:
    space = _space(pin_memory=(True,))
    assert space.rejects(Config(32)) == "pin_memory=False is not searched"
    assert space.rejects(Config(32, 0, None, True)) is None


def test_rejects_over_in_flight_bytes_budget() -> None:
    """4 workers x pf 2 = 8 batches of 64 samples of 1 MiB = 512 MiB > 256 MiB."""
    space = _space(bytes_per_sample=float(MIB), max_in_flight_bytes=256.0 * MIB)
    config = Config(64, 4, 2)
    assert space.in_flight_bytes(config) == 512 * MIB
    reason = space.rejects(config)
    assert reason is not None
    assert reason == ("8 batches in flight need 512 MiB, over the 256 MiB shared-memory budget")


def test_in_flight_budget_is_inclusive_and_ignores_zero_workers() -> None:
    space = _space(bytes_per_sample=float(MIB), max_in_flight_bytes=256.0 * MIB)
    assert space.rejects(Config(64, 2, 2)) is None  # exactly 256 MiB: allowed
    assert space.rejects(Config(64, 2, 4)) is not None  # 512 MiB
    assert space.rejects(Config(64)) is None  # nothing in flight without workers
    tight = _space(bytes_per_sample=float(MIB), max_in_flight_bytes=0.0)
    assert tight.rejects(Config(32)) is None
    assert tight.rejects(Config(32, 1, 1)) is not None


def test_rejects_workers_whose_own_memory_and_batches_exceed_the_ram_left_them() -> None:
    """Each worker holds 100 MiB of its own, each batch in flight 32 MiB: 1000 MiB fit 4
    workers at prefetch 2 (656 MiB), not 8 (1312 MiB), nor 8 at prefetch 1 (1056 MiB), while
    6 at prefetch 1 (792 MiB) fit: the prefetch factor moves the limit, which one cap cannot."""
    space = _space(
        max_workers=16,
        prefetch_factors=(1, 2),
        bytes_per_sample=float(MIB),
        worker_bytes=100.0 * MIB,
        workers_ram_bytes=1000.0 * MIB,
    )
    assert space.rejects(Config(32, 4, 2)) is None
    assert space.rejects(Config(32, 6, 1)) is None
    assert "RAM" in (space.rejects(Config(32, 8, 2)) or "")
    assert "RAM" in (space.rejects(Config(32, 8, 1)) or "")
    assert space.rejects(Config(32)) is None  # no workers: nothing of theirs
    assert space.nearest(Config(32, 8, 2)) == Config(32, 7, 1)


def test_in_flight_budget_needs_sample_size() -> None:
    """Without a measured sample size there is nothing to compare with the budget."""
    space = _space(max_in_flight_bytes=1.0)
    assert space.in_flight_bytes(Config(64, 4, 4)) is None
    assert space.rejects(Config(64, 4, 4)) is None


# -- SearchSpace.configs --------------------------------------------------------------------------


def _all_configs(batch_sizes: tuple[int, ...], max_workers: int) -> set[Config]:
    """Every valid Config over a grid wider than any space used below."""
    out = set()
    for bs, pin in itertools.product(batch_sizes, (False, True)):
        out.add(Config(bs, 0, None, pin))
        for w, pf, pers in itertools.product(
            range(1, max_workers + 1), (1, 2, 3, 4, 8), (False, True)
        ):
            out.add(Config(bs, w, pf, pin, pers))
    return out


def test_configs_counts_a_small_space() -> None:
    """2 batch sizes x (1 without workers + 2 workers x 2 prefetch x 2 persistent) = 18."""
    space = SearchSpace(batch_sizes=(32, 64), max_workers=2, prefetch_factors=(1, 2))
    configs = space.configs()
    assert len(configs) == 18
    assert len(set(configs)) == len(configs)
    assert Config(32) in configs
    assert Config(64, 2, 1, False, True) in configs
    assert all(not c.pin_memory for c in configs)


def test_configs_counts_with_pin_memory_and_fixed_persistence() -> None:
    space = SearchSpace(
        batch_sizes=(16,),
        max_workers=3,
        prefetch_factors=(2,),
        pin_memory=(False, True),
        persistent_workers=(False,),
    )
    configs = space.configs()
    assert len(configs) == 2 * (1 + 3)
    assert {c.pin_memory for c in configs} == {False, True}


def test_configs_without_workers() -> None:
    space = SearchSpace(batch_sizes=(16, 32, 64), max_workers=0)
    assert space.configs() == [Config(16), Config(32), Config(64)]


@pytest.mark.parametrize(
    "space",
    [
        SearchSpace(batch_sizes=(32, 64), max_workers=3),
        SearchSpace(
            batch_sizes=(32,),
            max_workers=4,
            prefetch_factors=(2, 4),
            persistent_workers=(True,),
            pin_memory=(False, True),
        ),
        SearchSpace(
            batch_sizes=(16, 64),
            max_workers=4,
            bytes_per_sample=float(MIB),
            max_in_flight_bytes=200.0 * MIB,
        ),
        SearchSpace(batch_sizes=(8,), max_workers=2, bytes_per_sample=1e9, max_in_flight_bytes=0.0),
    ],
)
def test_configs_are_exactly_the_accepted_ones(space: SearchSpace) -> None:
    """configs() holds only valid, accepted settings, and every accepted one."""
    configs = space.configs()
    assert all(space.rejects(c) is None for c in configs)
    assert len(set(configs)) == len(configs)
    universe = _all_configs((8, 16, 32, 48, 64), 6)
    accepted = {c for c in universe if space.rejects(c) is None}
    assert set(configs) == accepted


def test_configs_drop_settings_over_the_budget() -> None:
    space = SearchSpace(
        batch_sizes=(64,),
        max_workers=4,
        prefetch_factors=(1, 2, 4),
        persistent_workers=(False,),
        bytes_per_sample=float(MIB),
        max_in_flight_bytes=256.0 * MIB,
    )
    configs = space.configs()
    # 64 MiB per batch: at most 4 batches in flight
    assert configs
    assert max(c.in_flight_batches for c in configs) == 4
    assert Config(64, 4, 1) in configs
    assert Config(64, 4, 2) not in configs


# -- SearchSpace.nearest --------------------------------------------------------------------------


def test_nearest_batch_size_in_log_scale() -> None:
    space = SearchSpace(batch_sizes=(32, 64, 128), max_workers=4)
    assert space.nearest(Config(100)).batch_size == 128  # log2: 6.64 is nearer 7 than 6
    assert space.nearest(Config(90)).batch_size == 64
    assert space.nearest(Config(1)).batch_size == 32
    assert space.nearest(Config(4096)).batch_size == 128


def test_nearest_caps_workers_and_picks_nearest_prefetch() -> None:
    space = SearchSpace(batch_sizes=(64,), max_workers=4, prefetch_factors=(2, 8))
    assert space.nearest(Config(64, 16, 3)) == Config(64, 4, 2)
    assert space.nearest(Config(64, 2, 7)) == Config(64, 2, 8)


def test_nearest_of_a_config_inside_is_itself() -> None:
    space = SearchSpace(batch_sizes=(32, 64), max_workers=3, prefetch_factors=(1, 2))
    for config in space.configs():
        assert space.nearest(config) == config


def test_nearest_reduces_prefetch_then_workers_to_fit_the_budget() -> None:
    space = SearchSpace(
        batch_sizes=(64,),
        max_workers=8,
        prefetch_factors=(1, 2, 4),
        persistent_workers=(False,),
        bytes_per_sample=float(MIB),
        max_in_flight_bytes=256.0 * MIB,
    )  # 4 batches of 64 MiB
    near = space.nearest(Config(64, 4, 4))
    assert space.rejects(near) is None
    assert near == Config(64, 4, 1)
    near = space.nearest(Config(64, 8, 4))
    assert space.rejects(near) is None
    assert near.in_flight_batches <= 4


def test_nearest_falls_back_to_no_workers_when_nothing_fits() -> None:
    space = SearchSpace(
        batch_sizes=(64,), max_workers=8, bytes_per_sample=1e12, max_in_flight_bytes=1.0
    )
    assert space.nearest(Config(64, 8, 8, False, True)) == Config(64)


def test_nearest_drops_pin_memory_without_cuda() -> None:
    space = SearchSpace(batch_sizes=(64,), max_workers=2)
    assert space.nearest(Config(64, 2, 2, True)).pin_memory is False


_SPACES = [
    SearchSpace(batch_sizes=(32, 64, 128), max_workers=4),
    SearchSpace(batch_sizes=(16,), max_workers=0),
    SearchSpace(
        batch_sizes=(64, 256),
        max_workers=6,
        prefetch_factors=(4, 8),
        persistent_workers=(True,),
        pin_memory=(True,),
    ),
    SearchSpace(
        batch_sizes=(8, 512),
        max_workers=16,
        prefetch_factors=(1, 2, 4, 8),
        persistent_workers=(False,),
        pin_memory=(False, True),
        bytes_per_sample=4.0 * MIB,
        max_in_flight_bytes=1024.0 * MIB,
    ),
    SearchSpace(batch_sizes=(32,), max_workers=3, bytes_per_sample=1e12, max_in_flight_bytes=0.0),
]


@pytest.mark.parametrize("space", _SPACES)
def test_nearest_is_always_inside_the_space(space: SearchSpace) -> None:
    rng = random.Random(1234)
    for _ in range(300):
        workers = rng.randint(0, 40)
        config = Config(
            rng.choice([1, 3, 16, 48, 100, 300, 512, 5000]),
            workers,
            rng.randint(1, 12) if workers else None,
            rng.random() < 0.5,
            workers > 0 and rng.random() < 0.5,
        )
        near = space.nearest(config)
        assert space.rejects(near) is None, (config, near, space.rejects(near))
        assert near.num_workers <= config.num_workers


# -- worker_cap / check_max_workers ---------------------------------------------------------------


def test_worker_cap_cpu_bound_is_cpus_plus_one() -> None:
    cap, limits = worker_cap(usable_cpus=2, io_bound=False)
    assert cap == 3
    assert limits == {"cpu": 3}


def test_worker_cap_io_bound_allows_several_per_cpu() -> None:
    cap, limits = worker_cap(usable_cpus=2, io_bound=True)
    assert cap == 16
    assert limits == {"cpu": 16}


def test_worker_cap_has_a_hard_ceiling() -> None:
    cap, limits = worker_cap(usable_cpus=128, io_bound=True)
    assert cap == MAX_WORKERS_HARD
    assert limits["cpu"] == MAX_WORKERS_HARD


def test_worker_cap_ram() -> None:
    """8 GiB budget, 1 GiB per worker: 8 workers."""
    gib = 2**30
    cap, limits = worker_cap(
        usable_cpus=16,
        io_bound=False,
        ram_budget_bytes=8 * gib,
        worker_pss_bytes=gib,
    )
    assert limits == {"cpu": 17, "ram": 8}
    assert cap == 8


def test_worker_cap_ram_allows_at_least_one_worker() -> None:
    gib = 2**30
    cap, limits = worker_cap(
        usable_cpus=4,
        io_bound=False,
        ram_budget_bytes=gib // 2,
        worker_pss_bytes=gib,
    )
    assert limits["ram"] == 1
    assert cap == 1


def test_worker_cap_ram_needs_both_figures() -> None:
    _, limits = worker_cap(usable_cpus=4, io_bound=False, ram_budget_bytes=2**30)
    assert "ram" not in limits
    _, limits = worker_cap(usable_cpus=4, io_bound=False, worker_pss_bytes=2**20)
    assert "ram" not in limits


def test_worker_cap_user_max() -> None:
    cap, limits = worker_cap(usable_cpus=8, io_bound=True, user_max=5)
    assert cap == 5
    assert limits == {"cpu": 64, "user": 5}
    cap, limits = worker_cap(usable_cpus=8, io_bound=False, user_max=0)
    assert cap == 0
    assert limits["user"] == 0
    cap, _ = worker_cap(usable_cpus=1, io_bound=False, user_max=100)
    assert cap == 2  # the user's maximum does not raise the cap


@pytest.mark.parametrize("value", [None, 0, 1, 64])
def test_check_max_workers_accepts(value: int | None) -> None:
    check_max_workers(value, logical_cpus=2)


@pytest.mark.parametrize("value", [-1, True, 2.0, "4"])
def test_check_max_workers_rejects_bad_values(value: object) -> None:
    with pytest.raises(ConfigError, match=r"max_workers must be an int >= 0"):
        check_max_workers(value, logical_cpus=2)  # type: ignore[arg-type]


def test_check_max_workers_rejects_absurd_values() -> None:
    with pytest.raises(ConfigError, match=r"max_workers=65 .*2 logical CPUs.*at most 64"):
        check_max_workers(65, logical_cpus=2)
    check_max_workers(128, logical_cpus=16)
    with pytest.raises(ConfigError, match=r"at most 128"):
        check_max_workers(129, logical_cpus=16)


def test_worker_cap_io_bound_follows_what_the_wait_needs() -> None:
    """10 ms of I/O per sample at a 4,000 samples/s step needs 40 workers: no 8-per-CPU cap."""
    cap, limits = worker_cap(usable_cpus=2, io_bound=True, workers_needed=40)
    assert cap == 60 and limits == {"cpu": 60}
    cap, _ = worker_cap(usable_cpus=2, io_bound=True, workers_needed=4)
    assert cap == 16  # never below 8 per CPU
    cap, _ = worker_cap(usable_cpus=2, io_bound=False, workers_needed=40)
    assert cap == 3  # loading that computes gains nothing past the CPUs


def test_worker_cap_open_files() -> None:
    cap, limits = worker_cap(usable_cpus=2, io_bound=True, workers_needed=400, open_files_limit=256)
    assert limits["fds"] == 256 // FDS_PER_WORKER and cap == limits["fds"]


def test_workers_stay_within_an_epochs_batches() -> None:
    """7,168 samples: 28 batches at 256, 224 at 32. A worker past an epoch's batches gets none
    (torch deals an epoch's batches from the first worker at every epoch)."""
    space = SearchSpace(batch_sizes=(32, 256), max_workers=64, epoch_samples=7168)
    assert space.rejects(Config(256, 28, 2)) is None
    assert "28 batches of an epoch" in (space.rejects(Config(256, 29, 2)) or "")
    assert space.rejects(Config(32, 64, 2)) is None
    assert max(c.num_workers for c in space.configs() if c.batch_size == 256) == 28
    tiny = SearchSpace(batch_sizes=(256,), max_workers=8, epoch_samples=100)
    assert tiny.rejects(Config(256, 1, 2)) is None  # one batch: one worker may still load it
    assert tiny.rejects(Config(256, 2, 2)) is not None
    unknown = SearchSpace(batch_sizes=(256,), max_workers=64)
    assert unknown.rejects(Config(256, 64, 2)) is None
