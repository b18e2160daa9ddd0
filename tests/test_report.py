"""Tests of loadertune.view.summary: the per-trial line, the tables, the plain (non-terminal)
view."""

from __future__ import annotations

import dataclasses
import io

import pytest
from rich.console import Console

from loadertune.config import Config
from loadertune.hardware import Hardware
from loadertune.measure.failures import Failure
from loadertune.measure.meter import Measurement
from loadertune.results.recommendation import Recommendation
from loadertune.trials import TrialResult
from loadertune.view.progress import LiveView, trial_line
from loadertune.view.summary import print_summary, summary_lines
from loadertune.view.tables import summary_table, trials_table


def _measurement(rate: float, blocked: float = 0.25, sub: list[float] | None = None) -> Measurement:
    return Measurement(
        samples_per_s=rate,
        sub_window_samples_per_s=sub or [rate] * 4,
        blocked_fraction=blocked,
        first_batch_s=0.01,
        warmup_s=0.1,
        window_s=1.0,
        n_samples=int(rate),
        n_batches=10,
        complete=True,
    )


OK = TrialResult(
    config=Config(64, 4, 2, True, False),
    phase="search",
    measurement=_measurement(12345.6, 0.25, [900.0, 1000.0, 1100.0, 1000.0]),
)
FAILED = TrialResult(
    config=Config(128, 8, 4),
    phase="search",
    failure=Failure(
        "shm_exhausted", "a DataLoader worker ran out of shared memory", "raise --shm-size"
    ),
)
PRUNED = TrialResult(
    config=Config(32, 1, 1, False, True),
    phase="search",
    measurement=_measurement(500.0, 0.9),
    pruned=True,
)
SKIPPED = TrialResult(config=Config(256, 16), phase="search", skipped="over the memory budget")


def _render(renderable: object) -> str:
    buf = io.StringIO()
    Console(file=buf, width=250, force_terminal=False, color_system=None).print(renderable)
    return buf.getvalue()


def test_trial_line_ok() -> None:
    line = trial_line(OK)
    assert line.startswith("search ")
    assert "bs=64 w=4 pf=2 pin" in line
    assert "12,346 samples/s" in line
    assert "blocked 25%" in line
    assert "spread 20%" in line  # (1100 - 900) / 1000
    assert "FAILED" not in line
    assert "pruned" not in line


def test_one_sub_windows_spread_is_unknown_not_zero() -> None:
    """A window of one sub-window has no spread: "-", not "spread 0%", which a new user read as
    a precise figure."""
    one = dataclasses.replace(OK, measurement=_measurement(500.0, 0.2, [500.0]))
    assert one.measurement is not None and one.measurement.spread is None
    assert "spread -" in trial_line(one)
    assert one.measurement.to_dict()["spread"] is None


def test_a_trial_line_shows_the_epoch_rate_where_it_differs() -> None:
    """The search ranks by the epoch rate (each epoch's start-up counted): where it differs
    from the steady rate by more than a tenth, the line shows it too."""
    startup = dataclasses.replace(OK, epoch_samples=500)  # 0.01 s of first batch per epoch
    assert startup.epoch_samples_per_s is not None
    assert startup.epoch_samples_per_s < 0.9 * (startup.samples_per_s or 0)
    assert f"({startup.epoch_samples_per_s:,.0f} per epoch)" in trial_line(startup)
    assert "per epoch" not in trial_line(OK)  # no epoch length: one figure


def test_trial_line_failed() -> None:
    line = trial_line(FAILED)
    assert "bs=128 w=8 pf=4" in line
    assert "FAILED shm_exhausted: a DataLoader worker ran out of shared memory" in line
    assert "samples/s" not in line


def test_trial_line_pruned() -> None:
    line = trial_line(PRUNED)
    assert "bs=32 w=1 pf=1 persist" in line
    assert "500 samples/s" in line
    assert line.endswith("(pruned)")


def test_trial_line_skipped() -> None:
    line = trial_line(SKIPPED)
    assert "bs=256 w=16 pf=2" in line
    assert "skipped: over the memory budget" in line


def test_trial_line_phase() -> None:
    confirm = TrialResult(config=Config(64), phase="confirm", measurement=_measurement(100.0))
    line = trial_line(confirm)
    assert line.startswith("confirm ")
    assert "bs=64 w=0" in line


def test_trials_table_lists_every_trial() -> None:
    trials = [OK, FAILED, PRUNED, SKIPPED]
    table = trials_table(trials)
    assert table.row_count == 4
    text = _render(table)
    for t in trials:
        assert t.config.label() in text
    assert "shm_exhausted: a DataLoader worker ran out of shared memory" in text
    assert "pruned" in text
    assert "skipped" in text
    assert "12,346" in text


def test_live_view_prints_plain_lines_off_terminal() -> None:
    buf = io.StringIO()
    console = Console(file=buf, width=250, force_terminal=False, color_system=None)
    with LiveView(console) as view:
        view.search_started(deadline=0.0, budget_s=60.0)
        view.phase("explore")
        view.trial_started(FAILED.config, "search")
        view.trial_finished(FAILED, best=OK)
        view.trial_started(None, "baseline")
        view.trial_finished(OK, best=OK)
    out = buf.getvalue()
    lines = out.splitlines()
    assert lines[0] == "loadertune: searching for up to 60 s"
    assert lines[1] == trial_line(FAILED)
    assert lines[2] == trial_line(OK)
    assert len(lines) == 3


class _InterruptedOnce(io.StringIO):
    """A stream whose first flush is where Ctrl-C lands: after the write, before its end."""

    interrupted = False

    def flush(self) -> None:
        if not self.interrupted:
            self.interrupted = True
            raise KeyboardInterrupt


def test_a_line_ctrl_c_lands_on_is_printed_once() -> None:
    """The user presses Ctrl-C on seeing a trial's line; the interrupted search's last words
    through the same console do not repeat it (rich's buffer kept it: seen in CI)."""
    buf = _InterruptedOnce()
    console = Console(file=buf, width=250, force_terminal=False, color_system=None)
    view = LiveView(console)
    with pytest.raises(KeyboardInterrupt):
        view.trial_finished(OK, best=OK)
    console.print("loadertune: search interrupted", soft_wrap=True)
    assert buf.getvalue().splitlines() == [trial_line(OK), "loadertune: search interrupted"]


def _recommendation(**overrides: object) -> Recommendation:
    hw = Hardware(
        cpu_model="AMD EPYC",
        usable_cpus=2,
        logical_cpus=2,
        physical_cores=1,
        cpu_quota=None,
        memory_total_bytes=16 * 2**30,
        memory_available_bytes=8 * 2**30,
        memory_limit_bytes=None,
        shm_total_bytes=None,
        shm_free_bytes=None,
        open_files_limit=1024,
        gpus=(),
        gpu_note="NVML unavailable: test",
        driver_version=None,
    )
    fields: dict[str, object] = {
        "loader_kwargs": Config(128, 4).loader_kwargs(),
        "samples_per_s": 4000.0,
        "baseline_kwargs": Config(64).loader_kwargs(),
        "baseline_samples_per_s": 1000.0,
        "speedup": 3.5,
        "within_noise": False,
        "best_at_batch_size": {
            "loader_kwargs": Config(64, 4).loader_kwargs(),
            "samples_per_s": 3000.0,
        },
        "trials": [OK, FAILED],
        "diagnosis": {
            "bottleneck": "compute",
            "ceiling_samples_per_s": 5000.0,
            "percent_of_ceiling": 80.0,
            "ceilings": {"limiting_stage": "consumer"},
            "winner": {"bottleneck": "compute"},
            "baseline": {"bottleneck": "input"},
        },
        "hardware": hw,
        "search": {
            "n_trials": 2,
            "elapsed_s": 42.0,
            "stop_reason": "budget",
            "study_name": "s",
            "storage": "sqlite:///x.db",
        },
        "winner": {
            "samples_per_s": 4000.0,
            "epoch_samples_per_s": 3900.0,
            "blocked_fraction": 0.02,
            "spread": 0.05,
            "cpu_percent_main": 95.0,
            "cpu_percent_workers": 180.0,
            "pss_bytes": 3 * 2**30,
        },
        "baseline": {"samples_per_s": 1000.0, "blocked_fraction": 0.6},
        "epoch_samples": 50_000,
    }
    fields.update(overrides)
    return Recommendation(**fields)  # type: ignore[arg-type]


def test_summary_lines() -> None:
    lines = summary_lines(_recommendation())
    assert lines[0] == "speed-up 3.50x per epoch (clearly faster than your settings)"
    assert any(
        "estimated ceiling 5,000 samples/s (limited by your step)" in line and "80%" in line
        for line in lines
    )
    assert any(line.startswith("best at your batch size: bs=64 w=4 pf=2") for line in lines)
    assert any(
        "2 trials in 42 s, stopped: the budget ran out before any final round measured the "
        "finalists" in line
        for line in lines
    )
    assert not any("resumed" in line for line in lines)


def test_a_best_at_your_batch_size_faster_than_the_winner_says_why_it_lost() -> None:
    """A figure higher than the winner's is explained: a search figure never set beside the
    winner, or the rounds' figure side by side, where it led (the winner was chosen on every
    figure pooled; the line had said it "lost to the winner side by side", where it led)."""
    at_bs = Config(64, 4)
    faster = {"loader_kwargs": at_bs.loader_kwargs(), "samples_per_s": 4400.0}

    def line_of(rec: Recommendation) -> str:
        return next(x for x in summary_lines(rec) if x.startswith("best at your batch size"))

    line = line_of(_recommendation(best_at_batch_size=faster))
    assert "4,400 samples/s in the search alone: it was not measured beside the winner" in line
    confirmed = dataclasses.replace(OK, config=at_bs, phase="confirm")
    line = line_of(_recommendation(best_at_batch_size=faster, trials=[OK, confirmed]))
    assert "side by side in the final rounds, ahead of the winner there" in line
    assert "the winner leads over the whole search" in line and "lost" not in line
    assert "side by side" not in line_of(_recommendation())  # 3,000 < the winner's 4,000
    assert "(your own settings)" not in line_of(_recommendation())
    own = {"loader_kwargs": Config(64).loader_kwargs(), "samples_per_s": 1000.0}  # the baseline
    assert line_of(_recommendation(best_at_batch_size=own)).startswith(
        "best at your batch size: bs=64 w=0 (your own settings) 1,000 samples/s"
    )


def test_summary_lines_say_when_the_budget_held_too_few_trials() -> None:
    """A baseline of seconds-long batches can spend the budget before the search explores
    anything: the summary says so, and what budget would give it room (ten trials of the
    median's length, after the opening's own time)."""
    base = dataclasses.replace(OK, phase="baseline", wall_s=69.0)
    probe = dataclasses.replace(OK, phase="probe", wall_s=11.0)
    one = dataclasses.replace(OK, wall_s=9.0)
    rec = _recommendation(trials=[base, probe, one])
    rec.search.update(elapsed_s=89.0, n_trials=3)
    line = next(x for x in summary_lines(rec) if x.startswith("the budget ran out"))
    assert line == (
        "the budget ran out after 1 setting beyond your own and the probe (its trials took 9-69 s "
        "each): a budget of about 240 s (--budget, or budget_s=) gives room for ten"
    )  # 69 + 11 + 10 x 11 = 190 s, rounded up to whole minutes
    rec.search["stop_reason"] = "no_improvement"
    assert not any(x.startswith("the budget ran out") for x in summary_lines(rec))
    explored = [base, probe, one, one, one]
    rec = _recommendation(trials=explored)
    assert not any(x.startswith("the budget ran out") for x in summary_lines(rec))


def test_summary_lines_say_a_resumed_study_held_earlier_trials() -> None:
    """A resumed search's table shows this run's trials (and its kept baseline and probe); the
    earlier runs' trials count, and the summary says how many the study held."""
    rec = _recommendation()
    rec.search["n_previous_trials"] = 12
    lines = summary_lines(rec)
    assert any(
        "2 trials in 42 s, stopped: the budget ran out before any final round measured the "
        "finalists; resumed a study of 12 trials from earlier runs; study 's'" in line
        for line in lines
    )


def test_the_budgets_stop_names_final_rounds_only_where_one_ran() -> None:
    """A new user's searches said the budget "held no further trial beside the final rounds"
    where no final round had run, or the deadline had stopped the only one."""
    rec = _recommendation(trials=[OK, dataclasses.replace(OK, phase="confirm")])
    assert any("held no further trial beside the final rounds" in x for x in summary_lines(rec))
    cut = dataclasses.replace(OK, phase="confirm", measurement=None, skipped="the deadline")
    rec = _recommendation(trials=[OK, cut])
    assert any("before any final round measured the finalists" in x for x in summary_lines(rec))


def test_summary_lines_within_noise_and_same_batch_size() -> None:
    rec = _recommendation(
        within_noise=True,
        speedup=1.01,
        best_at_batch_size={"loader_kwargs": Config(128, 4).loader_kwargs()},
    )
    lines = summary_lines(rec)
    assert "within the noise of your settings" in lines[0]
    assert not any(line.startswith("best at your batch size") for line in lines)


def test_a_winner_behind_side_by_side_is_not_offered_for_free() -> None:
    """Ahead over the whole search (its median, the exploration's figures pooled), behind in the
    rounds side by side: neither offered for free nor called faster, and the verdict does not
    tell the user to keep the settings the saved pick replaces."""
    lines = summary_lines(_recommendation(within_noise=True, speedup=0.81))
    assert "speed-up 0.81x" in lines[0] and "behind them side by side" in lines[0]
    assert "for free" not in lines[0] and "clearly" not in lines[0]
    assert "keep" not in lines[0] and "the winner is saved" in lines[0]


def test_the_time_between_epochs_turns_the_epochs_speed_up_into_the_runs() -> None:
    """Validation and logging between epochs run as long with any loader setting: the run's own
    speed-up is (N/base + rest) / (N/win + rest), said beside the epochs' own."""
    rec = _recommendation(
        between_epochs_s=4.0,
        winner={"epoch_samples_per_s": 4000.0},
        baseline={"epoch_samples_per_s": 1000.0},
    )
    lines = summary_lines(rec)
    assert lines[0].startswith("speed-up 3.50x per epoch")
    # 50,000 samples: 50 s + 4 s against 12.5 s + 4 s
    assert "about 3.27x per epoch of your run, with the 4.00 s your script spends" in lines[1]
    short = summary_lines(_recommendation(between_epochs_s=0.1))  # 0.8% of the epoch: not said
    assert not any("of your run" in line for line in short)
    assert not any("of your run" in line for line in summary_lines(_recommendation()))


def test_an_epoch_of_unknown_length_is_not_called_an_epoch() -> None:
    """A loader without a length (an IterableDataset): the rates are steady ones, and the
    workers' start-up at each epoch is not in them; the speed-up says so."""
    lines = summary_lines(_recommendation(epoch_samples=None))
    assert lines[0].startswith("speed-up 3.50x in the steady rate (clearly faster")
    assert "length is unknown" in lines[0] and "per epoch" not in lines[0]
    older = _recommendation().to_entry()
    del older["epoch_samples"]  # a file written before the field: nothing claimed either way
    assert summary_lines(older)[0].startswith("speed-up 3.50x per epoch")


def test_summary_table_sets_baseline_beside_winner() -> None:
    text = _render(summary_table(_recommendation()))
    assert "bs=64 w=0" in text  # baseline
    assert "bs=128 w=4 pf=2" in text  # winner
    assert "4,000" in text
    assert "95% + 180%" in text
    assert "3,072 MiB" in text
    assert "the loader (input)" in text  # the baseline waited for data
    assert "your step (compute)" in text


def test_summary_table_without_batch_size_in_kwargs() -> None:
    """A batch sampler decides the batch (no batch_size in the kwargs): the table labels the
    setting as any other, not as a raw dict (issue 11)."""
    kwargs = {
        "num_workers": 4,
        "prefetch_factor": 2,
        "pin_memory": False,
        "persistent_workers": False,
    }
    text = _render(summary_table(_recommendation(loader_kwargs=kwargs)))
    assert "bs=sampler w=4 pf=2" in text
    assert "{" not in text and "bs=1" not in text


def test_print_summary_names_the_machine_above_the_table() -> None:
    console = Console(file=io.StringIO(), record=True, width=60, force_terminal=False)
    print_summary(_recommendation(), console)
    text = console.export_text()
    first = text.splitlines()[0]
    assert first.startswith("loadertune on 2 usable CPUs")  # one line, not wrapped to the table
    assert text.index("loadertune on") < text.index("baseline (yours)")
    assert "use: DataLoader(dataset, **" in text


def _bare_recommendation() -> Recommendation:
    """Every optional figure missing: what a resumed search whose winner was measured only in
    the earlier run, or a partial entry, hands to the summary."""
    return _recommendation(
        samples_per_s=None,
        baseline_samples_per_s=None,
        speedup=None,
        best_at_batch_size=None,
        trials=[],
        diagnosis={
            "bottleneck": None,
            "ceiling_samples_per_s": 5000.0,
            "percent_of_ceiling": None,  # the winner has no figures of its own
            "ceilings": {},
            "winner": None,
            "baseline": None,
            "warnings": [],
            "advice": [],
        },
        search={},
        winner=None,
        baseline=None,
    )


def test_the_summary_is_total_over_missing_figures() -> None:
    rec = _bare_recommendation()
    lines = summary_lines(rec)
    assert lines[0] == "estimated ceiling 5,000 samples/s (limited by an unknown stage)"
    assert lines[1] == "0 trials, stopped: unknown"
    text = _render(summary_table(rec))
    assert "bs=128 w=4" in text and "-" in text
    console = Console(file=io.StringIO(), record=True, width=120, force_terminal=False)
    print_summary(rec, console, trials=True)
    assert "use: DataLoader(dataset, **" in console.export_text()


def test_a_winner_far_above_the_estimated_ceiling_is_not_said_to_reach_it() -> None:
    """The estimate rests on the probe's per-sample figures at one batch size: in-process
    loading at a larger batch (bench_tuner's rows_batch_sizes: 326%) beats it. A new user read
    "estimated ceiling 151 samples/s ...; the winner's median rate is 1254% of it ... so this
    is no bound" as broken: a figure the run refutes is not printed, only that none holds."""
    rec = _bare_recommendation()
    rec.diagnosis["percent_of_ceiling"] = 1254.0
    line = summary_lines(rec)[0]
    assert line == (
        "ceiling: none estimated (the probe's figures did not hold for the winner's setting)"
    )
    assert "5,000" not in line and "%" not in line
    assert rec.diagnosis["ceiling_samples_per_s"] == 5000.0  # the JSON keeps its fields
    rec.diagnosis["percent_of_ceiling"] = 103.0  # within the noise of an upper bound
    assert summary_lines(rec)[0] == (
        "estimated ceiling 5,000 samples/s (limited by an unknown stage); "
        "the winner's median rate reaches 103% of it"
    )


def test_a_trial_far_above_the_estimated_ceiling_says_it_bounds_nothing() -> None:
    """A search on a machine kept half busy by other processes estimated 63 samples/s, read
    578 in a trial, and said the winner (51 in its one final round) "reaches 81% of it". The
    best of a few noisy trials may read somewhat above a true ceiling: that is still said
    plainly."""
    rec = _bare_recommendation()
    rec.diagnosis.update(ceiling_samples_per_s=63.0, percent_of_ceiling=81.0)
    rec.search["best_explored_samples_per_s"] = 578.0
    line = summary_lines(rec)[0]
    assert line.startswith("ceiling: none estimated (a trial of the search measured 578 ")
    assert "63" not in line and "81%" not in line
    rec.search["best_explored_samples_per_s"] = 90.0  # 1.43x: the best of noisy trials
    assert summary_lines(rec)[0].endswith("reaches 81% of it")


def test_the_best_at_your_batch_size_from_an_earlier_run_shows_its_rate() -> None:
    """A resumed study (tune_loader run twice): the best setting at the user's batch size was
    measured only by the earlier run, and the summary read "bs=32 w=3 pf=4 persist -
    samples/s". The study holds its rate: the line shows it, and says where it comes from."""
    from loadertune.hardware import detect
    from loadertune.results.recommendation import build_recommendation
    from loadertune.search import SearchOutcome, SearchSettings
    from loadertune.search.space import SearchSpace

    base, winner, earlier = Config(32), Config(64, 2, 2), Config(32, 3, 4, False, True)
    base_trial = TrialResult(config=base, phase="baseline", measurement=_measurement(1000.0))
    win_trial = TrialResult(config=winner, phase="search", measurement=_measurement(4000.0))
    outcome = SearchOutcome(
        baseline=base,
        winner=winner,
        trials=[base_trial, win_trial],
        confirmation=None,
        estimates=None,
        space=SearchSpace(batch_sizes=(32, 64), max_workers=4),
        stop_reason="budget",
        settings=SearchSettings(),
        storage="sqlite:///:memory:",
        elapsed_s=60.0,
        n_previous_trials=6,
        user_batch_size=32,
        values={base: 1000.0, winner: 4000.0, earlier: 2500.0},  # `earlier`: the study's
    )
    rec = build_recommendation(outcome, detect(), workload={})
    assert rec.best_at_batch_size == {
        "loader_kwargs": earlier.loader_kwargs(),
        "epoch_samples_per_s": 2500.0,
        "earlier_run": True,
    }
    (line,) = [x for x in summary_lines(rec) if x.startswith("best at your batch size")]
    assert line.startswith(
        f"best at your batch size: {earlier.label()} 2,500 samples/s per epoch, measured in an "
        "earlier run of the study; "
    )
    # an entry that holds no figure of it says so in words, never "-" for a number
    for at_bs, words in [
        ({"earlier_run": True}, "(measured in an earlier run of the study)"),
        ({}, "(no figure of it in this run)"),
    ]:
        entry = rec.to_entry()
        entry["best_at_batch_size"] = {"loader_kwargs": earlier.loader_kwargs(), **at_bs}
        (line,) = [x for x in summary_lines(entry) if x.startswith("best at your batch size")]
        assert f"{earlier.label()} {words};" in line and " - " not in line


def test_the_summary_survives_an_empty_diagnosis() -> None:
    rec = _recommendation(diagnosis={}, best_at_batch_size={"samples_per_s": 1.0}, search={})
    assert summary_lines(rec)[-1].endswith("stopped: unknown")
    assert "bs=64 w=0" in _render(summary_table(rec))


def test_every_stage_is_named_in_words() -> None:
    """No internal name (main_process, consumer) reaches the user."""
    for stage, words in [
        ("main_process", "loading in the training process itself (num_workers=0)"),
        ("consumer", "your step"),
        ("cpu", "the CPUs, which loading and your step share"),
        ("transfer", "the host-to-device copy"),
    ]:
        diag = {"ceiling_samples_per_s": 900.0, "ceilings": {"limiting_stage": stage}}
        (line,) = [x for x in summary_lines(_recommendation(diagnosis=diag)) if "ceiling" in x]
        assert f"(limited by {words}" in line and stage not in line.replace(words, "")


def test_stopped_at_the_ceiling_never_contradicts_the_ceiling_line() -> None:
    """The stop rule reads the best rate the exploration measured; the ceiling line, the
    winner's median over its final rounds. Both are said as what they are."""
    diag = {
        "ceiling_samples_per_s": 3000.0,
        "percent_of_ceiling": 53.0,
        "ceilings": {"limiting_stage": "cpu"},
    }
    search = {
        "n_trials": 9,
        "stop_reason": "at_ceiling",
        "best_explored_samples_per_s": 2950.0,
    }
    lines = summary_lines(_recommendation(diagnosis=diag, search=search))
    ceiling = next(x for x in lines if x.startswith("estimated ceiling"))
    stopped = next(x for x in lines if "stopped:" in x)
    assert "the winner's median rate reaches 53% of it" in ceiling
    assert "the best trial measured 2,950 samples/s, at the estimated ceiling" in stopped
    assert "the final rounds measured the winner lower" in stopped
    assert "at_ceiling" not in stopped
    near = summary_lines(
        _recommendation(diagnosis={**diag, "percent_of_ceiling": 97.0}, search=search)
    )
    assert not any("measured the winner lower" in x for x in near)


def test_a_result_reads_back_whole_and_a_kept_one_says_so() -> None:
    """What a study keeps of the probe's trials (issue 14) comes back as it was measured."""
    for t in (OK, FAILED, PRUNED, SKIPPED):
        assert TrialResult.from_dict(t.to_dict()) == t
    kept = TrialResult.from_dict({**OK.to_dict(), "kept": True})
    assert kept.kept and "ok (kept from an earlier run)" in _render(trials_table([kept]))


def test_a_piped_console_is_wide_enough_for_a_settings_label(monkeypatch) -> None:
    """Piped (a log, CI), rich would wrap a table's 'bs=32 w=7 pf=4 pin persist' at 80 columns;
    COLUMNS still decides where it is set."""
    from loadertune.view.console import PIPED_WIDTH, plain_console

    monkeypatch.delenv("COLUMNS", raising=False)
    assert plain_console().width == PIPED_WIDTH
    monkeypatch.setenv("COLUMNS", "90")
    assert plain_console().width == 90


def test_within_the_noise_says_what_keeping_the_settings_means() -> None:
    """Within the noise, the winner is "for free" only at the user's batch size (another asks the
    learning rate to change with it), and a winner that is the user's own setting is said so."""
    other_bs = summary_lines(_recommendation(within_noise=True, speedup=1.03))
    assert (
        "at another batch size: keeping yours loses nothing (the best setting at it is below; "
        "`loadertune run` applies that one, and in code `rec.best_at_batch_size` holds it)"
        in (other_bs[0])
    )
    assert "for free" not in other_bs[0]
    same_bs = _recommendation(within_noise=True, speedup=1.03)
    same_bs.loader_kwargs = Config(64, 4).loader_kwargs()
    assert "ahead of them: take the winner, for free" in summary_lines(same_bs)[0]
    own = _recommendation(within_noise=True, speedup=1.0)
    own.loader_kwargs = own.baseline_kwargs
    assert "your settings are the best found; keep them" in summary_lines(own)[0]
