"""The search driver, over a deterministic fake workload: Optuna's in-memory storage, and a real
SQLite one where persistence is the point (``settings(..., persist=True)``)."""

from __future__ import annotations

import dataclasses
import os
import signal
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import optuna
import pytest

from loadertune.config import Config
from loadertune.errors import ConfigError, LoadertuneError, SearchInterrupted, UserCodeError
from loadertune.hardware import Hardware, detect
from loadertune.measure.failures import Failure
from loadertune.measure.meter import Measurement, WindowSpec
from loadertune.measure.resources import ResourceUsage
from loadertune.search import Search as _Search
from loadertune.search import SearchOutcome, SearchSettings, dominated
from loadertune.search.probe import Estimates
from loadertune.trials import Limits, ShouldStop, TrialResult
from loadertune.trials.contract import BaseRunner


def fake_clock() -> SimpleNamespace:
    clock = SimpleNamespace(now=0.0)
    clock.monotonic = lambda: clock.now
    return clock


def Search(runner: Any, **kw: Any) -> _Search:
    """The driver on ``runner``'s fake clock (unless the test gives one)."""
    kw.setdefault("clock", runner.clock.monotonic)
    return _Search(runner, **kw)


class FakeRunner(BaseRunner):
    """A workload whose rate is ``rate(config)``; failures from ``fail(config)``.

    Each trial moves the fake clock by ``cost_s`` (the search's time is simulated); sub-window
    rates are flat. ``run_many`` is the base class's: one ``run`` after the other.
    """

    in_process = True
    uses_cuda = False
    batch_size_fixed = None
    loader_recreated = False
    target_note = None
    user_error = UserCodeError

    def __init__(
        self,
        rate: Callable[[Config], float],
        *,
        fail: Callable[[Config], Failure | None] = lambda c: None,
        epoch_samples: int | None = 100_000,
        cost_s: float = 0.01,
        interrupt_after: int | None = None,
        needs_timeout_s: Callable[[str], float] = lambda phase: 0.0,
        clock: SimpleNamespace | None = None,
        replay_rate: float = 1e6,
        subs: Callable[[Config], list[float]] | None = None,
    ) -> None:
        self.rate, self.fail = rate, fail
        self.subs = subs  # sub-window rates of a setting (default: four of its rate)
        self.replay_rate = replay_rate
        self.epoch_samples = epoch_samples
        self.bytes_per_sample = 64.0
        self.cost_s = cost_s
        self.interrupt_after = interrupt_after
        self.log: list[tuple[str, Config]] = []
        self.limits: list[tuple[str, Limits]] = []
        self.windows: list[tuple[str, WindowSpec]] = []
        self.pruned = 0
        # a trial of this phase needs a limit of at least this long (a slow-starting script)
        self.needs_timeout_s = needs_timeout_s
        self.clock = clock or fake_clock()  # the trials advance it instead of sleeping

    def run(
        self,
        config: Config | None,
        *,
        window: WindowSpec,
        limits: Limits,
        phase: str = "search",
        should_stop: ShouldStop | None = None,
    ) -> TrialResult:
        assert config is not None
        if self.interrupt_after is not None and len(self.log) >= self.interrupt_after:
            raise KeyboardInterrupt
        self.log.append((phase, config))
        self.limits.append((phase, limits))
        self.windows.append((phase, window))
        self.clock.now += self.cost_s
        result = TrialResult(
            config, phase=phase, wall_s=self.cost_s, epoch_samples=self.epoch_samples
        )
        failure = self.fail(config)
        if limits.timeout_s < self.needs_timeout_s(phase):
            failure = Failure("timeout", f"ran past its limit of {limits.timeout_s} s", "a hang?")
        if failure is not None:
            result.failure = failure
            return result
        if phase == "replay":
            rate, blocked = self.replay_rate, 0.0
        else:
            rate = self.rate(config)
            blocked = 0.9 if config.num_workers == 0 else 0.3
        subs = self.subs(config) if self.subs is not None and phase != "replay" else [rate] * 4
        if should_stop is not None:
            for i, r in enumerate(subs):
                if should_stop(i, r):
                    result.pruned = True
                    self.pruned += 1
                    subs = subs[: i + 1]
                    break
        result.measurement = Measurement(
            samples_per_s=rate,
            sub_window_samples_per_s=subs,
            blocked_fraction=blocked,
            first_batch_s=0.05,
            warmup_s=0.1,
            window_s=1.0,
            n_samples=int(rate),
            n_batches=max(1, int(rate) // 32),
            complete=not result.pruned,
            stopped_early=result.pruned,
            blocked_cpu_fraction=0.05 if config.num_workers == 0 else None,
        )
        result.resources = ResourceUsage(cpu_percent_main=50.0, worker_pss_bytes=50 * 2**20)
        return result

    def close(self) -> None:
        pass


def io_landscape(config: Config) -> float:
    """Latency-bound loading: 500 samples/s per worker, up to a consumer limit of 6000."""
    if config.num_workers == 0:
        return 400.0
    return min(500.0 * config.num_workers, 6000.0) * (
        1.0 if config.prefetch_factor and config.prefetch_factor >= 2 else 0.9
    )


@pytest.fixture(scope="module")
def hw() -> Hardware:
    return detect()


def settings(tmp_path, *, persist: bool = False, **kw) -> SearchSettings:
    """Test settings; ``persist``: a real SQLite storage (resume, interruption, saved studies)
    instead of Optuna's in-memory one, whose set-up costs nothing."""
    base = {
        "budget_s": 20.0,
        "storage": (
            f"sqlite:///{tmp_path / 'studies.db'}" if persist else optuna.storages.InMemoryStorage()
        ),
        "study_name": "t",
        "seed": 1,
    }
    return SearchSettings(**{**base, **kw})


def search_at_32(
    runner: FakeRunner, hw: Hardware, search_settings: SearchSettings, batch_size: int = 32
):
    """A search of ``runner``'s workload from a baseline of batch 32 (or ``batch_size``), at
    that batch only."""
    return Search(
        runner,
        hardware=hw,
        baseline=Config(batch_size),
        batch_sizes=[batch_size],
        settings=search_settings,
    ).run()


def test_search_finds_the_optimum_region(tmp_path, hw) -> None:
    runner = FakeRunner(io_landscape)
    outcome = Search(
        runner, hardware=hw, baseline=Config(32), batch_sizes=[32], settings=settings(tmp_path)
    ).run()
    assert outcome.winner.num_workers >= 12  # the landscape tops out at 12 workers
    assert outcome.values[outcome.winner] >= 0.95 * 6000
    assert outcome.confirmation is not None and not outcome.confirmation.within_noise
    phases = [p for p, _ in runner.log]
    # the baseline is w=0: the probe adds w=1, after the replay (a short epoch's whole-epoch
    # trials then follow one another from an epoch's start)
    assert phases[:3] == ["baseline", "replay", "probe"]
    assert outcome.stop_reason in {"no_improvement", "space_exhausted", "budget"}


@pytest.mark.parametrize("epoch_samples", [4, 100_000])
def test_an_epoch_as_short_as_a_trial_is_measured_whole(tmp_path, hw, epoch_samples) -> None:
    """Once the baseline has told the rate: an epoch that takes at most two window trials is
    measured whole (the opening's replay and probe are not: they measure the step and a
    sample's loading cost); a longer one by windows."""
    runner = FakeRunner(io_landscape, epoch_samples=epoch_samples)  # trials take 0.01 s
    Search(
        runner, hardware=hw, baseline=Config(32), batch_sizes=[32], settings=settings(tmp_path)
    ).run()
    whole = {phase for phase, window in runner.windows if window.whole_epoch}
    assert runner.windows[0][0] == "baseline" and not runner.windows[0][1].whole_epoch
    if epoch_samples == 4:  # 0.01 s at the baseline's 400 samples/s: half of two trials
        assert whole == {"search", "confirm"}
        assert all(w.warmup_batches == 0 for _, w in runner.windows if w.whole_epoch)
    else:
        assert not whole


def test_a_setting_measured_slow_gets_a_window_where_the_best_gets_whole_epochs(
    tmp_path, hw
) -> None:
    """An epoch of 400 samples (13 batches: room for the best's 12 workers) takes 0.07 s at
    the best's 6000 samples/s (whole, under two trials of 0.05 s) and 1 s at the baseline's
    400: re-measured in the confirmation, the baseline gets a window, not a whole epoch twenty
    trials long (a slow baseline's whole epoch once ran 54 s past a search's deadline in the
    simulator)."""
    runner = FakeRunner(io_landscape, epoch_samples=400, cost_s=0.05)
    outcome = search_at_32(runner, hw, settings(tmp_path, budget_s=10))
    trials = zip(runner.windows, runner.log, strict=True)
    confirmed = [(c, w) for (p, w), (_, c) in trials if p == "confirm"]
    assert any(c == Config(32) for c, _ in confirmed)
    assert all(not w.whole_epoch for c, w in confirmed if c == Config(32))
    assert any(w.whole_epoch for c, w in confirmed if c == outcome.winner)


def test_no_setting_is_measured_twice_while_exploring(tmp_path, hw) -> None:
    runner = FakeRunner(io_landscape)
    Search(
        runner,
        hardware=hw,
        baseline=Config(32),
        batch_sizes=[32],
        settings=settings(tmp_path, patience=30, n_trials=40, budget_s=30),
    ).run()
    explored = [c for p, c in runner.log if p in ("search", "probe", "baseline")]
    assert len(explored) == len(set(explored))


def test_settings_as_demanding_as_a_failed_one_are_not_tried(tmp_path, hw) -> None:
    def fail(config: Config) -> Failure | None:
        if config.num_workers >= 6:
            return Failure("worker_killed", "killed", "fewer workers")
        return None

    runner = FakeRunner(io_landscape, fail=fail)
    outcome = search_at_32(runner, hw, settings(tmp_path, patience=20, budget_s=15))
    failures = [c for p, c in runner.log if fail(c) is not None]
    for i, bad in enumerate(failures):  # each later failure is not dominated by an earlier one
        assert not any(dominated(bad, earlier, "worker_killed") for earlier in failures[:i])
    assert outcome.winner.num_workers < 6


def test_clearly_worse_trials_are_pruned(tmp_path, hw) -> None:
    runner = FakeRunner(io_landscape)
    Search(
        runner,
        hardware=hw,
        baseline=Config(32),
        batch_sizes=[32],
        settings=settings(tmp_path, patience=25, budget_s=15),
    ).run()
    assert runner.pruned > 0


def test_a_pruned_setting_is_not_run_again(tmp_path, hw) -> None:
    """Optuna learns little from a pruned trial and proposes it again: where every setting
    with workers is clearly behind (the step needs the CPUs), each is stopped once."""

    def workers_lose(config: Config) -> float:
        return 1000.0 if config.num_workers == 0 else 400.0

    runner = FakeRunner(workers_lose)
    search_at_32(runner, hw, settings(tmp_path, patience=40, budget_s=10, max_workers=2))
    searched = [c for p, c in runner.log if p == "search"]
    assert runner.pruned > 0 and len(searched) == len(set(searched))


def test_a_live_search_prunes_against_the_best_and_writes_its_study_once_at_the_end(
    tmp_path, hw
) -> None:
    """On a live run a trial costs the training what it loses against the best so far: the
    bar is the best itself, not the median of the three best, no confirmation runs when nothing
    beat the run's own setting, and the study is kept in memory until the search ends (then
    written whole)."""
    from loadertune.search.study import stored_trials

    def flat_then_slower(config: Config) -> float:  # only the baseline is fast
        return 1000.0 if config == Config(32) else 800.0

    storage = f"sqlite:///{tmp_path / 'live.db'}"
    seen_during: list[int] = []

    class Watching(FakeRunner):
        def run(self, config, **kw):  # type: ignore[no-untyped-def]
            try:
                seen_during.append(len(stored_trials(storage, "live")))
            except ConfigError:
                seen_during.append(0)  # the study is not in the storage yet
            return super().run(config, **kw)

    runner = Watching(flat_then_slower)
    live = SearchSettings(
        live=True,
        prune_ratio=0.85,
        patience=3,
        budget_s=15,
        storage=storage,
        study_name="live",
        seed=1,
        resume=False,
    )
    outcome = Search(
        runner, hardware=hw, baseline=Config(32), batch_sizes=[32], settings=live
    ).run()
    # 800 < 0.85 x 1000: pruned, although it is the median of the three best
    assert runner.pruned >= 2
    assert outcome.stop_reason == "no_improvement" and outcome.winner == Config(32)
    # nothing beat the run's own setting: no rounds of slower settings, the training goes on
    assert outcome.confirmation is None and "confirm" not in {p for p, _ in runner.log}
    assert set(seen_during) == {0}
    explored = [c for phase, c in runner.log if phase == "search"]
    stored = stored_trials(storage, "live")
    assert explored and len(stored) >= len(explored)
    # the same landscape in a side search: robust best = 800, no trial is pruned
    side = FakeRunner(flat_then_slower)
    Search(
        side,
        hardware=hw,
        baseline=Config(32),
        batch_sizes=[32],
        settings=settings(tmp_path, budget_s=5, prune_ratio=0.85, patience=3),
    ).run()
    assert side.pruned == 0


@pytest.mark.parametrize(
    ("other_subs", "switches"),
    [
        ([1010.0, 1060.0, 1030.0, 1050.0], True),  # faster in every pair
        ([800.0, 1300.0, 900.0, 1200.0], False),  # a higher mean, as often slower as faster
    ],
)
def test_a_live_run_leaves_its_own_setting_only_when_the_rates_say_so_often(
    tmp_path, hw, other_subs: list[float], switches: bool
) -> None:
    """The winner of a live search replaces the running setting only when most pairs of
    sub-window rates (this run's) say it is faster: a wrong switch costs the rest of the run."""
    own = Config(32)  # no workers; every setting with workers is the "other" one

    def rate(config: Config) -> float:
        return 1050.0 if config.num_workers else 1000.0

    def subs(config: Config) -> list[float]:
        return list(other_subs) if config.num_workers else [980.0, 1000.0, 1020.0, 1000.0]

    kw = {"budget_s": 8, "n_trials": 1, "patience": 1, "prune_ratio": 0.1}
    outcomes = {}
    for live in (False, True):
        runner = FakeRunner(rate, subs=subs)
        outcomes[live] = Search(
            runner,
            hardware=hw,
            baseline=own,
            batch_sizes=[32],
            settings=settings(tmp_path, study_name=f"s{live}", live=live, **kw),
        ).run()
    assert outcomes[False].winner.num_workers  # the highest median, in a side search
    assert bool(outcomes[True].winner.num_workers) == switches


def test_switching_needs_most_pairs_of_rates_to_agree() -> None:
    from loadertune.search import plan

    assert plan.switch_pays([11.0, 12.0], [10.0, 10.5])
    assert not plan.switch_pays([11.0, 9.0], [10.0, 10.5])  # 2 of 4 pairs
    assert plan.switch_pays([5.0], [])  # nothing to weigh: the winner stands


def test_n_trials_caps_the_settings_measured(tmp_path, hw) -> None:
    runner = FakeRunner(io_landscape)
    outcome = Search(
        runner,
        hardware=hw,
        baseline=Config(32),
        batch_sizes=[32],
        settings=settings(tmp_path, n_trials=6, patience=50),
    ).run()
    assert outcome.stop_reason == "n_trials"
    assert len([p for p, _ in runner.log if p in ("baseline", "probe", "search")]) == 6


def _never_waiting(tmp_path, hw, *, epoch_samples: int) -> tuple[FakeRunner, SearchOutcome]:
    """A search of one batch size whose every trial runs at 1e6 samples/s and never waits for
    data, over epochs of ``epoch_samples`` (each starts its workers in 0.05 s)."""
    runner = FakeRunner(lambda c: 1e6, epoch_samples=epoch_samples)

    def run(config, **kw):  # the baseline and everything else: compute-bound
        result = FakeRunner.run(runner, config, **kw)
        if result.measurement is not None:
            result.measurement.blocked_fraction = 0.01
        return result

    runner.run = run  # type: ignore[method-assign]
    outcome = Search(
        runner,
        hardware=hw,
        baseline=Config(32, 2, 2),
        batch_sizes=[32],
        settings=settings(tmp_path),
    ).run()
    return runner, outcome


def test_a_compute_bound_baseline_stops_early(tmp_path, hw) -> None:
    """The baseline never waits for data and runs at the consumer's rate, over an epoch long
    beside its workers' start (0.05 s of 10 s): nothing to gain."""
    runner, outcome = _never_waiting(tmp_path, hw, epoch_samples=10_000_000)
    assert outcome.stop_reason == "compute_bound"
    assert not [c for p, c in runner.log if p == "search"]
    assert outcome.winner == Config(32, 2, 2)


def test_a_baseline_that_keeps_up_but_restarts_its_workers_every_epoch_is_explored(
    tmp_path, hw
) -> None:
    """Steady, it never waits; but each 0.1 s epoch first waits 0.05 s for its workers to
    start: persistent workers are worth a third of the epoch, so the search goes on."""
    runner, outcome = _never_waiting(tmp_path, hw, epoch_samples=100_000)
    assert outcome.stop_reason != "compute_bound"
    assert any(p == "search" for p, _ in runner.log)


def test_a_user_bug_stops_the_search(tmp_path, hw) -> None:
    def fail(config: Config) -> Failure | None:
        return Failure(
            "dataset_error", "the dataset raised", "fix it", user_bug=True, detail="Traceback..."
        )

    with pytest.raises(UserCodeError, match="the dataset raised") as info:
        Search(
            FakeRunner(io_landscape, fail=fail),
            hardware=hw,
            baseline=Config(32),
            batch_sizes=[32],
            settings=settings(tmp_path),
        ).run()
    assert info.value.kind == "dataset_error" and "Traceback" in str(info.value)


def test_interrupted_search_keeps_its_trials_and_resumes(tmp_path, hw) -> None:
    s = settings(tmp_path, persist=True, study_name="resume-me", patience=30, budget_s=20)
    with pytest.raises(SearchInterrupted, match="run the same command again") as info:
        Search(
            FakeRunner(io_landscape, interrupt_after=8),
            hardware=hw,
            baseline=Config(32),
            batch_sizes=[32],
            settings=s,
        ).run()
    assert info.value.n_complete >= 5
    study = optuna.load_study(study_name="resume-me", storage=s.storage)
    states = [t.state for t in study.trials]
    assert optuna.trial.TrialState.RUNNING not in states  # the interrupted trial is closed
    runner = FakeRunner(io_landscape)
    outcome = Search(runner, hardware=hw, baseline=Config(32), batch_sizes=[32], settings=s).run()
    assert outcome.n_previous_trials >= 8
    assert "probe" not in [p for p, _ in runner.log]  # the probe's estimates were kept
    assert outcome.values[outcome.winner] >= 0.95 * 6000


def test_an_interrupt_as_the_search_finishes_is_an_interrupted_search(tmp_path, hw) -> None:
    """Ctrl-C or SIGTERM while the runner closes, once the search is over: the runner is closed
    all the same, and the interrupt says what the study keeps, with the winner as the best so
    far (it escaped as a bare KeyboardInterrupt: click's 'Aborted!', exit 1, nothing saved)."""
    from loadertune.api.tune import run_search

    class ClosingSlowly(FakeRunner):
        closes = 0

        def close(self) -> None:
            self.closes += 1
            if self.closes == 1:
                raise KeyboardInterrupt

    runner = ClosingSlowly(io_landscape)
    s = settings(tmp_path, persist=True, study_name="finishing", patience=10, budget_s=5)
    with pytest.raises(SearchInterrupted, match="as it finished") as info:
        run_search(
            runner,
            baseline=Config(32),
            batch_sizes=[32],
            settings=s,
            observer=None,
            hw=hw,
            workload={"kind": "dataset"},
        )
    assert runner.closes == 2  # closed after the interrupt
    assert info.value.best is not None and info.value.best["samples_per_s"] > 0
    assert info.value.n_complete >= 3 and info.value.study_name == "finishing"


def _search(runner: FakeRunner, s: SearchSettings, hw: Hardware, workers: int = 0):
    baseline = Config(32, workers)
    return Search(runner, hardware=hw, baseline=baseline, batch_sizes=[32], settings=s).run()


@pytest.mark.parametrize("after", [1, 2])
def test_a_search_interrupted_during_the_probe_keeps_its_finished_trials(
    tmp_path, hw, after: int
) -> None:
    """Issue 14: Ctrl-C after the baseline (and the replay): the resumed search runs
    only what the probe still misses, its kept trials are read back from the study whole, and
    they become the study's trials once the probe is done."""
    s = settings(tmp_path, persist=True, study_name="probe-cut", n_trials=4)
    first = FakeRunner(io_landscape, interrupt_after=after)
    with pytest.raises(SearchInterrupted, match=f"{after} completed trials are kept") as info:
        _search(first, s, hw)
    assert info.value.n_complete == after
    runner = FakeRunner(io_landscape)
    outcome = _search(runner, s, hw)
    assert outcome.n_previous_trials == after
    ran = [phase for phase, _ in runner.log]
    opening = ["baseline", "replay", "probe"]  # the num_workers=1 probe comes last
    assert [phase for phase in ran if phase in opening] == opening[after:]
    kept = [t for t in outcome.trials if t.kept]
    assert [(t.phase, t.config) for t in kept] == first.log
    assert all(t.measurement for t in kept)
    assert all(
        t.measurement.samples_per_s == io_landscape(t.config)  # type: ignore[union-attr]
        for t in kept
        if t.phase != "replay"  # (it measures the step alone)
    )
    assert kept[0].wall_s == first.cost_s and kept[0].resources == ResourceUsage(
        cpu_percent_main=50.0, worker_pss_bytes=50 * 2**20
    )
    study = optuna.load_study(study_name="probe-cut", storage=s.storage)
    phases = [t.user_attrs.get("phase") for t in study.trials]
    assert phases.count("baseline") == 1 and phases.count("probe") == 1  # recorded once


def test_ctrl_c_in_the_middle_of_a_study_write_waits_for_its_end(tmp_path, hw, monkeypatch) -> None:
    """SIGINT delivered while the baseline is being written to the study (inside the storage's
    call): the write completes, then the search stops as interrupted (not with the storage's
    own error), and the next run takes the baseline back rather than measuring it again."""
    s = settings(tmp_path, persist=True, study_name="cut-write", n_trials=4)
    write = optuna.study.Study.set_user_attr
    calls: list[tuple[str, int]] = []

    def interrupted_write(study, key, value):
        if key != "opening":  # the baseline's write (not the study's start time, say)
            return write(study, key, value)
        n = len([c for c in calls if c[0] == "start"])
        calls.append(("start", n))
        if n == 0:
            os.kill(os.getpid(), signal.SIGINT)  # arrives here, inside the write
        write(study, key, value)
        calls.append(("done", n))

    monkeypatch.setattr(optuna.study.Study, "set_user_attr", interrupted_write)
    with pytest.raises(SearchInterrupted, match="run the same command again"):
        _search(FakeRunner(io_landscape), s, hw)
    assert calls[:2] == [("start", 0), ("done", 0)]  # not cut in half
    monkeypatch.setattr(optuna.study.Study, "set_user_attr", write)
    runner = FakeRunner(io_landscape)
    _search(runner, s, hw)
    assert "baseline" not in [phase for phase, _ in runner.log]


def test_a_search_interrupted_between_its_two_replays_runs_the_second_only(tmp_path, hw) -> None:
    s = settings(tmp_path, persist=True, study_name="replay-cut", n_trials=4)
    first = FakeRunner(io_landscape, interrupt_after=2)  # baseline, the first replay
    with pytest.raises(SearchInterrupted):
        Search(first, hardware=hw, baseline=Config(32), batch_sizes=[32, 64], settings=s).run()
    assert [phase for phase, _ in first.log] == ["baseline", "replay"]
    runner = FakeRunner(io_landscape)
    outcome = Search(
        runner, hardware=hw, baseline=Config(32), batch_sizes=[32, 64], settings=s
    ).run()
    replays = [config for phase, config in runner.log if phase == "replay"]
    assert replays == [Config(64)]  # the second; the first is the earlier run's
    assert outcome.estimates is not None


def test_a_resumed_search_runs_no_baseline_and_no_probe(tmp_path, hw) -> None:
    """A study whose probe was done: the next run measures none of its trials again."""
    s = settings(tmp_path, persist=True, study_name="probe-done", n_trials=5)
    _search(FakeRunner(io_landscape), s, hw)
    runner = FakeRunner(io_landscape)
    outcome = _search(runner, s, hw)
    assert not {"baseline", "probe", "replay"} & {phase for phase, _ in runner.log}
    assert {t.phase for t in outcome.trials if t.kept} == {"baseline", "probe", "replay"}
    # another baseline than the one kept: the kept trials do not describe it
    outcome = _search(FakeRunner(io_landscape), s, hw, workers=2)
    assert not any(t.kept for t in outcome.trials)


def test_trial_limits_are_what_the_workload_needs_not_what_is_left_of_the_budget(
    tmp_path, hw
) -> None:
    """The replay comes when the budget is nearly spent; it still gets the time it needs."""
    # baseline and probe take 1 s of the 2.5 s budget; the replay still fits, but a limit cut to
    # what is left (1.5 s + 1) is less than the 3 s it needs (a slow-starting script)
    clock = SimpleNamespace(now=0.0)
    clock.monotonic = lambda: clock.now
    runner = FakeRunner(io_landscape, cost_s=0.5, needs_timeout_s=lambda phase: 3.0, clock=clock)
    outcome = Search(
        runner,
        clock=clock.monotonic,
        hardware=hw,
        baseline=Config(32),
        batch_sizes=[32],
        settings=settings(tmp_path, budget_s=2.5),
    ).run()
    replay = [limits for phase, limits in runner.limits if phase == "replay"]
    assert replay and replay[0].timeout_s >= 3.0 and replay[0].startup_s >= 3.0
    assert all(t.ok for t in outcome.trials if t.phase in ("baseline", "probe", "replay"))


def test_a_failed_replay_leaves_the_estimates_out_and_the_search_goes_on(tmp_path, hw) -> None:
    runner = FakeRunner(io_landscape, needs_timeout_s=lambda phase: 1e9 * (phase == "replay"))
    outcome = Search(
        runner, hardware=hw, baseline=Config(32), batch_sizes=[32], settings=settings(tmp_path)
    ).run()
    assert [t.error for t in outcome.trials if t.phase == "replay"] == ["timeout"]
    assert outcome.estimates is None
    assert outcome.winner.num_workers > 0  # it still searched and found workers help
    assert "search" in [p for p, _ in runner.log]


def test_a_resumed_search_measures_its_winner_even_with_no_budget_left(tmp_path, hw) -> None:
    """The winner of the earlier run is re-measured: the summary needs figures of its own."""
    s = settings(tmp_path, persist=True, study_name="resumed", budget_s=5)
    Search(
        FakeRunner(io_landscape), hardware=hw, baseline=Config(32), batch_sizes=[32], settings=s
    ).run()
    runner = FakeRunner(io_landscape, cost_s=0.2)
    outcome = Search(
        runner,
        hardware=hw,
        baseline=Config(32),
        batch_sizes=[32],
        settings=dataclasses.replace(s, budget_s=0.05),
    ).run()
    assert outcome.n_previous_trials > 0
    assert [t.config for t in outcome.results_for(outcome.winner)] == [outcome.winner]
    assert outcome.results_for(outcome.winner)[0].ok
    # measured past the deadline, so not cut there (``Limits.ends_by``)
    confirms = [limits for phase, limits in runner.limits if phase == "confirm"]
    assert confirms and confirms[0].ends_by is None


def test_fresh_start_forgets_the_study(tmp_path, hw) -> None:
    s = settings(tmp_path, persist=True, study_name="again", n_trials=6)
    Search(
        FakeRunner(io_landscape), hardware=hw, baseline=Config(32), batch_sizes=[32], settings=s
    ).run()
    runner = FakeRunner(io_landscape)
    outcome = Search(
        runner,
        hardware=hw,
        baseline=Config(32),
        batch_sizes=[32],
        settings=dataclasses.replace(s, resume=False),
    ).run()
    assert outcome.n_previous_trials == 0 and runner.log[0][0] == "baseline"


def test_a_fresh_search_keeps_the_study_it_replaces_for_the_entries_that_name_it(
    tmp_path, hw
) -> None:
    """A fresh search of a study name (another ``--out``, the same script and arguments) keeps
    the study it replaces under its start time, where the first search's entry finds it: it
    had been deleted, and a report of the first file mixed the two searches."""
    from loadertune.search.study import replaced_name, stored_trials, study_of_entry

    s = settings(tmp_path, persist=True, study_name="again", n_trials=6)
    first = Search(
        FakeRunner(io_landscape), hardware=hw, baseline=Config(32), batch_sizes=[32], settings=s
    ).run()
    before = stored_trials(first.storage, "again")
    second = Search(
        FakeRunner(io_landscape),
        hardware=hw,
        baseline=Config(32),
        batch_sizes=[32],
        settings=dataclasses.replace(s, resume=False, n_trials=3),
    ).run()
    assert first.study_started and second.study_started
    assert first.study_started != second.study_started
    kept = study_of_entry(first.storage, "again", first.study_started)
    assert kept == replaced_name("again", first.study_started)
    assert [t["params"] for t in stored_trials(first.storage, kept)] == [
        t["params"] for t in before
    ]
    assert study_of_entry(first.storage, "again", second.study_started) == "again"
    assert study_of_entry(first.storage, "again", None) == "again"  # an older entry
    assert len(stored_trials(first.storage, "again")) < len(before)


def test_a_study_name_keeps_its_newest_replaced_studies_only(tmp_path) -> None:
    from loadertune.search import study as study_module

    storage = f"sqlite:///{tmp_path / 's.db'}"
    for _ in range(study_module.KEEP_REPLACED + 3):
        study_module._replace(storage, "x")
        made = optuna.create_study(study_name="x", storage=storage, direction="maximize")
        made.set_user_attr(study_module.STARTED, study_module._now())
        made.add_trial(optuna.trial.create_trial(value=1.0))
    names = optuna.get_all_study_names(storage)
    assert "x" in names
    assert len([n for n in names if n.startswith("x@")]) == study_module.KEEP_REPLACED


def test_training_code_failing_at_another_batch_size_rules_that_size_out(tmp_path, hw) -> None:
    """A step that assumes its own batch size (a ``view(32, -1)``) raises at any other: that is
    the batch size's failure, not the user's bug; the search leaves the size out and goes on.
    The same error at the user's own batch size still stops the search."""

    def step_fails(config: Config) -> Failure | None:
        if config.batch_size == 32:
            return None
        return Failure(
            "step_error",
            "the training step raised: RuntimeError: shape '[32, -1]'",
            "fix the step",
            user_bug=True,
            detail="Traceback...",
        )

    runner = FakeRunner(io_landscape, fail=step_fails)
    outcome = Search(
        runner,
        hardware=hw,
        baseline=Config(32),
        batch_sizes=[16, 32, 64],
        settings=settings(tmp_path, budget_s=10),
    ).run()
    assert outcome.winner.batch_size == 32
    rejected = [t for t in outcome.trials if t.error == "batch_size_rejected"]
    assert {t.config.batch_size for t in rejected} <= {16, 64} and rejected
    assert all(not t.failure.user_bug and "its own is 32" in t.failure.message for t in rejected)
    # each rejected batch size ran once, whatever its loading settings
    assert len(rejected) == len({t.config.batch_size for t in rejected})

    def every_size_fails(config: Config) -> Failure | None:
        return Failure(
            "step_error",
            "the training step raised: KeyError",
            "fix the step",
            user_bug=True,
            detail="Traceback...",
        )

    with pytest.raises(UserCodeError, match="KeyError"):
        Search(
            FakeRunner(io_landscape, fail=every_size_fails),
            hardware=hw,
            baseline=Config(32),
            batch_sizes=[16, 32, 64],
            settings=settings(tmp_path, budget_s=10, study_name="other"),
        ).run()


def test_batch_size_candidates_are_searched(tmp_path, hw) -> None:
    def rate(config: Config) -> float:  # bigger batches amortise a per-batch cost
        return io_landscape(config) * (config.batch_size / 128) ** 0.3

    outcome = Search(
        FakeRunner(rate),
        hardware=hw,
        baseline=Config(32),
        batch_sizes=[32, 64, 128],
        settings=settings(tmp_path, budget_s=20, patience=25),
    ).run()
    assert outcome.winner.batch_size == 128
    best_at_32 = outcome.best_at_batch_size(32)
    assert best_at_32 is not None and best_at_32.batch_size == 32


def test_a_batch_size_past_the_epoch_is_left_out_and_said(tmp_path, hw) -> None:
    """``--batch-sizes 64,100000`` on 384 samples an epoch: 100000 makes one short batch an
    epoch (none with drop_last); it had sat in the space, never tried and never mentioned."""
    notes: list[str] = []
    observer = SimpleNamespace(
        search_started=lambda *a: None,
        phase=lambda *a: None,
        trial_started=lambda *a: None,
        trial_finished=lambda *a: None,
        note=notes.append,
    )
    runner = FakeRunner(io_landscape, epoch_samples=384)
    outcome = Search(
        runner,
        hardware=hw,
        baseline=Config(64),
        batch_sizes=[64, 100_000],
        settings=settings(tmp_path, n_trials=4),
        observer=observer,  # type: ignore[arg-type]
    ).run()
    assert outcome.space.batch_sizes == (64,)
    assert all(c.batch_size == 64 for _, c in runner.log if c is not None)
    assert "batch size 100000 left out of the search: an epoch holds 384 samples" in notes


def test_bad_storage_url_is_a_clear_error(tmp_path, hw) -> None:
    with pytest.raises(ConfigError, match="not a storage Optuna can open"):
        Search(
            FakeRunner(io_landscape),
            hardware=hw,
            baseline=Config(32),
            batch_sizes=[32],
            settings=settings(tmp_path, storage="nosuchdb://x/y"),
        ).run()


@pytest.mark.parametrize("budget", [0, -5, float("nan"), float("inf")])
def test_budget_must_be_positive_and_finite(budget: float) -> None:
    with pytest.raises(ConfigError, match="budget_s must be a positive number") as info:
        SearchSettings(budget_s=budget)
    assert str(info.value).endswith(f"but got {budget!r}.")  # the value, not the code


def test_every_trial_failing_is_an_error(tmp_path, hw) -> None:
    def fail(config: Config) -> Failure | None:
        return (
            None
            if config.num_workers == 0 and config.batch_size == 32
            else Failure("worker_killed", "killed", "fewer")
        )

    def rate(config: Config) -> float:
        return 100.0

    # w=0 works (so the probe can run) but the baseline (w=2) fails: the winner is w=0. The
    # search ends by patience; the budget is large so that a loaded machine cannot end it first.
    outcome = Search(
        FakeRunner(rate, fail=fail),
        hardware=hw,
        baseline=Config(32, 2, 2),
        batch_sizes=[32],
        settings=settings(tmp_path, budget_s=60, patience=4),
    ).run()
    assert outcome.winner == Config(32)
    assert outcome.confirmation is not None and outcome.confirmation.clearly_better


def test_own_settings_that_take_the_whole_budget_and_fail_say_so(tmp_path, hw) -> None:
    """A baseline that times out after the whole budget leaves nothing else a chance: the
    error says that it was the user's own settings, and what to do, not "every trial failed"."""
    clock = SimpleNamespace(now=0.0)
    clock.monotonic = lambda: clock.now
    slow = Failure("timeout", "ran past its limit of 127 s", "a hang?")
    fail = lambda c: slow if c.num_workers == 16 else None  # noqa: E731
    runner = FakeRunner(io_landscape, fail=fail, cost_s=127.0, clock=clock)
    with pytest.raises(LoadertuneError, match=r"your own settings failed \(timeout") as caught:
        Search(
            runner,
            clock=clock.monotonic,
            hardware=hw,
            baseline=Config(64, 16, 2),
            batch_sizes=[64],
            settings=settings(tmp_path, budget_s=60),
        ).run()
    assert "--budget" in str(caught.value) and [p for p, _ in runner.log] == ["baseline"]


def test_own_settings_that_take_half_the_budget_leave_the_rest_to_the_search(tmp_path, hw) -> None:
    """The user's batch of 512 with one worker waits 33 s for its warm-up, of a 60 s budget;
    the other settings' trials take 1 s. Their typical trial is no sample of the others: the
    probe at batch 16 and the exploration still run (the simulator's pick was 0.06 of the
    best, the search ended after that one trial)."""
    clock = SimpleNamespace(now=0.0)
    clock.monotonic = lambda: clock.now

    class SlowBaseline(FakeRunner):
        def run(self, config, **kw):  # type: ignore[no-untyped-def]
            result = super().run(config, **kw)
            if kw.get("phase") == "baseline":
                self.clock.now += 33.0
                result.wall_s += 33.0
                assert result.measurement is not None
                result.measurement.warmup_s += 33.0
            return result

    runner = SlowBaseline(io_landscape, cost_s=1.0, clock=clock)
    outcome = Search(
        runner,
        clock=clock.monotonic,
        hardware=hw,
        baseline=Config(512, 1, 2),
        batch_sizes=[16, 512],
        settings=settings(tmp_path, budget_s=60),
    ).run()
    phases = [p for p, _ in runner.log]
    assert phases[:2] == ["baseline", "probe"] and phases.count("search") >= 3
    assert outcome.winner.num_workers > 1


def test_the_one_worker_probe_is_left_out_when_it_and_the_first_settings_would_not_fit(
    tmp_path, hw
) -> None:
    """Loading in the loop's own process makes 10 samples/s at batch 256: a batch takes 26 s,
    a trial of one worker minutes. It is left out (the simulator's took 18 s of the 39 s left,
    and no setting of 8 workers fitted after it); with a batch of 8 it runs."""

    def slow_alone(config: Config) -> float:
        return 10.0 if config.num_workers == 0 else 500.0 * config.num_workers

    def probes(batch_size: int) -> list[Config]:
        runner = FakeRunner(slow_alone)
        Search(
            runner,
            hardware=hw,
            baseline=Config(batch_size),
            batch_sizes=[batch_size],
            settings=settings(tmp_path, budget_s=60, study_name=f"w1-{batch_size}"),
        ).run()
        return [c for phase, c in runner.log if phase == "probe"]

    assert probes(256) == []
    assert probes(8) == [Config(8, 1, 2)]


def test_gpu_memory_model_bounds_the_batch_size(tmp_path, hw) -> None:
    """Peaks grow 6 MiB per sample on a 6 GiB card: with a 10% margin the line allows 855.
    1024 is within twice that, so it is tried (the line may over-predict) and runs out; 2048 is
    predicted, not tried; the largest predicted to fit is verified by a trial; a batch that ran
    out of memory never wins."""
    mib = 2**20

    class GpuRunner(FakeRunner):
        def run(self, config, **kw):
            result = super().run(config, **kw)
            if config.batch_size >= 1024:  # 400 + 6 x 1024 MiB > 6 GiB
                result.measurement = None
                result.failure = Failure("oom", "the GPU ran out of memory", "smaller batch")
            elif result.failure is None:
                result.cuda_peak_reserved_bytes = int(400 * mib + 6 * mib * config.batch_size)
                result.cuda_capacity_bytes = 6 * 1024 * mib
            return result

    def rate(config: Config) -> float:  # bigger batches are faster: the search wants them
        return io_landscape(config) * config.batch_size / 64

    runner = GpuRunner(rate)
    sizes = [64, 128, 256, 512, 1024, 2048]
    outcome = Search(
        runner,
        hardware=hw,
        baseline=Config(64),
        batch_sizes=sizes,
        settings=settings(tmp_path, budget_s=20, patience=40),
    ).run()
    tried = {c.batch_size for p, c in runner.log if p != "replay"}
    assert 2048 not in tried  # 400 + 6 x 2048 MiB: more than twice what may be used
    ran_1024 = [c for p, c in runner.log if c.batch_size == 1024]
    assert len(ran_1024) == 1, ran_1024  # tried once: its OOM rules it out
    assert 512 in tried  # the largest predicted to fit was verified
    assert outcome.winner.batch_size == 512


def test_after_a_pickle_error_no_worker_setting_is_tried(tmp_path, hw) -> None:
    def fail(config: Config) -> Failure | None:
        if config.num_workers:
            return Failure("pickle_error", "does not pickle", "module level")
        return None

    runner = FakeRunner(io_landscape, fail=fail)
    outcome = Search(
        runner,
        hardware=hw,
        baseline=Config(32),
        batch_sizes=[32],
        settings=settings(tmp_path, budget_s=8, patience=20),
    ).run()
    with_workers = [c for p, c in runner.log if c.num_workers]
    assert len(with_workers) == 1  # the probe's num_workers=1; nothing after it
    assert outcome.winner.num_workers == 0


def test_a_failed_setting_is_never_run_again(tmp_path, hw) -> None:
    """Timeouts included: a setting too slow to start once is not retried (w=16 ran three
    times in one search before), and neither is a setting with more workers."""

    def fail(config: Config) -> Failure | None:
        if config.num_workers >= 9:
            return Failure("timeout", "no batch within 8 s", "a slower setting or a hang")
        return None

    runner = FakeRunner(io_landscape, fail=fail)
    Search(
        runner,
        hardware=hw,
        baseline=Config(32),
        batch_sizes=[32],
        settings=settings(tmp_path, patience=40, budget_s=15),
    ).run()
    failed = [c for p, c in runner.log if fail(c) is not None]
    assert failed, "the landscape's optimum lies beyond 9 workers: the search must get there"
    assert len(failed) == len(set(failed))
    for i, bad in enumerate(failed):
        assert not any(dominated(bad, earlier, "timeout") for earlier in failed[:i])


@pytest.mark.parametrize(
    ("config", "failed", "kind", "expected"),
    [
        (Config(32, 4, 2), Config(32, 4, 2), "timeout", True),
        (Config(32, 4, 2), Config(32, 4, 2), "trial_crashed", True),
        (Config(32, 8, 1), Config(32, 4, 2), "timeout", True),
        (Config(32, 2, 8), Config(32, 4, 2), "timeout", False),
        (Config(16, 8, 2), Config(32, 4, 2), "timeout", False),
        (Config(32, 0), Config(32, 0), "timeout", True),
        (Config(32, 1), Config(32, 0), "timeout", False),
        (Config(16, 4, 2), Config(16, 0), "batch_size_rejected", True),
        (Config(32, 0), Config(16, 0), "batch_size_rejected", False),
    ],
)
def test_what_a_failure_rules_out(config: Config, failed: Config, kind: str, expected: bool):
    assert dominated(config, failed, kind) is expected


def test_the_best_of_each_batch_size_that_waits_for_data_climbs(tmp_path, hw) -> None:
    """w / (1 - blocked) workers: 4 workers blocked half the time call for 8; a batch size far
    behind the best, or one that never waits, is left to the sampler."""
    from loadertune.search.space import SearchSpace

    search = Search(
        FakeRunner(io_landscape),
        hardware=hw,
        baseline=Config(32),
        batch_sizes=[32, 64, 128],
        settings=settings(tmp_path),
    )
    space = SearchSpace(batch_sizes=(32, 64, 128), max_workers=16, limits={"cpu": 16})
    measured = {
        Config(32, 4, 2): (1000.0, 0.5),  # the best, waiting half the time
        Config(32, 2, 2): (600.0, 0.6),  # not its batch size's best
        Config(64, 3, 2): (900.0, 0.0),  # never waits: its step is the limit
        Config(128, 2, 2): (500.0, 0.5),  # under 60% of the best
    }
    for config, (value, blocked) in measured.items():
        search.ledger.values[config] = value
        search.ledger.blocked[config] = blocked
    search.agenda.update(space)
    assert search.agenda.next(space) == Config(32, 8, 2)
    search.agenda.update(space)
    assert search.agenda.next(space) is None  # planned once


@pytest.mark.parametrize(
    ("batch_sizes", "replayed"), [([32, 64, 128], [32, 128]), ([32], [32]), ([8, 32], [32, 8])]
)
def test_the_step_is_replayed_at_a_second_batch_size_when_several_are_offered(
    tmp_path, hw, batch_sizes, replayed
) -> None:
    """The user's batch first; the largest offered (or the smallest) second: two batch sizes
    tell the step's fixed cost per batch, so the seeds know each batch size's ceiling."""
    runner = FakeRunner(io_landscape)
    Search(
        runner,
        hardware=hw,
        baseline=Config(32),
        batch_sizes=batch_sizes,
        settings=settings(tmp_path, budget_s=10, n_trials=4),
    ).run()
    assert [c.batch_size for phase, c in runner.log if phase == "replay"] == replayed


def test_a_replay_measured_below_the_baseline_does_not_end_the_search_at_once(tmp_path, hw):
    """A noisy replay (the step alone) slower than the whole loop measured: its "ceiling" is
    reached by the baseline itself, but the search explores workers before it believes it."""
    runner = FakeRunner(io_landscape, replay_rate=300.0)
    outcome = Search(
        runner,
        hardware=hw,
        baseline=Config(32),
        batch_sizes=[32],
        settings=settings(tmp_path, budget_s=15),
    ).run()
    explored = [c for phase, c in runner.log if phase == "search"]
    assert len(explored) >= 3, (outcome.stop_reason, runner.log)
    assert outcome.winner.num_workers > 0


def test_a_trial_that_would_outlast_the_budget_is_not_started(tmp_path, hw) -> None:
    """It must receive its first batch (a round of its 8 workers' time), a round of warm-up and
    its window's 8 batches, at the pace of the best's workers (4 made 100 samples/s: 8 make
    200): 24 batches of 512 take 61 s, whatever the typical trial took."""
    search = Search(
        FakeRunner(io_landscape),
        hardware=hw,
        baseline=Config(32),
        batch_sizes=[32, 512],
        settings=settings(tmp_path),
    )
    search._deadline = search.clock() + 10
    search.ledger.values[Config(32, 4, 2)] = 100.0
    assert "61 s" in (search._past_the_budget(Config(512, 8, 2)) or "")
    assert search._past_the_budget(Config(32, 1, 2)) is None
    search._deadline = search.clock() + 130
    assert search._past_the_budget(Config(512, 8, 2)) is None


def _estimates(**overrides: float) -> Estimates:
    """A probe's estimates: 50 samples/s per worker, loading waiting on I/O."""
    base: dict[str, float] = {
        "load_s_per_sample": 0.02,
        "load_cpu_fraction": 0.05,
        "worker_s_per_sample": 0.02,
        "step_s_per_sample": 1e-4,
        "step_cpu_per_sample": 1e-4,
        "usable_cpus": 4,
        "max_workers": 128,
        "consumer_ceiling": 1e4,
        "loader_ceiling": 6400,
        "cpu_ceiling": 1e5,
    }
    return Estimates(**{**base, **overrides})  # type: ignore[arg-type]


def _search_with_best(tmp_path, hw, best: Config, value: float, *, left_s: float) -> Search:
    """A search at ``best``'s batch size, its best so far ``value``, ``left_s`` seconds left."""
    search = Search(
        FakeRunner(io_landscape, epoch_samples=None),
        hardware=hw,
        baseline=Config(best.batch_size),
        batch_sizes=[best.batch_size],
        settings=settings(tmp_path),
    )
    search._deadline = search.clock() + left_s
    search.ledger.values[best] = value
    search.ledger.n_explored = 1  # (explored: the search's own judgement of a trial's time)
    return search


def test_many_workers_are_judged_at_the_rate_the_estimates_predict_not_the_slow_best(
    tmp_path, hw
) -> None:
    """Loading waits on I/O: the best so far (16 workers) makes 100 samples/s, and the probe
    predicts 64 workers make 3200. Judged at the best's pace per worker, their trial would take
    most of a minute and never start; at half the predicted rate it takes seconds."""
    est = _estimates()
    assert est.predicted_samples_per_s(64) == pytest.approx(3200)
    search = _search_with_best(tmp_path, hw, Config(128, 16, 2), 100.0, left_s=30)
    many = Config(128, 64, 2)
    assert "budget" in (search._past_the_budget(many) or "")  # 130 batches at 400/s
    assert search._past_the_budget(many, est) is None  # 130 batches at 1600/s: 10 s


def test_a_whole_epochs_trial_is_timed_at_the_rate_it_is_judged_at_not_the_slow_bests(
    tmp_path, hw
) -> None:
    """Epochs of 100 samples, measured whole; the best so far makes 50 samples/s (2 s an
    epoch), and the probe predicts 16 workers make 800 (an eighth of a second). The epoch had
    been timed at the best's rate whatever the setting: a baseline of slow batches of 512 set
    it at 53 samples/s, every setting was skipped with 9 s left, and the search ended at 0.07
    of the best in the simulator."""
    search = Search(
        FakeRunner(io_landscape, epoch_samples=100),
        hardware=hw,
        baseline=Config(16),
        batch_sizes=[16],
        settings=settings(tmp_path),
    )
    search._deadline = search.clock() + 1.5
    search.ledger.values[Config(16, 1, 2)] = 50.0
    search.ledger.n_explored = 1
    many = Config(16, 16, 2)
    assert search._window(many).whole_epoch
    assert search._past_the_budget(many, _estimates()) is None  # 0.3 s + 0.125 s
    assert search._past_the_budget(Config(16), _estimates()) is not None  # 2 s at 50/s


def test_without_estimates_more_workers_are_timed_at_the_pace_of_the_workers_measured(
    tmp_path, hw
) -> None:
    """No probe fitted (the user's one worker at batch 256 of 18 ms samples took 25 s): its
    49 samples/s are one worker's pace, and 16 workers are timed at 16 times it, their first
    batch a worker's 5 s. Timed at 49 samples/s, a round of 16 batches took 84 s, every setting
    with workers was skipped, and the search ended at the user's settings, 0.065 of the best,
    in the simulator."""
    search = _search_with_best(tmp_path, hw, Config(256, 1, 2), 48.7, left_s=35)
    assert search._past_the_budget(Config(256, 16, 2)) is None
    search._deadline = search.clock() + 4  # less than a worker's first batch
    assert "budget" in (search._past_the_budget(Config(256, 16, 2)) or "")

    """6 workers at batch 512 and 200 samples/s: each worker's first batch takes 15 s, then the
    epoch's 4 s (the simulator's ran 10 s past the budget, timed by its epoch alone)."""
    from loadertune.search import plan
    from loadertune.trials import window_for

    whole = window_for(Config(512, 6, 2), window_s=4.0, whole_epoch=True)
    assert plan.least_trial_s(Config(512, 6, 2), whole, 200.0, loader_bound=True) == (
        pytest.approx(6 * 512 / 200 + 4.0)
    )
    assert plan.least_trial_s(Config(512, 6, 2), whole, 0.0, loader_bound=True) == 4.0


def test_a_trial_without_workers_is_timed_at_the_probes_rate_not_the_best(tmp_path, hw) -> None:
    """Loading in the loop's own process makes 50 samples/s, as the probe measured; the best
    so far, with workers, 1000. At batch 512 a batch takes 10 s: its trial (first batch, one
    of warm-up, four in the window) a minute, not the 3 s the best's rate says."""
    est = _estimates(load_cpu_fraction=0.9, step_s_per_sample=1e-5, max_workers=8)
    assert est.predicted_samples_per_s(0) == pytest.approx(50, rel=0.01)
    search = _search_with_best(tmp_path, hw, Config(512, 8, 2), 1000.0, left_s=30)
    assert search._past_the_budget(Config(512)) is None  # at the best's rate
    assert "budget" in (search._past_the_budget(Config(512), est) or "")


def test_the_probe_runs_at_the_smallest_batch_and_the_replay_at_one_that_loads_quickly(
    tmp_path, hw
) -> None:
    """Loading takes 2.25 ms a sample (w=0: 400 samples/s, 90% of it waiting for data): a
    batch of 512 takes over a second to load for the replay, one of 256 under; the probe's
    per-sample figures come from the smallest batch."""
    runner = FakeRunner(io_landscape)
    Search(
        runner,
        hardware=hw,
        baseline=Config(512, 2, 2),
        batch_sizes=[64, 256, 512],
        settings=settings(tmp_path, n_trials=1),
    ).run()
    phases = {phase: config for phase, config in reversed(runner.log)}
    assert phases["probe"].batch_size == 64
    assert phases["replay"] == Config(256)


def test_without_a_winner_from_the_rounds_the_pick_is_no_setting_that_failed_in_them(
    tmp_path, hw
) -> None:
    """Every setting of the confirmation fails there (the machine ran out of something): the
    pick falls back to the exploration's figures, but not to a setting that failed every round
    it ran, however fast it measured before."""
    landscape = lambda c: 1000.0 * (1 + min(c.num_workers, 8))  # noqa: E731
    confirmed: set[Config] = set()
    runner: FakeRunner

    def fail(config: Config) -> Failure | None:
        if runner.log[-1][0] != "confirm":
            return None
        confirmed.add(config)
        return Failure("worker_killed", "a worker was killed", "fewer workers")

    runner = FakeRunner(landscape, fail=fail)
    outcome = search_at_32(runner, hw, settings(tmp_path, confirm_rounds=1, finalists=1))
    assert outcome.confirmation is not None and outcome.confirmation.winner is None
    assert confirmed and outcome.winner not in confirmed
    assert outcome.winner in outcome.values


def test_no_trial_has_more_workers_than_an_epoch_has_batches(tmp_path, hw) -> None:
    """An epoch of 2,048 samples is 8 batches of 256: the loading wants 12 workers, but a
    ninth would get no batch. The search stays within 8 and still finds the best there."""
    runner = FakeRunner(io_landscape, epoch_samples=2048)
    outcome = search_at_32(runner, hw, settings(tmp_path, budget_s=20, patience=30), 256)
    assert max(c.num_workers for _, c in runner.log) <= 8
    assert outcome.winner.num_workers == 8


def test_trials_cut_at_the_deadline_are_skipped_and_rule_nothing_out(tmp_path, hw) -> None:
    """The exploration's and the confirmation's trials carry the search's deadline
    (``Limits.ends_by``), the opening's do not (its figures are the estimates' input); a trial
    the runner cut there (:func:`~loadertune.trials.contract.cut`) is skipped in the outcome and
    pruned in the study, neither a figure nor a failure of its setting."""
    from loadertune.measure.failures import FailureKind
    from loadertune.trials.contract import cut

    class Cutting(FakeRunner):
        def run(self, config, *, window, limits, phase="search", should_stop=None):
            result = super().run(
                config, window=window, limits=limits, phase=phase, should_stop=should_stop
            )
            n_search = sum(p == "search" for p, _ in self.log)
            if phase == "confirm" or (phase == "search" and n_search == 3):
                result.measurement = None
                result.failure = Failure(FailureKind.CUT, "stopped at the search's deadline", "")
            return cut(result)

    runner = Cutting(io_landscape)
    s = settings(tmp_path, budget_s=20.0, study_name="cut")
    outcome = _search(runner, s, hw)
    deadline = {phase: limits.ends_by for phase, limits in runner.limits}
    assert {phase for phase, at in deadline.items() if at is not None} == {"search", "confirm"}
    assert deadline["search"] == deadline["confirm"]
    skipped = [t for t in outcome.trials if t.status == "skipped"]
    assert skipped and all("deadline" in (t.skipped or "") for t in skipped)
    assert {t.phase for t in skipped} == {"search", "confirm"}
    assert all(t.failure is None for t in skipped)
    assert outcome.winner in outcome.values  # picked from figures measured
    study = optuna.load_study(study_name="cut", storage=s.storage)
    states = {t.user_attrs.get("result", {}).get("status"): t.state for t in study.trials}
    assert states["skipped"] == optuna.trial.TrialState.PRUNED


def test_more_workers_are_timed_at_the_pace_measured_up_to_their_prediction(tmp_path, hw) -> None:
    """2 workers made 100 samples/s: 50 each. 32 workers are predicted 800 (the CPUs'
    ceiling); at that pace they would make 1600, so they are timed at 800, not at half the
    prediction: a trial of about 15 s, not 31 s. At half, a user's 16 workers at batch 256
    (44 samples/s each) stayed the best, 0.50 of it, as 33 workers did not fit, in the
    simulator."""
    est = _estimates(cpu_ceiling=800.0)
    many = Config(128, 32, 4)
    assert est.at(128).predicted_samples_per_s(32) == pytest.approx(800)
    search = _search_with_best(tmp_path, hw, Config(128, 2, 2), 100.0, left_s=20)
    assert search._past_the_budget(many, est) is None
    search.ledger.values = {Config(128, 16, 2): 100.0}  # 6 a worker: 200 for 32
    assert "budget" in (search._past_the_budget(many, est) or "")
    # Before any setting is explored, the prediction whole: skipped, the search would end at
    # the baseline for certain (a trial that runs long is cut at the deadline)
    search.ledger.n_explored = 0
    assert search._past_the_budget(many, est) is None


def test_without_rounds_a_figure_within_2_percent_does_not_replace_the_users(hw) -> None:
    """With no confirmation (a resumed search, a spent budget) the pick is the exploration's
    best figure, and within 2% of it the simplest setting, as the rounds' winner is chosen:
    727 samples/s against the user's 725 was no reason to change their settings."""
    own = Config(32, 2, 2, persistent_workers=True)
    search = Search(
        FakeRunner(lambda config: 1.0),
        hardware=hw,
        baseline=own,
        batch_sizes=[32],
        settings=SearchSettings(),
    )
    search.ledger.values.update({own: 725.0, Config(32): 727.0, Config(32, 4, 2): 700.0})
    assert search._best_not_failed(None) == own
    search.ledger.values[Config(32)] = 760.0  # clearly ahead: it wins
    assert search._best_not_failed(None) == Config(32)
    del search.ledger.values[own]  # within 2% of the best, fewer workers first
    search.ledger.values[Config(32, 4, 2)] = 770.0
    assert search._best_not_failed(None) == Config(32)


def test_the_ledger_splits_a_settings_rates_by_how_they_were_measured() -> None:
    """A window's rate and a whole epoch's are two measures: the confirmation pools only those
    measured as its rounds will measure (``Ledger.samples_of_kind``)."""
    from loadertune.search.ledger import Ledger
    from tests.test_report import _measurement

    def measured(config: Config, rate: float, whole: bool) -> TrialResult:
        m = dataclasses.replace(_measurement(rate), whole_epoch=whole)
        return TrialResult(config, phase="search", measurement=m)

    ledger = Ledger(memory_margin=0.1, min_gain=0.01)
    a, b, c = Config(32), Config(32, 2), Config(64, 2)
    for config, rate, whole in [(a, 562.0, False), (b, 914.0, True), (a, 700.0, True)]:
        ledger.add(measured(config, rate, whole))
    ledger.add(measured(c, 800.0, False))
    same, other = ledger.samples_of_kind({a: True, b: True})
    assert same == {a: [700.0], b: [914.0], c: [800.0]}  # c: no kind asked, all its rates
    assert other == {a: [562.0]}
    same, other = ledger.samples_of_kind({a: False, b: False})
    assert same == {a: [562.0], c: [800.0]} and other == {a: [700.0], b: [914.0]}


def _told_mid_search(
    tmp_path, hw, batch_sizes: list[int], **told: Any
) -> tuple[list[Config], list[Config]]:
    """The settings a search measures before the runner, at its 6th trial, takes on ``told``
    (as a script's trial or a live run tells it what it found), and those it explores after,
    on ``io_landscape``."""

    class Told(FakeRunner):
        def run(self, config: Config | None, **kw: Any) -> TrialResult:
            result = super().run(config, **kw)
            if len(self.log) == 6:
                for name, value in told.items():
                    setattr(self, name, value)
            return result

    runner = Told(io_landscape)
    Search(
        runner,
        hardware=hw,
        baseline=Config(64),
        batch_sizes=batch_sizes,
        settings=settings(tmp_path, n_trials=30),
    ).run()
    before = [c for phase, c in runner.log[:6] if phase != "replay"]
    return before, [c for phase, c in runner.log[6:] if phase == "search"]


def test_a_loader_found_created_again_mid_search_leaves_persistence_out_from_then_on(
    tmp_path, hw
) -> None:
    """A new DataLoader every epoch, seen only by a later trial (epochs longer than the
    opening's trials): persistent workers die with each loader, so no persistent setting runs
    after that (a new user's search tried them to its end and saved one)."""
    before, after = _told_mid_search(tmp_path, hw, [64], loader_recreated=True)
    assert any(c.persistent_workers for c in before) and after
    assert not any(c.persistent_workers for c in after), after


def test_a_batch_size_fixed_mid_search_narrows_the_space_without_upsetting_optuna(
    tmp_path, hw
) -> None:
    """A live run's script asks its loader's length after the tuning began (a scheduler made
    at the first step): from then on only its own batch size is searched. Optuna's categorical
    has no dynamic value space: narrowed choices raised "does not support dynamic value
    space" at the next trial, in the training's own process."""
    _, after = _told_mid_search(
        tmp_path, hw, [32, 64, 128], batch_size_fixed="the script asked the loader's length"
    )
    assert after and all(c.batch_size == 64 for c in after), after
