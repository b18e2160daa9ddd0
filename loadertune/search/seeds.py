"""The settings a search tries first, from the probe's model: the predicted workers at the most
promising batch size, loading in-process at the largest batch, each other batch size once, then
neighbours in workers and prefetch (:func:`seed_configs`)."""

from __future__ import annotations

import dataclasses
import math

from loadertune.config import Config
from loadertune.search.probe import Estimates
from loadertune.search.space import START_PREFETCH, SearchSpace


def _workers_to_try(est: Estimates, space: SearchSpace) -> tuple[int, int]:
    """The workers ``est`` says are needed (within the space), and those to try first.

    Far above the CPUs the estimate rests on waiting alone: storage that serves only so many
    requests at once, or memory, may cap the useful workers well below it, and a trial of
    hundreds of workers costs seconds to start and may not fit. Start at the geometric mean of
    the CPUs and the estimate; the climbs double it while loading still waits."""
    need = min(est.workers_needed(), space.max_workers)
    floor = est.usable_cpus + 1
    return need, (round(math.sqrt(floor * need)) if need > 2 * floor else need)


def _rate_in_space(est: Estimates, space: SearchSpace, batch_size: int) -> float:
    """The rate predicted at ``batch_size`` with the workers the space lets it have: batches
    in flight must fit the shared-memory budget, so a large batch of large samples may get one
    worker (or none) where a small one gets all it needs. Its ceilings alone would rank the
    large batch first and spend the search's first trials there."""
    at = est.at(batch_size)
    need = min(at.workers_needed(), space.max_workers)
    fits = need and space.nearest(Config(batch_size, need, min(space.prefetch_factors))).num_workers
    return max(at.predicted_samples_per_s(0), at.predicted_samples_per_s(fits))


def _slow_for_window(batch_size: int, rate: float, window_s: float | None) -> bool:
    """A batch takes more than a quarter of ``window_s`` at ``rate``: a trial receives at least
    four batches in its window, and more before it, so its batches, not the window, bound it."""
    return window_s is not None and rate > 0 and batch_size / rate > window_s / 4


def _batch_order(
    est: Estimates, space: SearchSpace, user: int, window_s: float | None = None
) -> list[int]:
    """The batch sizes, most promising first: by the rate predicted at each (within 5% of the
    best is a tie), then, among ties, those whose trial the window bounds before those whose
    batches bound it (a batch that takes more than a quarter of ``window_s`` at its predicted
    rate: a trial receives at least four such batches in its window, and more before it, so
    where every batch takes seconds, exploring at the largest left time for two or three
    trials), then the user's, then the smaller (their trials cost less)."""
    rate = {bs: _rate_in_space(est, space, bs) for bs in space.batch_sizes}
    top = max(rate.values())

    def rank(bs: int) -> tuple[bool, float, bool, float, bool, int]:
        tie = rate[bs] >= 0.95 * top
        # Workers deliver in rounds (one batch each), and a trial waits for whole rounds: its
        # first, its warm-up, its window's: many workers at a large batch take seconds a round.
        workers = _workers_to_try(est.at(bs), space)[1] if space.max_workers else 0
        round_s = bs * max(1, workers) / rate[bs] if rate[bs] > 0 else 0.0
        costly = _slow_for_window(bs * max(1, workers), rate[bs], window_s)
        return (
            not tie,
            0.0 if tie else -rate[bs],
            costly,
            round_s if costly else 0.0,
            bs != user,
            bs,
        )

    return sorted(space.batch_sizes, key=rank)


def seed_configs(
    est: Estimates,
    space: SearchSpace,
    *,
    batch_size: int,
    epoch_length_known: bool,
    limit: int | None = None,
    window_s: float | None = None,
) -> list[Config]:
    """The settings to try first, most promising first, all inside ``space``: the estimated
    workers at the most promising batch size (see :func:`_batch_order`: the fastest predicted;
    of a tie, the user's ``batch_size`` unless its batches are slow for ``window_s``), loading
    in-process at the largest batch (unless loading waits on I/O), each other batch size once,
    then neighbours.
    ``limit`` defaults to the number of batch sizes + 5."""
    if limit is None:
        limit = len(space.batch_sizes) + 5
    # Cheaper first: unpinned where the space allows it; pinning is tried once, on the lead
    # setting, and must win there by its own measurement.
    pin = False not in space.pin_memory
    persist = epoch_length_known and True in space.persistent_workers
    lead, *others = _batch_order(est, space, batch_size, window_s)
    need, first = _workers_to_try(est.at(lead), space)
    wanted: list[Config] = []
    at = est.at(lead)
    if need == 0 or space.max_workers == 0:
        variants = [Config(lead, 0, None, pin)]
    elif at.predicted_samples_per_s(0) >= at.predicted_samples_per_s(first):
        # Loading in-process is predicted the faster at the lead batch (the workers' hand-over
        # costs more than the loading they take over): it goes first, the workers after.
        variants = [Config(lead, 0, None, pin)] + [
            Config(lead, min(w, space.max_workers), START_PREFETCH, pin, persist)
            for w in (first, need)
            if w >= 1
        ]
    else:
        variants = [
            Config(lead, min(w, space.max_workers), pf, pin, persist)
            for w, pf in (
                (first, START_PREFETCH),
                (first + 1, START_PREFETCH),
                (need, START_PREFETCH),
                (first - 1, START_PREFETCH),
                (first, 2),
                (min(space.max_workers, est.usable_cpus), START_PREFETCH),
                (first, 1),
            )
            if w >= 1
        ]
    wanted.append(variants[0])
    if not pin and True in space.pin_memory:
        wanted.append(dataclasses.replace(variants[0], pin_memory=True))
    # Loading in the loop's own process at the largest batch: the probe measured it at one batch
    # size and takes its cost per sample to hold at every other, but a batch also costs the
    # fetch a fixed part (the sampler, collate, the call itself) that a larger batch spreads
    # thinner, without the workers' hand-over. Rows of an in-memory tensor ran twice as fast
    # at batch 256 in-process as with any number of workers, a setting no seed had tried
    # (`scripts/bench_tuner.py`, rows_batch_sizes). Loading that waits on I/O needs workers;
    # where such a batch takes long beside the window (see _batch_order), it comes last.
    largest = max(space.batch_sizes)
    helps = not est.io_bound and len(space.batch_sizes) > 1
    in_process = [Config(largest, 0, None, pin)] if helps else []
    last = _slow_for_window(largest, est.at(largest).predicted_samples_per_s(0), window_s)
    wanted += [] if last else in_process
    # Every other batch size once, at the workers it needs (its step's rate is its own).
    for bs in others:
        w = _workers_to_try(est.at(bs), space)[1] if space.max_workers and need else 0
        wanted.append(Config(bs, w, START_PREFETCH if w else None, pin, persist and w > 0))
    wanted += in_process if last else []
    wanted.extend(variants[1:])
    seeds: list[Config] = []
    for config in wanted:
        config = space.nearest(config)
        if config not in seeds and space.rejects(config) is None:
            seeds.append(config)
    return seeds[:limit]
