"""Tests of loadertune.confirm: interleaved rounds, the winner and the "clearly better" test."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import pytest

from loadertune.config import Config
from loadertune.measure.failures import Failure
from loadertune.measure.meter import Measurement
from loadertune.search import SearchOutcome, SearchSettings
from loadertune.search import confirm as confirm_mod
from loadertune.search.confirm import Confirmation, RunInTurn, confirm, interleaved
from loadertune.search.space import SearchSpace
from loadertune.trials import TrialResult

A, B, C = Config(64), Config(64, 2), Config(64, 4, 4)


def _result(
    config: Config, rate: float | None, *, sub: list[float] | None = None, pruned: bool = False
) -> TrialResult:
    """A confirm-phase result at ``rate`` samples/s, or a failed one when ``rate`` is None."""
    if rate is None:
        return TrialResult(
            config=config,
            phase="confirm",
            failure=Failure("worker_killed", "killed", "fewer workers"),
        )
    m = Measurement(
        samples_per_s=rate,
        sub_window_samples_per_s=sub if sub is not None else [rate] * 4,
        blocked_fraction=0.1,
        first_batch_s=0.01,
        warmup_s=0.1,
        window_s=1.0,
        n_samples=int(rate),
        n_batches=max(1, int(rate) // 64),
        complete=True,
    )
    return TrialResult(config=config, phase="confirm", measurement=m, pruned=pruned)


def _confirmation(
    baseline: Config,
    values: dict[Config, list[float]],
    subs: dict[Config, list[list[float]]] | None = None,
) -> Confirmation:
    conf = Confirmation(baseline=baseline)
    for config, vals in values.items():
        conf.values[config] = list(vals)
        per_round = (subs or {}).get(config) or [None] * len(vals)
        conf.results[config] = [
            _result(config, v, sub=s) for v, s in zip(vals, per_round, strict=True)
        ]
    return conf


# -- interleaved ----------------------------------------------------------------------------------


def test_interleaved_three_by_three_is_rotations() -> None:
    assert interleaved([A, B, C], 3) == [A, B, C, B, C, A, C, A, B]


def test_interleaved_no_setting_always_first_or_last() -> None:
    order = interleaved([A, B, C], 3)
    rounds = [order[i : i + 3] for i in range(0, 9, 3)]
    for r in rounds:
        assert sorted(r) == sorted([A, B, C])  # each setting once per round
    for position in range(3):
        assert {r[position] for r in rounds} == {A, B, C}  # each setting once in each position


def test_interleaved_more_rounds_than_configs_and_edge_cases() -> None:
    assert interleaved([A, B], 3) == [A, B, B, A, A, B]
    assert interleaved([A], 2) == [A, A]
    assert interleaved([A, B, C], 0) == []
    assert interleaved([A, B, C], 1) == [A, B, C]


# -- Confirmation ---------------------------------------------------------------------------------


def test_median_winner_spread() -> None:
    conf = _confirmation(A, {A: [100.0, 110.0, 90.0], B: [200.0, 190.0, 210.0]})
    assert conf.median(A) == 100.0
    assert conf.median(B) == 200.0
    assert conf.median(C) is None
    assert conf.winner == B
    assert conf.spread(B) == pytest.approx(20.0 / 200.0)
    assert conf.spread(A) == pytest.approx(20.0 / 100.0)
    assert conf.speedup == pytest.approx(2.0)


def test_winner_is_by_median_not_by_best_round() -> None:
    """One lucky round does not make a winner."""
    conf = _confirmation(A, {A: [100.0, 100.0, 100.0], B: [500.0, 90.0, 95.0]})
    assert conf.winner == A


def test_spread_with_fewer_than_two_rounds_is_zero() -> None:
    conf = _confirmation(A, {A: [100.0]})
    assert conf.spread(A) == 0.0
    assert conf.spread(B) == 0.0


def test_winner_none_without_values() -> None:
    assert Confirmation(baseline=A).winner is None
    conf = Confirmation(baseline=A, values={A: [], B: []})
    assert conf.winner is None
    assert conf.clearly_better is False
    assert conf.speedup is None


def test_clearly_better_when_worst_round_beats_baselines_best() -> None:
    conf = _confirmation(A, {A: [100.0, 110.0, 90.0], B: [200.0, 190.0, 210.0]})
    assert conf.clearly_better is True
    assert conf.within_noise is False


def test_not_clearly_better_when_rounds_overlap() -> None:
    conf = _confirmation(A, {A: [100.0, 110.0, 90.0], B: [200.0, 105.0, 210.0]})
    assert conf.winner == B
    assert conf.clearly_better is False
    assert conf.within_noise is True


def test_not_clearly_better_when_equal() -> None:
    """Worst equals best: not *beaten*."""
    conf = _confirmation(A, {A: [100.0, 110.0], B: [110.0, 120.0]})
    assert conf.clearly_better is False


def test_not_clearly_better_when_winner_is_the_baseline() -> None:
    conf = _confirmation(A, {A: [300.0, 310.0, 305.0], B: [100.0, 110.0, 90.0]})
    assert conf.winner == A
    assert conf.clearly_better is False
    assert conf.within_noise is True


def test_single_round_falls_back_to_sub_window_rates() -> None:
    clear = _confirmation(
        A,
        {A: [100.0], B: [200.0]},
        subs={A: [[98.0, 101.0, 100.0, 102.0]], B: [[195.0, 205.0, 198.0, 202.0]]},
    )
    assert clear.clearly_better is True
    overlap = _confirmation(
        A,
        {A: [100.0], B: [200.0]},
        subs={A: [[90.0, 150.0, 100.0, 95.0]], B: [[140.0, 260.0, 200.0, 210.0]]},
    )
    assert overlap.clearly_better is False


def test_sub_window_fallback_needs_two_rates_each() -> None:
    conf = _confirmation(A, {A: [100.0], B: [200.0]}, subs={A: [[100.0]], B: [[200.0, 201.0]]})
    assert conf.clearly_better is False


def test_two_rounds_of_one_side_are_not_enough() -> None:
    """Two rounds of the winner but one of the baseline: the sub-window rates decide."""
    conf = _confirmation(
        A,
        {A: [100.0], B: [200.0, 210.0]},
        subs={A: [[90.0, 250.0]], B: [[190.0, 210.0], [205.0, 215.0]]},
    )
    assert conf.clearly_better is False  # by rounds (200 > 100) it would have been True


def test_baseline_failing_every_round_is_clearly_beaten() -> None:
    conf = Confirmation(baseline=A)
    conf.values = {A: [], B: [150.0, 160.0, 155.0]}
    conf.results = {A: [_result(A, None)] * 3, B: [_result(B, v) for v in (150.0, 160.0, 155.0)]}
    assert conf.winner == B
    assert conf.clearly_better is True
    assert conf.speedup is None  # no baseline rate to divide by


def test_baseline_never_run_is_not_clearly_beaten() -> None:
    conf = _confirmation(A, {B: [150.0, 160.0, 155.0]})
    assert conf.winner == B
    assert conf.clearly_better is False


# -- confirm --------------------------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> _Clock:
    """A fake monotonic clock, handed to :func:`confirm` as its ``clock``."""
    return _Clock()


def _runner(
    clock: _Clock, rates: dict[Config, list[float | None]], wall: float = 10.0
) -> tuple[RunInTurn, list[Config]]:
    """A fake ``run_in_turn``: each trial takes ``wall`` seconds of the fake clock and is
    recorded."""
    ran: list[Config] = []

    def run_in_turn(configs: Sequence[Config], on_result: Callable[[TrialResult], bool]) -> None:
        for config in configs:
            rate = rates[config][sum(c == config for c in ran)]
            ran.append(config)
            clock.now += wall
            if not on_result(_result(config, rate)):
                return

    return run_in_turn, ran


def in_turn(run: Callable[[Config], TrialResult]) -> RunInTurn:
    """``run_in_turn`` from a function measuring one setting."""

    def run_in_turn(configs: Sequence[Config], on_result: Callable[[TrialResult], bool]) -> None:
        for config in configs:
            if not on_result(run(config)):
                return

    return run_in_turn


CLOSE: dict[Config, list[float | None]] = {
    A: [100.0, 130.0, 90.0],
    B: [110.0, 95.0, 125.0],
    C: [105.0, 120.0, 100.0],
}
APART: dict[Config, list[float | None]] = {
    A: [100.0, 101.0, 99.0],
    B: [200.0, 210.0, 190.0],
    C: [150.0, 150.0, 150.0],
}


@pytest.mark.parametrize(
    ("rates", "order", "clearly_better"),
    [
        # every round runs all three, rotated, close or apart
        (CLOSE, [B, C, A, C, A, B, A, B, C], False),
        (APART, [B, C, A, C, A, B, A, B, C], True),
    ],
)
def test_confirm_runs_interleaved_rounds(
    clock: _Clock,
    rates: dict[Config, list[float | None]],
    order: list[Config],
    clearly_better: bool,
) -> None:
    run, ran = _runner(clock, rates)
    outcome = confirm(run, [B, C], A, rounds=3, clock=clock, deadline=1000.0, trial_wall_s=10.0)
    assert ran == order
    assert outcome.baseline == A
    assert outcome.values == {c: rates[c][: ran.count(c)] for c in (B, C, A)}
    assert [len(outcome.results[c]) for c in (A, B, C)] == [ran.count(c) for c in (A, B, C)]
    assert outcome.winner == B
    assert outcome.clearly_better is clearly_better


def test_rounds_go_on_to_the_cap_while_settings_are_close(clock: _Clock) -> None:
    rates: dict[Config, list[float | None]] = {A: [100.0, 104.0] * 4, B: [103.0, 99.0] * 4}
    run, ran = _runner(clock, rates)
    confirm(run, [B], A, rounds=8, clock=clock, deadline=1000.0, trial_wall_s=10.0)
    assert len(ran) == 16


def test_on_a_live_run_a_finalist_behind_the_running_setting_leaves_the_rounds(
    clock: _Clock,
) -> None:
    """Close rates: the side search runs every round (above); a live run, where a round at a
    slower setting is training time lost, ends them once its finalists are behind its own
    setting (A), keeping one ahead of it."""
    run, ran = _runner(clock, {A: [100.0, 104.0] * 4, B: [98.0, 99.0] * 4, C: [103.0] * 8})
    outcome = confirm(
        run, [B, C], A, rounds=8, clock=clock, deadline=1000.0, trial_wall_s=10.0, live=True
    )
    assert ran[:6] == [B, C, A, C, A, B]
    assert B in outcome.left_out and C not in outcome.left_out  # B behind A, C ahead
    assert ran.count(B) == 2 and ran.count(C) > 2
    run, ran = _runner(clock, {A: [100.0, 104.0] * 4, B: [98.0, 99.0] * 4})
    confirm(run, [B], A, rounds=8, clock=clock, deadline=1000.0, trial_wall_s=10.0, live=True)
    assert ran == [B, A, A, B]  # the running setting alone is left: the rounds end


def test_noise_sigma_pools_repeated_settings_with_a_prior() -> None:
    assert confirm_mod.noise_sigma({}) == pytest.approx(confirm_mod.PRIOR_SIGMA)
    assert confirm_mod.noise_sigma({A: [100.0]}) == pytest.approx(confirm_mod.PRIOR_SIGMA)
    quiet = {c: [100.0, 100.0] for c in (A, B, C)} | {Config(8): [50.0, 50.0]}
    # four settings measured twice, identical: 4 degrees of freedom of zero spread
    expected = math.sqrt(
        confirm_mod.PRIOR_DOF * confirm_mod.PRIOR_SIGMA**2 / (confirm_mod.PRIOR_DOF + 4)
    )
    assert confirm_mod.noise_sigma(quiet) == pytest.approx(expected)
    noisy = {A: [100.0, 200.0], B: [100.0, 50.0]}
    assert confirm_mod.noise_sigma(noisy) > confirm_mod.PRIOR_SIGMA


def test_confirm_stops_at_the_deadline(clock: _Clock) -> None:
    """A trial that would end past the deadline is not started."""
    rates: dict[Config, list[float | None]] = {A: [100.0] * 3, B: [105.0] * 3, C: [102.0] * 3}
    run, ran = _runner(clock, rates)
    outcome = confirm(run, [A, B], C, rounds=3, clock=clock, deadline=55.0, trial_wall_s=10.0)
    # t=0 A, 10 B, 20 C, 30 B, 40 C; at 50 the next would end at 60 > 55
    assert ran == [A, B, C, B, C]
    assert clock.now == 50.0
    assert outcome.values == {A: [100.0], B: [105.0, 105.0], C: [102.0, 102.0]}


def test_a_slow_baseline_is_not_started_when_its_own_wall_time_would_pass_the_deadline(
    clock: _Clock,
) -> None:
    """The finalist's trials take 10 s, the baseline's (a large batch) 40 s in this run: with
    35 s left, the round measures the finalist and stops before the baseline, where a typical
    trial's time would have started it and run 15 s over the budget."""
    run, ran = _runner(clock, {A: [100.0] * 3, B: [200.0] * 3})
    confirm(run, [B], A, rounds=2, clock=clock, deadline=35.0, trial_wall_s=10.0, walls={A: 40.0})
    assert ran == [B]
    run, ran = _runner(clock, {A: [100.0] * 3, B: [200.0] * 3})
    clock.now = 0.0
    confirm(run, [B], A, rounds=2, clock=clock, deadline=35.0, trial_wall_s=10.0)
    assert ran == [B, A, A]  # without its own wall time: 10 s each, the deadline never passed


def test_confirm_past_deadline_runs_nothing(clock: _Clock) -> None:
    clock.now = 100.0
    run, ran = _runner(clock, {A: [1.0], B: [2.0]})
    outcome = confirm(run, [B], A, rounds=3, clock=clock, deadline=105.0, trial_wall_s=10.0)
    assert ran == []
    assert outcome.winner is None
    assert outcome.clearly_better is False


def test_confirm_past_deadline_can_measure_the_leading_finalist(clock: _Clock) -> None:
    """A resumed search's leader must have figures of its own from this run."""
    clock.now = 100.0
    run, ran = _runner(clock, {A: [1.0], B: [2.0]})
    outcome = confirm(
        run, [B], A, rounds=3, clock=clock, deadline=105.0, trial_wall_s=10.0, measure_first=True
    )
    assert ran == [B]
    assert outcome.winner == B
    assert outcome.clearly_better is False  # the baseline was not re-measured beside it


def test_confirm_does_not_run_the_baseline_twice(clock: _Clock) -> None:
    run, ran = _runner(clock, {A: [100.0, 100.0], B: [200.0, 200.0]})
    confirm(run, [B, A, B], A, rounds=2, clock=clock, deadline=1000.0, trial_wall_s=10.0)
    assert ran == [B, A, A, B]


def test_confirm_records_failures_and_ignores_pruned_rates(clock: _Clock) -> None:
    ran: list[Config] = []

    def run(config: Config) -> TrialResult:
        ran.append(config)
        clock.now += 1.0
        if config == A:
            return _result(A, None)
        return _result(config, 300.0, pruned=len(ran) == 1)

    outcome = confirm(
        in_turn(run), [B], A, rounds=2, clock=clock, deadline=1000.0, trial_wall_s=1.0
    )
    assert ran == [B, A, A, B]
    assert outcome.values == {B: [300.0], A: []}  # the pruned round does not count
    assert len(outcome.results[A]) == 2
    assert all(r.error == "worker_killed" for r in outcome.results[A])
    assert outcome.winner == B
    assert outcome.clearly_better is True  # the baseline failed every round


def test_confirm_uses_epoch_rates(clock: _Clock) -> None:
    """The value of a round is the rate over a whole epoch, start-up included."""

    def run(config: Config) -> TrialResult:
        clock.now += 1.0
        result = _result(config, 1000.0)
        result.epoch_samples = 1000
        assert result.measurement is not None
        result.measurement.first_batch_s = 1.0 if config.num_workers else 0.0
        return result

    outcome = confirm(
        in_turn(run), [B], A, rounds=1, clock=clock, deadline=1000.0, trial_wall_s=1.0
    )
    assert outcome.values[A] == [1000.0]
    assert outcome.values[B] == [pytest.approx(500.0)]  # 1000 samples in 1 s + 1 s start-up


def test_a_baseline_the_deadline_left_out_of_the_rounds_is_judged_by_its_own_windows() -> None:
    """A tight budget: the rounds measured the winner but not the baseline, whose one rate is
    the exploration's. Its sub-window rates from then still tell a 6x gain from noise."""
    base, win = Config(32), Config(32, 8, 2)
    c = Confirmation(baseline=base)
    c.values = {win: [6600.0, 9700.0], base: [1150.0]}
    assert not c.clearly_better  # no sub-window rates of the baseline: within the noise
    c.prior_sub_windows = {base: [1100.0, 1200.0, 1150.0, 1180.0], win: [6400.0, 6800.0]}
    assert c.clearly_better
    c.prior_sub_windows[base] = [1100.0, 7000.0]  # windows as far apart as the two: no
    assert not c.clearly_better


def test_a_baseline_the_deadline_left_out_of_the_rounds_is_beaten_clearly_only_by_far() -> None:
    """A new user's script search: its baseline's one window (its first launch's) read 9,815
    samples/s, the winner's one round 17,689, and the rounds' deadline came before the
    baseline's turn. "1.81x, clearly faster" was said; end to end the two ran alike. Figures
    from different moments say "clearly" only past APART_MARGIN, and the verdict is that
    nothing confirmed it."""
    base, win = Config(48, 2, 2), Config(48, 6, 1, persistent_workers=True)
    c = Confirmation(baseline=base)
    c.values = {win: [17689.0], base: [9815.0]}
    c.results = {win: [TrialResult(win, phase="confirm")]}
    c.prior_sub_windows = {base: [9500.0, 9900.0, 10100.0], win: [17000.0, 18000.0, 18100.0]}
    assert not c.clearly_better
    c.values[win], c.prior_sub_windows[win] = [36000.0], [35000.0, 36500.0, 37000.0]
    assert c.clearly_better  # 3.6x


def _outcome(
    trials: list[TrialResult], confirmation: Confirmation | None, *, values: dict[Config, float]
) -> SearchOutcome:
    """A search's outcome over ``trials``: baseline A, winner B, a 60-s budget spent."""
    return SearchOutcome(
        baseline=A,
        winner=B,
        trials=trials,
        confirmation=confirmation,
        estimates=None,
        space=SearchSpace(batch_sizes=(64,), max_workers=4),
        stop_reason="budget",
        settings=SearchSettings(),
        storage="sqlite:///:memory:",
        elapsed_s=60.0,
        n_previous_trials=0,
        user_batch_size=64,
        values=values,
    )


def test_a_winner_the_confirmation_never_measured_is_not_called_clearly_faster() -> None:
    """The budget ran out before the confirmation: one lucky window (its sub-windows overlap
    the baseline's) is "within the noise"; a winner whose every sub-window beats every one of the
    baseline's is clearly faster, as the confirmation would decide on a tight budget."""
    from loadertune.hardware import detect
    from loadertune.results.recommendation import build_recommendation

    hw = detect()
    lucky = _explored_winner(176.0, [105.0, 300.0, 200.0, 99.0])
    assert build_recommendation(lucky, hw, workload={}).within_noise is True
    clear = _explored_winner(176.0, [170.0, 180.0, 175.0, 179.0])
    assert build_recommendation(clear, hw, workload={}).within_noise is False


def _explored_winner(
    rate: float, sub: list[float], confirmation: Confirmation | None = None
) -> SearchOutcome:
    """Baseline A at 100 samples/s (four sub-windows), winner B at ``rate`` in one window of
    the exploration with sub-window rates ``sub``."""
    base = _result(A, 100.0, sub=[90.0, 110.0, 100.0, 100.0])
    base.phase = "baseline"
    win = _result(B, rate, sub=sub)
    win.phase = "search"
    return _outcome([base, win], confirmation, values={A: 100.0, B: rate})


def test_a_winner_of_one_short_window_and_no_rounds_is_not_confirmed_rather_than_noise() -> None:
    """No final rounds, and the winner measured in one window too short for two sub-windows (on
    an H200 a 45-s search of the image example, at 13 times the baseline's rate per epoch):
    nothing compared the two, so the verdict is "not confirmed", not "within the noise" (which
    told the user that keeping their settings loses nothing). Two sub-windows each are
    compared, as before; so is a confirmation that measured the winner."""
    from loadertune.hardware import detect
    from loadertune.results.recommendation import build_recommendation
    from loadertune.view.summary import noise_words, summary_lines

    hw = detect()
    once = build_recommendation(_explored_winner(1300.0, [1300.0]), hw, workload={})
    assert once.within_noise is True and once.unconfirmed is True
    entry = once.to_entry()
    assert entry["unconfirmed"] is True and noise_words(entry) == "not confirmed"
    (verdict,) = [line for line in summary_lines(entry) if line.startswith("speed-up")]
    assert "not confirmed" in verdict and "noise" not in verdict and "keep" not in verdict
    warnings = once.diagnosis["warnings"]
    assert any("not measured beside your settings" in w for w in warnings), warnings
    assert not any("within the noise" in w for w in warnings), warnings

    twice = build_recommendation(_explored_winner(1300.0, [1250.0, 1350.0]), hw, workload={})
    assert twice.unconfirmed is False and twice.within_noise is False
    rounds = _confirmation(A, {A: [100.0, 104.0], B: [1300.0, 1280.0]})
    confirmed = build_recommendation(_explored_winner(1300.0, [1300.0], rounds), hw, workload={})
    assert confirmed.unconfirmed is False


def test_where_a_batch_sampler_decides_neither_setting_names_a_batch_size() -> None:
    """A batch sampler decides the batches: the baseline is labelled as the winner is
    ("bs=sampler"), not "bs=1" beside it (a new user's table read "bs=1 w=0" against
    "bs=sampler w=2 pf=4", for batches of 32)."""
    from loadertune.hardware import detect
    from loadertune.results.recommendation import build_recommendation
    from loadertune.view.tables import summary_rows

    base = _result(A, 100.0)
    base.phase = "baseline"
    rec = build_recommendation(
        _outcome([base, _result(B, 150.0)], None, values={A: 100.0, B: 150.0}),
        detect(),
        workload={},
        hide_batch_size=True,
    )
    assert "batch_size" not in rec.loader_kwargs and "batch_size" not in rec.baseline_kwargs
    assert rec.best_at_batch_size is not None  # the file's copy read "batch_size: 1"
    assert "batch_size" not in rec.best_at_batch_size["loader_kwargs"]
    (setting,) = [row for row in summary_rows(rec.to_entry()) if row[0] == "setting"]
    assert setting[1].startswith("bs=sampler w=") and setting[2].startswith("bs=sampler w=")


def test_on_a_busy_machine_only_rounds_say_clearly_faster() -> None:
    """Other processes kept half the CPUs busy: a winner whose one window's sub-windows all beat
    the baseline's is not "clearly faster" (they share that moment's load: a new user's script
    read "3.90x, clearly faster" from one baseline window, and its own setting was 1.8 times as
    fast on a quiet machine); two rounds of each, the worst beating the best, still are."""
    import dataclasses as dc
    import os

    from loadertune.hardware import detect
    from loadertune.measure.resources import ResourceUsage
    from loadertune.results.recommendation import build_recommendation

    cpus = len(os.sched_getaffinity(0))
    hw = dc.replace(detect(), cpu_quota=None)

    def outcome(others_percent: float, rounds: bool) -> SearchOutcome:
        base = _result(A, 100.0, sub=[95.0, 105.0, 100.0, 100.0])
        base.phase = "baseline"
        win = _result(B, 176.0, sub=[170.0, 180.0, 175.0, 179.0])
        win.phase = "search"
        trials = [base, win]
        conf = None
        if rounds:
            more = [_result(A, 104.0), _result(B, 171.0)]
            trials += more
            conf = _confirmation(A, {A: [100.0, 104.0], B: [176.0, 171.0]})
        for t in trials:
            t.resources = ResourceUsage(cpu_percent_others=others_percent * cpus)
        return _outcome(trials, conf, values={A: 104.0, B: 176.0})

    quiet = build_recommendation(outcome(5.0, rounds=False), hw, workload={})
    assert quiet.within_noise is False
    busy = build_recommendation(outcome(50.0, rounds=False), hw, workload={})
    assert busy.within_noise is True
    assert any("does not clearly beat" in w for w in busy.diagnosis["warnings"])
    assert any("other processes kept 50%" in w for w in busy.diagnosis["warnings"])
    busy_rounds = build_recommendation(outcome(50.0, rounds=True), hw, workload={})
    assert busy_rounds.within_noise is False


def test_a_baseline_whose_round_the_deadline_cut_keeps_its_figures_and_the_speedup() -> None:
    """The deadline cut the baseline's only round (skipped, as the confirmation of an H200's
    short epochs ended): the summary still has the baseline's figures, from its own trial, and
    the speed-up; they had read "-" with no speed-up."""
    from loadertune.hardware import detect
    from loadertune.results.recommendation import build_recommendation
    from loadertune.trials import contract as runner

    base = _result(A, 100.0)
    base.phase = "baseline"
    stopped = Failure("cut", "stopped at the search's deadline, 1 s into the trial", "")
    cut = runner.cut(TrialResult(config=A, phase="confirm", failure=stopped))
    assert cut.skipped is not None and cut.failure is None
    conf = Confirmation(baseline=A, values={A: [100.0], B: [300.0, 310.0]})
    conf.results = {B: [_result(B, 300.0), _result(B, 310.0)], A: [cut]}
    trials = [base, _result(B, 290.0), *conf.results[B], cut]
    outcome = _outcome(trials, conf, values={A: 100.0, B: 290.0})
    assert outcome.results_for(A) == [base]
    assert outcome.results_for(B) == conf.results[B]
    rec = build_recommendation(outcome, detect(), workload={})
    assert rec.baseline["epoch_samples_per_s"] == pytest.approx(100.0)
    assert rec.speedup == pytest.approx(3.05)


def test_a_finalist_failing_every_round_neither_wins_nor_runs_again(clock: _Clock) -> None:
    """B led the exploration (prior 300) but fails in the rounds (its workers killed, say): it
    leaves the rounds after its failure and the winner is the best of the settings that ran."""
    rates: dict[Config, list[float | None]] = {A: [100.0] * 3, B: [None] * 3, C: [110.0] * 3}
    run, ran = _runner(clock, rates)
    outcome = confirm(
        run,
        [B, C],
        A,
        rounds=3,
        clock=clock,
        deadline=1000.0,
        trial_wall_s=10.0,
        prior={B: [300.0]},
    )
    assert ran.count(B) == 1
    assert outcome.failed_here(B) and not outcome.failed_here(C)
    assert outcome.winner == C


def test_one_round_each_a_several_fold_mean_is_clearly_better_despite_slow_sub_windows() -> None:
    """Sub-windows spread by twice their median, as short epochs did on a GPU machine: the
    winner's mean, resampled, beats the baseline's by more than the single-trial margin."""
    conf = _confirmation(
        A,
        {A: [1450.0], B: [8000.0]},
        subs={
            A: [[1400.0, 1500.0, 1450.0, 1480.0]],
            B: [[30.0, 16000.0, 15000.0, 17000.0, 900.0, 16000.0, 14000.0, 16500.0]],
        },
    )
    assert conf.clearly_better is True


def test_one_round_each_a_mean_within_the_margin_is_not_clearly_better() -> None:
    """1.6 times the baseline's mean, but sub-windows this spread: resampled, the mean is not
    1.5 times the baseline's often enough."""
    conf = _confirmation(
        A,
        {A: [100.0], B: [160.0]},
        subs={A: [[100.0, 110.0, 105.0, 95.0]], B: [[90.0, 260.0, 150.0, 140.0]]},
    )
    assert conf.clearly_better is False


def test_a_finalist_the_cut_rounds_never_measured_does_not_win_on_its_exploration_figure(
    clock: _Clock,
) -> None:
    """The deadline cut the only round after C: B (fewer workers, its exploration's 731 within
    2% of C's median of 803 and 665) had been saved as the winner, measured in no round."""
    B7, C12 = Config(32, 7, 4, persistent_workers=True), Config(32, 12, 4, persistent_workers=True)
    run, ran = _runner(clock, {C12: [665.0], B7: [700.0], A: [400.0]})
    prior = {C12: [803.0], B7: [731.0], A: [391.0]}
    outcome = confirm(
        run, [C12, B7], A, rounds=2, clock=clock, deadline=15.0, trial_wall_s=10.0, prior=prior
    )
    assert ran == [C12]
    assert outcome.winner == C12
    # with no figure from the rounds at all, the exploration's decide (simplest within 2%)
    clock.now = 0.0
    run, ran = _runner(clock, {C12: [665.0], B7: [700.0], A: [400.0]})
    prior[C12] = [740.0]
    outcome = confirm(
        run, [C12, B7], A, rounds=2, clock=clock, deadline=5.0, trial_wall_s=10.0, prior=prior
    )
    assert ran == [] and outcome.winner == B7


def test_a_baselines_window_stands_in_only_until_the_rounds_measure_it(clock: _Clock) -> None:
    """A search's traced rounds: the script's baseline A read 562 samples/s in its opening
    window (a fresh launch's first epoch), then 992 in a round's whole epoch; the finalist B
    read 914 in its exploration's whole epoch and 841 in the round before (931 in a second,
    which A's did not reach). Pooled, A's median was 777 and B won, reported at 0.89 of A. A
    window stands in for A only until a round measures it the way the rounds measure B."""

    def rounds(deadline: float, **earlier: dict[Config, list[float]]) -> tuple:
        clock.now = 0.0
        run, ran = _runner(clock, {B: [841.0], A: [992.0]})
        outcome = confirm(
            run, [B], A, rounds=2, clock=clock, deadline=deadline, trial_wall_s=10.0, **earlier
        )
        return outcome, ran

    outcome, ran = rounds(25.0, prior={B: [914.0]}, stand_in={A: [562.0]})
    assert ran == [B, A]
    assert outcome.values[A] == [992.0] and outcome.values[B] == [914.0, 841.0]
    assert outcome.winner == A
    # pooled as the rounds' own (the old way), the window decides against the baseline
    pooled, _ = rounds(25.0, prior={B: [914.0], A: [562.0]})
    assert pooled.winner == B
    # where the deadline leaves the baseline out of the rounds, its window is what it has
    cut, ran = rounds(15.0, stand_in={A: [562.0]})
    assert ran == [B] and cut.values[A] == [562.0] and cut.winner == B


def test_cheaper_wins_a_tie_and_a_dearer_setting_must_win_by_the_effect_size() -> None:
    """3 workers on a 2-CPU machine read 4% above 2 workers, with rounds 10% apart: within the
    noise this run measured, so the cheaper setting wins (the simplest-within-2% rule picked
    the dearer one). 8% ahead, past the margin's cap, the dearer one wins."""
    two, three = Config(64, 2, 2), Config(64, 3, 2)
    base = Config(64)
    noisy = {two: [95.0, 100.0, 105.0], three: [99.0, 104.0, 109.0], base: [50.0, 55.0, 60.0]}
    assert confirm_mod.cheapest_tied([three, two, base], noisy, base) == two
    ahead = {two: [99.5, 100.0, 100.5], three: [107.5, 108.0, 108.5], base: [50.0, 50.5, 51.0]}
    assert confirm_mod.cheapest_tied([three, two, base], ahead, base) == three
    # the margin is the measured noise's: many quiet rounds leave a 4% lead standing
    quiet = {
        c: [v * (1 + 0.001 * (i % 3 - 1)) for i in range(40)]
        for c, v in ((two, 100.0), (three, 104.0), (base, 50.0))
    }
    assert confirm_mod.cheapest_tied([three, two, base], quiet, base) == three


def test_of_equal_settings_the_one_that_costs_least_wins() -> None:
    """Equal figures: fewer workers, then a smaller prefetch, then no pinning, then the
    user's batch size."""
    base = Config(64)
    same = [100.0, 100.0, 100.0]
    options = [
        Config(64, 4, 2),
        Config(64, 2, 8),
        Config(64, 2, 2, pin_memory=True),
        Config(128, 2, 2),
        Config(64, 2, 2),
    ]
    values = {c: same for c in options}
    assert confirm_mod.cheapest_tied(options, values, base) == Config(64, 2, 2)
    del values[Config(64, 2, 2)]
    assert confirm_mod.cheapest_tied(options[:4], values, base) == Config(128, 2, 2)


def test_a_gap_no_load_explains_is_clear_on_a_busy_machine_too() -> None:
    """A busy machine lets only rounds compare figures, but a 12x gain, however few rounds
    measured the baseline, is no noise: 'within the noise' would tell the user to keep a
    setting that loses over 10x."""
    base, win = Config(32), Config(128, 2, 2)
    conf = _confirmation(
        base,
        {base: [152.0], win: [1860.0, 1790.0, 1900.0]},
        subs={
            base: [[140.0, 160.0, 150.0, 155.0]],
            win: [[1800.0, 1900.0], [1750.0, 1850.0], [1880.0, 1920.0]],
        },
    )
    assert conf.winner == win
    assert conf.clearly_better_than_baseline(sub_windows=False)
    near = _confirmation(
        base,
        {base: [152.0], win: [300.0, 290.0]},
        subs={base: [[140.0, 160.0]], win: [[290.0, 310.0], [280.0, 300.0]]},
    )
    assert not near.clearly_better_than_baseline(sub_windows=False)  # 2x: load may explain it
    assert near.clearly_better_than_baseline(sub_windows=True)
