"""Script trials, each failure produced for real; the autouse fixture checks no process survives."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import get_args, get_type_hints

import pytest

from loadertune.config import Config
from loadertune.errors import ConfigError
from loadertune.measure.failures import FailureKind
from loadertune.measure.meter import Measurement, WindowSpec
from loadertune.measure.resources import tree_pss
from loadertune.trials import Limits, TrialResult, window_for
from loadertune.trials.messages import NO_BATCHING, Message
from loadertune.trials.script.runner import (
    ScriptRunner,
    _enough_without_workers,
    check_script,
    kill_group,
)
from loadertune.units import MIB

SCRIPTS = Path(__file__).parent / "scripts"
pytestmark = pytest.mark.e2e


def run(
    script: str,
    config: Config | None,
    *,
    limits: Limits | None = None,
    phase: str = "search",
    window_s: float = 0.3,
    should_stop=None,
):
    runner = ScriptRunner(SCRIPTS / script, loader=None if config is None else 1)
    try:
        return runner.run(
            config,
            window=window_for(config or Config(1), window_s=window_s),
            limits=limits or Limits(timeout_s=60, startup_s=30, hang_s=5),
            phase=phase,
            should_stop=should_stop,
        )
    finally:
        runner.close()


def test_of_loaders_zipped_into_each_step_the_one_with_the_longer_epoch_is_tuned() -> None:
    """``zip(main, itertools.cycle(aux))``: the auxiliary loader yields last before each step
    of its first pass; the main loader, whose epoch the training's is, is the one found."""
    result = run("zip_cycle.py", None, phase="baseline")
    assert result.ok, result.failure
    assert result.extra["loader"]["index"] == 1, result.extra["loader"]
    assert result.extra["loader"]["chosen_by"] == "the optimizer"


def test_of_loaders_zipped_into_each_step_the_one_the_loop_waits_on_is_tuned() -> None:
    """``zip(train, aux)`` with ``aux`` larger and loading in no time: the auxiliary loader
    yields last before each step and has the longer epoch, but every step waits on the
    training loader (a new user's semi-supervised script had the auxiliary one tuned, and a
    speed-up of 18x reported for it)."""
    result = run("zip_longer_aux.py", None, phase="baseline")
    assert result.ok, result.failure
    assert result.extra["loader"]["index"] == 1, result.extra["loader"]
    assert result.extra["loader"]["chosen_by"] == "the optimizer"
    # the other is named, with the way to tune it instead
    assert any(
        "#2 at " in w and "zip_longer_aux.py:12" in w and "--loader 2" in w
        for w in result.extra["warnings"]
    ), result.extra["warnings"]


def test_workers_slow_to_start_are_not_taken_for_hung() -> None:
    """The DataLoader's own timeout bounds the first batch too, which waits for the workers to
    start: at the hang limit (1 s here), workers that take 2.5 s to start (as under 'spawn')
    failed as hung; the start-up limit is theirs."""
    limits = Limits(timeout_s=60, startup_s=30, hang_s=1)
    for config in (None, Config(16, 3, 2)):  # the script's own loader; a setting of the search
        result = run("slow_start.py", config, limits=limits)
        assert result.ok, result.failure


def test_a_validation_inside_the_epoch_is_left_out_of_the_window_and_is_no_hang() -> None:
    """Every 40 steps the script validates for about 1.2 s, longer than the hang limit (1 s)
    and than the 40 steps' loading: the validation's batches are signs of life, and its whole
    pass is left out of the training loader's window (it measured a fifth of the rate)."""
    limits = Limits(timeout_s=60, startup_s=30, hang_s=1)
    samples = {}
    for arg in ("val", "none"):
        runner = ScriptRunner(SCRIPTS / "val_inside.py", args=[arg], loader=1)
        try:
            result = runner.run(
                Config(16, 2, 2),
                window=window_for(Config(16, 2, 2), window_s=3.0),
                limits=limits,
                phase="search",
            )
        finally:
            runner.close()
        assert result.ok, result.failure
        m = result.measurement
        assert m is not None and m.complete and 0 < m.samples_per_s < float("inf"), m
        samples[arg] = (m.n_samples, m.n_batches)
    # the window counts the training loader's batches of 16 only, not the validation's of 8
    assert all(n == 16 * batches > 0 for n, batches in samples.values()), samples


def test_a_validation_inside_the_epoch_is_left_out_of_a_whole_epochs_window_too() -> None:
    """Epochs of 100 steps, a validation of 120 sleeps of 10 ms every 40: hot-swapped
    whole-epoch trials had kept the validations in, and a new user's search, whose opening
    measured windows without them, read each such trial at half its rate and pruned it.

    Any 100 steps in a row hold two validations, at least 2.4 s of sleep, which no load of the
    machine shortens: a window that kept them lasts longer than that; the training's loading
    alone took 0.4-1.8 s under three busy loops (a comparison of rates with and without the
    validations spread 0.3-1.8 on a loaded machine, and failed a full run of the suite)."""
    limits = Limits(timeout_s=60, startup_s=30, hang_s=5)
    config = Config(16, 2, 2)
    _, results = _in_turn(
        "val_inside.py",
        [None, config],
        ["val", "1600"],
        window=lambda c: (
            window_for(c, window_s=2.0, whole_epoch=True) if c else window_for(config, window_s=0.3)
        ),
        limits=limits,
    )
    m = results[1].measurement
    assert m is not None and m.whole_epoch and m.n_batches == 100, m
    assert m.window_s < 2 * 120 * 0.010, m


def test_the_scripts_own_settings_are_measured() -> None:
    result = run("train_val.py", None, phase="baseline")
    assert result.ok, result.failure
    assert result.config == Config(16, 1, 2)  # learnt from the script
    assert result.extra["loader"]["index"] == 2
    assert result.resources is not None and result.resources.n_workers == 1
    assert result.orphans_killed == 0


def test_running_out_of_file_descriptors_is_named() -> None:
    limits = Limits(timeout_s=60, startup_s=30, hang_s=4)
    result = run("fd_limited.py", Config(4, 4, 8), limits=limits)
    assert result.error == "too_many_files", result.failure
    assert "ulimit -n" in result.failure.advice  # type: ignore[union-attr]


def test_the_trial_process_killed_mid_trial_leaves_no_worker() -> None:
    t0 = time.monotonic()
    result = run("kills_parent.py", Config(16, 2, 2))
    assert result.error == "host_oom", result.failure
    assert "killed" in result.failure.message  # type: ignore[union-attr]
    # Seen at once, not by the 60-s timeout; a script launch beside a CI run took up to 19 s.
    assert time.monotonic() - t0 < 55
    assert run("kills_parent.py", Config(16, 1, 2)).ok  # one worker: no kill


def test_a_hung_step_times_out() -> None:
    t0 = time.monotonic()
    limits = Limits(timeout_s=60, startup_s=30, hang_s=2)
    # A window far longer than the 30 batches before the hang: a loaded machine (batches over
    # 10 ms) filled the 0.3 s default first and the trial passed.
    result = run("hangs_in_step.py", Config(16), limits=limits, window_s=5.0)
    assert result.error == "timeout"
    assert time.monotonic() - t0 < 45  # by the 2-s hang limit, not the 60-s timeout


def test_memory_budget_stops_a_script_trial() -> None:
    budget = 600 * MIB
    result = run(
        "hog.py",
        Config(8, 2, 2),
        window_s=30,
        limits=Limits(timeout_s=60, startup_s=30, hang_s=10, memory_budget_bytes=budget),
    )
    assert result.error == "memory_budget", result.failure
    assert tree_pss(1) >= 0  # (the trial's tree is gone; nothing to measure)


def test_a_script_trial_running_at_the_search_deadline_is_cut_and_the_next_launches_anew() -> None:
    """A script trial still in its window at the search's deadline (``Limits.ends_by``): its
    launch is stopped, the trial recorded as skipped, not failed, with the process it ran in
    (its batches are there); the next trial of the same runner starts a fresh launch and
    measures (the autouse fixture: nothing survives)."""
    runner = ScriptRunner(SCRIPTS / "slow_samples.py", loader=1)
    config = Config(8, 2, 2)
    try:
        t0 = time.monotonic()
        limits = Limits(timeout_s=120, startup_s=30, hang_s=5, ends_by=t0 + 6.0)
        cut = runner.run(config, window=window_for(config, window_s=60), limits=limits)
        assert time.monotonic() - t0 < 45  # at the deadline, not at the window's 60 s
        assert cut.failure is None and cut.status == "skipped" and cut.measurement is None
        assert cut.skipped is not None and "deadline" in cut.skipped
        limits = Limits(timeout_s=60, startup_s=30, hang_s=5)
        after = runner.run(config, window=window_for(config, window_s=0.5), limits=limits)
        assert after.ok, after.failure
        assert runner.n_launches == 2
        cut_pids, after_pids = cut.to_dict()["pids"], after.to_dict()["pids"]
        assert len(cut_pids) == 1 and cut_pids != after_pids
        assert after_pids == [after.to_dict()["ran"]["pid"]]
    finally:
        runner.close()


def test_a_persistent_settings_start_up_waits_for_no_batch_queued_before() -> None:
    """After a window, mid-epoch, a persistent setting's start-up per epoch is timed from idle
    workers, as an epoch's end leaves them: one batch's fetch (0.5 s). Resumed with batches
    still queued (2 workers x prefetch 2), torch waits for them first: it read 1.2 s."""
    result = run("slow_every_sample.py", Config(1, 2, 2, persistent_workers=True))
    assert result.ok, result.failure
    assert result.measurement is not None and result.measurement.reentry_s
    assert result.measurement.reentry_s[0] < 0.8


def test_a_clearly_worse_trial_is_pruned_mid_window() -> None:
    result = run("style_alias.py", Config(16), window_s=2.0, should_stop=lambda i, rate: i >= 0)
    assert result.pruned and result.measurement is not None
    # stopped at a sub-window's end, not run to its length (the trial process reads the
    # answer to sub-window 0 at a later one: when, the machine's load decides)
    m = result.measurement
    assert m.stopped_early and not m.complete and len(m.sub_window_samples_per_s) < 4, m


def test_every_message_the_trial_process_sends_has_a_handler() -> None:
    kinds = {get_args(get_type_hints(msg)["t"])[0] for msg in get_args(Message)}
    runner = ScriptRunner(SCRIPTS / "short.py")
    try:
        assert set(runner._handlers) == kinds - {"stop", "release", "run"}  # the other way
    finally:
        runner.close()


@pytest.mark.parametrize("loader", [0, -1, "train.py", "train.py:x"])
def test_bad_loader_selectors(loader) -> None:
    with pytest.raises(ConfigError, match="loader must be"):
        ScriptRunner(SCRIPTS / "short.py", loader=loader)


def test_check_script_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        check_script(tmp_path / "nope.py")
    with pytest.raises(ConfigError, match="not a file"):
        check_script(tmp_path)
    binary = tmp_path / "model.pt"
    binary.write_bytes(b"\x80\x02\x00\x00binary")
    with pytest.raises(ConfigError, match="not"):
        check_script(binary)


def test_kill_group_of_a_finished_group_is_harmless() -> None:
    assert kill_group(2**22 - 7) == 0  # no such group


def test_a_batch_size_over_the_data_is_a_failed_setting_not_a_bug() -> None:
    """no_batches.py has 10 samples, drop_last=True and batch_size=4: a search's batch of 16
    yields nothing, which that setting's trial says (and the search goes on)."""
    result = run("no_batches.py", Config(16, 0))
    assert result.error == "no_batches", result.failure
    assert result.failure is not None and not result.failure.user_bug
    assert "drop_last=True with 10 samples < batch_size 16" in result.failure.message
    assert run("no_batches.py", Config(4, 0)).ok


# -- many settings in one process (loadertune.trials.hotswap.swap) ---------------------------------

SWAPPED = [Config(32, 2, 2), Config(8), Config(16, 1, 2, persistent_workers=True), Config(64, 3, 1)]


def _in_turn(
    script: str,
    configs: list[Config | None],
    args: list[str] | None = None,
    *,
    window: Callable[[Config | None], WindowSpec] | None = None,
    limits: Limits | None = None,
) -> tuple[ScriptRunner, list[TrialResult]]:
    """``configs`` (None: the script's own) measured in turn on ``script`` (windows of 0.3 s,
    or ``window(config)``), whose runner is closed after; every trial ok."""
    runner = ScriptRunner(SCRIPTS / script, args or [])
    limits = limits or Limits(timeout_s=60, startup_s=30, hang_s=5)
    window = window or (lambda c: window_for(c or Config(1), window_s=0.3))
    try:
        results = [runner.run(c, window=window(c), limits=limits) for c in configs]
    finally:
        runner.close()
    assert all(r.ok for r in results), [r.failure for r in results]
    return runner, results


def _swapped_in_one_launch(script: str, out: Path, epochs: int = 1000) -> list[TrialResult]:
    """The script's own setting, then each of SWAPPED, in one launch of ``script`` (which writes
    its epochs to ``out``); every trial ok."""
    runner, results = _in_turn(script, [None, *SWAPPED], [str(out), str(epochs)])
    assert runner.n_launches == 1
    return results[1:]


def test_many_settings_run_in_one_process_and_each_epoch_holds_every_sample_once(
    tmp_path: Path,
) -> None:
    """counts.py records what its loop receives per epoch; the settings change batch size and
    workers under it, in one process."""
    out = tmp_path / "counts.jsonl"
    results = _swapped_in_one_launch("counts.py", out)
    assert [r.config for r in results] == SWAPPED
    assert [r.epoch_samples for r in results] == [600] * 4
    # each swapped setting says what its own loader ran with, and the search checked it
    ran = [r.extra["ran"] for r in results]
    assert [x["workers_started"] for x in ran] == [c.num_workers for c in SWAPPED]
    assert [max(x["batch_lengths"]) for x in ran] == [c.batch_size for c in SWAPPED]
    assert [x["settings"] for x in ran] == [c.loader_kwargs() for c in SWAPPED]
    assert len({x["pid"] for x in ran}) == 1
    assert results[1].resources is not None and results[3].resources is not None
    assert (results[1].resources.n_workers, results[3].resources.n_workers) == (0, 3)
    epochs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(epochs) >= 3  # the settings' windows spanned several epochs
    for epoch in epochs:
        assert sorted(epoch["samples"]) == list(range(600)), epoch["epoch"]


def test_a_loop_that_catches_a_bad_records_error_goes_on_through_every_setting(
    tmp_path: Path,
) -> None:
    """bad_records.py catches the error a bad record raises around ``next()`` and goes on: the
    settings swapped under it measure as usual, and each epoch holds every sample but the bad
    batches'. Before, the epoch ended at the first error, and the trials with workers failed as
    "a worker or the step hung" (a new user's search then recommended no workers)."""
    out = tmp_path / "counts.jsonl"
    _swapped_in_one_launch("bad_records.py", out, epochs=400)
    epochs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(epochs) >= 3
    for epoch in epochs:
        assert len(epoch["samples"]) == len(set(epoch["samples"])), epoch["epoch"]
        assert 1 <= epoch["raised"] <= 4 and len(epoch["samples"]) >= 480 - 4 * 64, epoch


def test_the_next_settings_take_over_the_first_epoch_right_after_the_scripts_own(
    tmp_path: Path,
) -> None:
    """The first trial measures the script's own loader as it runs (2 persistent workers, 8
    batches in flight); the next setting takes over the rest of that same epoch once the batches
    in flight are handed over, rather than after the epoch's end (which may be minutes away). The
    epoch still holds every sample once, and the script's own workers are gone."""
    out = tmp_path / "counts.jsonl"
    runner = ScriptRunner(SCRIPTS / "counts.py", [str(out), "2", "2", "4000"])
    limits = Limits(timeout_s=60, startup_s=30, hang_s=5)
    swapped = Config(8, 1, 2)
    try:
        base = runner.run(None, window=window_for(Config(16, 2), window_s=0.2), limits=limits)
        result = runner.run(swapped, window=window_for(swapped, window_s=0.2), limits=limits)
        for _ in range(20):  # more settings, until the loop has finished its first epoch
            if out.exists():
                break
            runner.run(Config(32, 0), window=window_for(Config(32, 0), window_s=0.2), limits=limits)
        assert runner.n_launches == 1
    finally:
        runner.close()
    assert base.ok and result.ok, (base.failure, result.failure)
    assert result.resources is not None and result.resources.n_workers == 1  # not 1 + 2 idle
    epochs = [json.loads(line) for line in out.read_text().splitlines()]
    first = epochs[0]
    assert sorted(first["samples"]) == list(range(4000))
    assert 8 in first["lengths"], "the swapped setting waited for the next epoch"
    at = first["lengths"].index(8)
    assert set(first["lengths"][:at]) == {16}


def test_a_replay_counts_the_samples_of_a_batch_that_does_not_show_them() -> None:
    """The replay hands one batch over again and again: its samples are those the batch
    sampler put in it (16), not what the collate's object shows (nothing: it was counted 1, and
    the step's rate read 16 times too low)."""
    runner = ScriptRunner(SCRIPTS / "object_batches.py", [])
    limits = Limits(timeout_s=60, startup_s=30, hang_s=5)
    try:
        results = [
            runner.run(c, window=window_for(c or Config(16), window_s=0.3), limits=limits, phase=p)
            for c, p in [(None, "baseline"), (Config(16), "replay"), (Config(32), "search")]
        ]
    finally:
        runner.close()
    assert all(r.ok for r in results), [r.failure for r in results]
    for result, size in zip(results, (16, 16, 32), strict=True):
        m = result.measurement
        assert m is not None, result.phase
        # (a setting swapped in mid-epoch may end the epoch on a short batch)
        assert size * (m.n_batches - 1) < m.n_samples <= size * m.n_batches, (result.phase, m)


def test_a_script_that_sized_a_schedule_by_its_loader_never_gets_more_batches_per_epoch(
    tmp_path: Path,
) -> None:
    """one_cycle.py sizes a OneCycleLR by ``epochs * len(loader)`` (30 batches of 16): a smaller
    batch size, or the replay's one batch handed over again and again, must not give an epoch
    more batches, or the scheduler raises at the step past its last. Before, the replay ended
    the search with "fix the script" (the scheduler's ValueError)."""
    out = tmp_path / "epochs.jsonl"
    # 2000 epochs of 30 batches: the replay's tiny step ran out 200 of them (6,000 batches) in
    # its 0.3 s window here, and the search trials then needed a launch of their own.
    runner = ScriptRunner(SCRIPTS / "one_cycle.py", [str(out), "2000"])
    limits = Limits(timeout_s=60, startup_s=30, hang_s=5)
    trials = [
        (None, "baseline"),
        (Config(16), "replay"),
        (Config(4), "search"),
        (Config(4, 2, 2), "search"),
        (Config(8, 1, 2, persistent_workers=True), "search"),
        (Config(64, 1, 2), "search"),
    ]
    try:
        results = [
            runner.run(c, window=window_for(c or Config(16), window_s=0.3), limits=limits, phase=p)
            for c, p in trials
        ]
        launches = runner.n_launches
    finally:
        runner.close()
    assert all(r.ok for r in results), [r.failure for r in results]
    assert launches == 1
    epochs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(epochs) >= 3
    assert all(e["batches"] <= 30 for e in epochs), [e["batches"] for e in epochs]
    # at batch size 4 an epoch holds 120 batches: it ended after 30
    assert any(len(e["samples"]) < 480 for e in epochs), "no epoch ran at a smaller batch size"


@pytest.mark.parametrize(
    ("config", "batches", "window_s", "whole_epoch", "enough"),
    [
        (Config(16), 6000, 0.3, False, True),  # a replay that ran the script out: its figure
        (Config(16), 3, 0.3, False, False),  # fewer batches than a window's minimum
        (Config(16), 600, 0.01, False, False),  # a sliver of the window's time
        (Config(16, 2, 2), 6000, 0.3, False, False),  # workers: the buffer's burst
        (None, 6000, 0.3, False, False),  # the script's own: its workers unknown
        (Config(16), 6000, 0.3, True, False),  # an epoch cut short is no epoch
    ],
)
def test_a_window_cut_short_is_kept_only_without_workers_and_with_enough_of_it(
    config: Config | None, batches: int, window_s: float, whole_epoch: bool, enough: bool
) -> None:
    window = WindowSpec(warmup_batches=0 if whole_epoch else 2, window_s=0.3)
    window = dataclasses.replace(window, whole_epoch=whole_epoch)
    m = Measurement(
        samples_per_s=1000.0,
        sub_window_samples_per_s=[1000.0],
        blocked_fraction=0.0,
        first_batch_s=0.0,
        warmup_s=0.0,
        window_s=window_s,
        n_samples=16 * batches,
        n_batches=batches,
        complete=False,
    )
    assert _enough_without_workers(config, window, m) is enough


def test_a_window_the_scripts_end_cut_short_is_measured_again_in_a_fresh_launch(
    tmp_path: Path,
) -> None:
    """counts.py runs 4 epochs of 600 samples: settings measured one after the other in its
    launch run it out mid-window. Such a window (the workers' first batches, a burst) is not
    the setting's figure: the setting runs again in a fresh launch, whose window is full."""
    runner = ScriptRunner(SCRIPTS / "counts.py", [str(tmp_path / "c.jsonl"), "4"])
    limits = Limits(timeout_s=60, startup_s=30, hang_s=5)
    configs = [None, *[Config(16, w, 2) for w in (1, 2, 3, 1, 2, 3, 1, 2, 3)]]
    try:
        results = [
            runner.run(c, window=window_for(c or Config(16), window_s=0.3), limits=limits)
            for c in configs
        ]
        launches = runner.n_launches
    finally:
        runner.close()
    assert all(r.ok for r in results), [r.failure for r in results]
    assert launches >= 2, "the script never ran out: the test tests nothing"
    # (a fresh launch holds several windows: only a launch that ran others before runs out)
    partial = [i for i, r in enumerate(results) if not r.measurement.complete]  # type: ignore[union-attr]
    assert not partial, partial
    for r in results:  # a setting run again says where it ran both times: its batches are there
        ran = r.extra["ran"]
        assert set(r.extra["pids"]) == {ran["pid"], *ran.get("cut_short_pids", [])}, r.extra


def test_a_whole_epoch_trial_that_the_last_epoch_cannot_hold_starts_in_a_fresh_launch(
    tmp_path: Path,
) -> None:
    """counts.py runs 3 epochs of 38 batches. A whole-epoch trial holds an epoch's batches, so
    one that would begin in a launch's last epoch cannot end before the script does. The first
    launch runs one out (cut at the script's end, measured again in a fresh launch) and tells
    how many epochs a launch holds; after that, such a trial starts in a fresh launch at once,
    and no other window is cut."""
    runner = ScriptRunner(SCRIPTS / "counts.py", [str(tmp_path / "c.jsonl"), "3"])
    limits = Limits(timeout_s=60, startup_s=30, hang_s=5)
    configs = [Config(16, w, 2) for w in (1, 2, 1, 2, 1, 2, 1, 2)]
    try:
        results = [runner.run(None, window=window_for(Config(16), window_s=0.3), limits=limits)]
        results += [
            runner.run(c, window=window_for(c, window_s=30.0, whole_epoch=True), limits=limits)
            for c in configs
        ]
        launches, launch_epochs = runner.n_launches, runner.launch_epochs
    finally:
        runner.close()
    assert all(r.ok for r in results), [r.failure for r in results]
    assert launch_epochs == 3
    assert launches >= 3, "no launch ran out of epochs: the test tests nothing"
    for r in results[1:]:
        m = r.measurement
        assert m is not None and m.whole_epoch and m.complete and m.n_batches == 38
    cut = [i for i, r in enumerate(results) if r.extra["ran"].get("cut_short_pids")]
    assert len(cut) == 1, cut  # the first launch's, before a launch's epochs were known


def test_a_script_that_raises_after_its_training_loop_is_a_launch_that_ended() -> None:
    """raise_after.py trains 2 epochs, then raises. A new user's search of such a script
    reached the raise with a trial under way, stopped with "fix the script" and wrote no
    file: every trial was lost. Code after the training runs once a run is over; the trial
    under way is measured again in a fresh launch, as when a script ends. The same raise
    inside the loop is the script's bug, as before."""
    limits = Limits(timeout_s=60, startup_s=30, hang_s=5)
    runner = ScriptRunner(SCRIPTS / "raise_after.py", ["2"])
    try:
        results = [
            runner.run(c, window=window_for(c or Config(16), window_s=0.3), limits=limits)
            for c in [None, *[Config(16, w, 2) for w in (1, 2, 1, 2, 1, 2)]]
        ]
        launches = runner.n_launches
    finally:
        runner.close()
    assert all(r.ok for r in results), [r.failure for r in results]
    assert launches >= 2, "the script never reached its raise: the test tests nothing"
    runner = ScriptRunner(SCRIPTS / "raise_after.py", ["3", "mid"])
    try:
        results = [
            runner.run(c, window=window_for(c or Config(16), window_s=0.3), limits=limits)
            for c in [None, *[Config(16, w, 2) for w in (1, 2, 1, 2, 1, 2)]]
        ]
    finally:
        runner.close()
    bugs = [r.failure for r in results if r.failure is not None]
    assert bugs and bugs[0].kind == FailureKind.SCRIPT_ERROR and bugs[0].user_bug, bugs


def test_a_worker_killed_mid_sequence_is_recorded_and_the_rest_runs_in_a_fresh_process() -> None:
    runner = ScriptRunner(SCRIPTS / "killer.py")  # kills a worker of a 3-worker loader
    limits = Limits(timeout_s=60, startup_s=30, hang_s=5)
    configs = [None, Config(16, 1, 2), Config(16, 3, 2), Config(16, 2, 2), Config(16, 0)]
    try:
        results = []
        for c in configs:
            results.append(
                runner.run(c, window=window_for(c or Config(1), window_s=0.3), limits=limits)
            )
        assert runner.n_launches == 2
    finally:
        runner.close()
    assert [r.error for r in results] == [None, None, "worker_killed", None, None]
    assert all(r.ok for i, r in enumerate(results) if i != 2)
    assert results[2].failure is not None and "killed" in results[2].failure.message


def test_a_runner_takes_its_state_back_only_for_the_script_as_it_was(tmp_path: Path) -> None:
    """What a resumed search restores instead of running the baseline again (issue 14): the
    loader the first trial found, by key, so the next trial needs no baseline first; a script
    edited since may have moved that loader, and a module of its own it imports (the dataset
    beside it) may have changed what a trial measures: neither gets any of it."""
    script = tmp_path / "train.py"
    script.write_text((SCRIPTS / "train_val.py").read_text())
    (tmp_path / "_data.py").write_text((SCRIPTS / "_data.py").read_text())
    window = window_for(Config(16), window_s=0.3)
    limits = Limits(timeout_s=60, startup_s=30, hang_s=5)
    first = ScriptRunner(script)
    try:
        assert first.run(None, window=window, limits=limits, phase="baseline").ok
        state = json.loads(json.dumps(first.state()))  # as a study keeps it
    finally:
        first.close()
    again = ScriptRunner(script)
    try:
        assert again.restore(state)
        assert again.loader_info == first.loader_info and again.target_note == first.target_note
        result = again.run(Config(16, 2, 2), window=window, limits=limits, phase="probe")
        assert result.ok, result.failure
        assert result.extra["loader"]["index"] == 2  # the loader the baseline found
    finally:
        again.close()

    def restored() -> bool:
        runner = ScriptRunner(script)
        try:
            taken = runner.restore(state)
            assert taken == (runner.loader_info is not None)
            return taken
        finally:
            runner.close()

    data = tmp_path / "_data.py"
    assert str(data.resolve()) in state["loader"]["sources"]
    data.write_text(data.read_text() + "# edited\n")
    assert not restored()
    data.write_text(data.read_text().removesuffix("# edited\n"))
    assert restored()  # as it was
    script.write_text(script.read_text() + "# edited\n")
    assert not restored()


def test_a_batch_sampler_gets_each_batch_size_in_a_fresh_process() -> None:
    """A hot swap keeps a batch sampler's batches: a trial at another batch size than the
    process's loader runs gets a fresh process, whose loader is built with a batch sampler of
    that size (it was recorded as ``not_applied`` before)."""
    configs = [None, Config(32, 1, 2), Config(32, 0), Config(16, 1, 2)]
    runner, results = _in_turn("batch_sampler.py", configs)
    assert runner.n_launches == 3  # 16, then 32 twice in one process, then 16 again
    ran = [r.extra["ran"] for r in results]
    assert [max(x["batch_lengths"]) for x in ran] == [16, 32, 32, 16]
    assert ran[1]["pid"] == ran[2]["pid"] != ran[3]["pid"]


def test_a_batch_sampler_without_a_batch_size_tells_the_epochs_samples_by_its_batches() -> None:
    """A bucketing batch sampler of the script's own (a length, no ``batch_size``): the
    epoch's samples come from its batches, in the baseline (the loader's own iterator) and in
    the swapped settings after it, so the search tries persistent workers and ranks by the
    per-epoch rate. They were unknown, and persistent workers never tried."""
    configs = [None, Config(1, 1, 2, persistent_workers=True), Config(1, 0)]
    runner, results = _in_turn("bucket_sampler.py", configs)
    assert runner.n_launches == 1
    assert runner.epoch_samples == 1000
    assert all(r.epoch_samples == 1000 for r in results), [r.epoch_samples for r in results]


def test_a_loader_without_automatic_batching_keeps_its_batches_in_every_trial() -> None:
    """``batch_size=None``: the dataset's items are the batches. A trial applies its workers
    and prefetch, never a batch size (settings say 1: re-batched by it, every batch would
    become a batch of one, which the script's shape check rejects), and the search is told the
    batch size is not its to change."""
    runner, results = _in_turn("no_batching.py", [None, Config(1, 2, 2), Config(1, 0)])
    assert runner.batch_size_fixed == NO_BATCHING
    ran = [r.extra["ran"] for r in results]
    assert [x["settings"]["num_workers"] for x in ran] == [0, 2, 0]
    assert all(set(x["batch_lengths"]) == {16} for x in ran)  # counted as 16 samples each
    assert all(r.extra.get("batch_size_fixed") for r in results[1:])  # labelled bs=sampler


@pytest.mark.parametrize(
    ("args", "epoch_samples"),
    [(["10"], 160), (["0"], 1600), (["10", "peek"], 160), (["0", "peek"], 1600)],
)
def test_an_epoch_the_loop_ends_early_is_as_long_as_the_loop_makes_it(
    args: list[str], epoch_samples: int
) -> None:
    """A loop that breaks after 10 of the loader's 100 batches starts the workers again every
    160 samples, not every 1,600: the trial's epoch (which the per-epoch rate charges one
    start-up to) is what the script takes of it, once two epochs are over. A single batch
    peeked at before the loop (``next(iter(loader))``) is not taken for the loop's epochs."""
    runner = ScriptRunner(SCRIPTS / "short_epochs.py", args, loader="short_epochs.py:12")
    limits = Limits(timeout_s=60, startup_s=30, hang_s=5)
    try:
        result = runner.run(
            Config(16, 1, 2), window=window_for(Config(16), window_s=0.5), limits=limits
        )
    finally:
        runner.close()
    assert result.ok, result.failure
    assert result.epoch_samples == runner.epoch_samples == epoch_samples


def test_a_loader_iterated_too_seldom_to_be_measured_says_so() -> None:
    """rare_val.py's validation loader (#1: 4 batches, then a training epoch of 4 s): its epoch
    ends before the window does and it rests past the watchdog. That is said, and stops the
    search (every setting would do the same), instead of "no progress: a worker hung"."""
    runner = ScriptRunner(SCRIPTS / "rare_val.py", loader="rare_val.py:11")
    limits = Limits(timeout_s=60, startup_s=30, hang_s=2)
    try:
        result = runner.run(Config(64), window=window_for(Config(64), window_s=1.0), limits=limits)
    finally:
        runner.close()
    assert result.error == "timeout"
    assert result.failure is not None and result.failure.user_bug
    assert "DataLoader #1 at " in result.failure.message
    assert "went unused for 2 s after one of its epochs" in result.failure.message
    assert "leave out --loader" in result.failure.advice


def test_a_loader_resting_briefly_between_its_epochs_is_measured_in_them() -> None:
    """With training epochs of 0.2 s, the same validation loader fills its window over a few
    of its epochs: the rests between them are left out of it."""
    runner = ScriptRunner(SCRIPTS / "rare_val.py", ["200"], loader="rare_val.py:11")
    limits = Limits(timeout_s=60, startup_s=30, hang_s=2)
    try:
        result = runner.run(Config(64), window=window_for(Config(64), window_s=1.0), limits=limits)
    finally:
        runner.close()
    assert result.ok, result.failure
    assert result.measurement is not None and result.measurement.n_samples > 256  # epochs


def test_a_window_filled_before_the_optimizer_chose_its_loader_is_measured_again() -> None:
    """accumulate.py steps once every 16 batches: the window of the loader (then a mere
    candidate) fills before its second step says it feeds the optimizer. It was dropped then,
    and its choice left the trial with no meter: "no progress" (seen with Accelerate's gradient
    accumulation). It is measured again from there."""
    result = run("accumulate.py", None, phase="baseline", window_s=0.3)
    assert result.ok, result.failure
    assert result.extra["loader"]["chosen_by"] == "the optimizer"
    assert result.measurement is not None and result.measurement.n_batches > 0


def test_a_loader_created_again_is_seen_by_a_hot_swapped_trial(tmp_path: Path) -> None:
    """A new DataLoader every epoch, whose epochs outlast the first trial's window: the first
    trial ends inside the first loader's epoch, and the next ones are hot-swapped in the same
    launch. A hot-swapped trial said it had served one loader however many it had, so the
    search never learnt it (and went on searching persistent workers, which die with each
    loader)."""
    from loadertune.trials.contract import TrialRequest

    script = tmp_path / "new_loader_every_epoch.py"
    script.write_text(
        "import sys, torch\n"
        f"sys.path.insert(0, {str(SCRIPTS)!r})\n"
        "from torch.utils.data import DataLoader\n"
        "from _data import Latency\n"
        "dataset = Latency(n=800, sleep_s=0.0005)\n"
        "model = torch.nn.Linear(8, 3)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        "for epoch in range(6):\n"
        "    for x, y in DataLoader(dataset, batch_size=16, shuffle=True):\n"
        "        loss = torch.nn.functional.cross_entropy(model(x), y)\n"
        "        opt.zero_grad()\n"
        "        loss.backward()\n"
        "        opt.step()\n"
    )
    runner = ScriptRunner(script)
    limits = Limits(timeout_s=60, startup_s=30, hang_s=5)
    two = Config(16, 2, 2)
    try:
        first, *swapped = runner.run_many(
            [
                (None, TrialRequest(window_for(Config(16), window_s=0.1), limits)),
                (two, TrialRequest(window_for(two, window_s=1.0, whole_epoch=True), limits)),
            ]
        )
    finally:
        runner.close()
    assert first.ok and first.extra["ran"]["loaders"] == 1, first.extra.get("ran")
    assert swapped and swapped[0].ok, swapped
    assert swapped[0].extra["ran"]["loaders"] >= 2 and runner.loader_recreated
