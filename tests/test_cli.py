"""`loadertune search/run/show` end to end, on small real scripts in tests/scripts/."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from loadertune import hardware
from loadertune.results import store
from loadertune.trials import leftovers

# The command line in subprocesses, most with a real search: the e2e tier.
pytestmark = pytest.mark.e2e

SCRIPTS = Path(__file__).parent / "scripts"
FAST = ["--budget", "12", "--trials", "4", "--window", "0.3", "--fresh"]
TRIAL_PHASES = ("baseline", "probe", "replay", "search", "confirm")  # a trial line's first word


def loadertune(
    *args: str, cwd: Path | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loadertune", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
    )


def search(
    script: str, tmp_path: Path, *extra: str, script_args: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    out = tmp_path / "rec.json"
    args = ["search", str(SCRIPTS / script), "--out", str(out), "--json", *FAST, *extra]
    if script_args:
        args += ["--", *script_args]
    return loadertune(*args)


def summary(proc: subprocess.CompletedProcess[str]) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.slow
@pytest.mark.parametrize("script", ["style_alias.py", "style_as.py", "style_subclass.py"])
def test_every_import_style_is_tuned(script: str, tmp_path: Path) -> None:
    data = summary(search(script, tmp_path))
    assert data["loader_kwargs"]["num_workers"] >= 0
    assert data["workload"]["loader_index"] == 1
    assert data["workload"]["call_site"].split(":")[0].endswith(script)
    phases = [t["phase"] for t in data["trials"]]
    assert phases[0] == "baseline" and "replay" in phases
    assert data["baseline"]["loader_kwargs"]["batch_size"] == 16  # the script's own, found
    assert (tmp_path / "rec.json").exists()


@pytest.mark.slow
def test_script_arguments_pass_through(tmp_path: Path) -> None:
    """style_from.py exits unless it gets exactly these arguments."""
    data = summary(search("style_from.py", tmp_path, script_args=("--epochs", "3", "--lr", "0.1")))
    assert data["samples_per_s"] > 0


@pytest.mark.slow
def test_the_first_loader_iterated_is_tuned(tmp_path: Path) -> None:
    """train_val.py creates the validation loader first and iterates the training one first."""
    lines = (SCRIPTS / "train_val.py").read_text().splitlines()
    line = 1 + next(i for i, text in enumerate(lines) if text.startswith("train ="))
    data = summary(search("train_val.py", tmp_path))
    assert data["workload"]["loader_index"] == 2
    assert data["workload"]["call_site"].endswith(f"train_val.py:{line}")
    assert data["baseline"]["loader_kwargs"]["num_workers"] == 1
    by_site = summary(search("train_val.py", tmp_path, "--loader", f"train_val.py:{line}"))
    assert by_site["workload"]["loader_index"] == 2


@pytest.mark.slow
def test_killed_workers_are_recorded_and_the_search_goes_on(tmp_path: Path) -> None:
    # Each script trial starts a Python process with torch: on a loaded machine 12 s may hold
    # only the baseline and the probe, so this one gets more time (click keeps the last value).
    data = summary(
        search("killer.py", tmp_path, "--max-workers", "4", "--trials", "8", "--budget", "40")
    )
    errors = {t["error"] for t in data["trials"]}
    killed = [t for t in data["trials"] if t["error"] in ("worker_killed", "worker_crashed")]
    assert killed, errors
    assert all(t["params"]["num_workers"] >= 3 for t in killed)
    assert data["loader_kwargs"]["num_workers"] < 3


@pytest.mark.slow
def test_a_script_that_ends_early_gives_a_low_confidence_result(tmp_path: Path) -> None:
    data = summary(search("short.py", tmp_path, "--window", "5", "--trials", "3"))
    assert data["trials"][0]["low_confidence"] is True


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "extra", "message"),
    [
        ("crash_early.py", (), "learning_rate"),
        # printed as it is, never parsed as rich markup (a MarkupError crashed the CLI)
        ("markup_error.py", (), "[/__w/pytorch/third_party/gloo/pair.cc:553] Connection closed"),
        ("dataset_bug.py", (), "cannot decode sample 3"),
        ("no_loader.py", (), "without iterating"),
        # issue 14: not "ended without iterating the DataLoader"
        ("short.py", ("--loader", "7"), "created only 1 DataLoader, so there is no DataLoader #7"),
        ("short.py", ("--loader", "short.py:99"), "so there is no DataLoader at short.py:99"),
        (
            "never_iterates.py",
            ("--startup-timeout", "3"),
            "did not iterate a DataLoader within 3 s",
        ),
    ],
)
def test_script_failures_stop_at_once_with_the_cause(
    script: str, extra: tuple[str, ...], message: str, tmp_path: Path
) -> None:
    proc = search(script, tmp_path, *extra)
    assert proc.returncode == 1
    assert message in proc.stderr
    error = json.loads(proc.stdout)["error"]  # --json: the failure, for a program reading it
    assert message in error["message"] and error["type"].endswith("Error"), error
    if script in ("no_loader.py", "never_iterates.py"):  # no loader seen: its settings unknown
        assert "bs=1 " not in proc.stderr and "the script's own" in proc.stderr, proc.stderr
    # One trial, not the whole budget: counted from the trial lines printed, not timed (a
    # loaded machine took 25 s for this one trial, beside a CI run).
    trials = [line for line in proc.stderr.splitlines() if line.split(" ", 1)[0] in TRIAL_PHASES]
    assert len(trials) == 1, proc.stderr
    assert not (tmp_path / "rec.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["loop", "next"])
def test_a_loader_that_yields_no_batches_is_named(mode: str, tmp_path: Path) -> None:
    """drop_last=True with fewer samples than a batch: said so, not "the script ended before its
    first batch" nor "the script raised StopIteration" with loadertune's traceback (issue 14)."""
    proc = search("no_batches.py", tmp_path, script_args=(mode, "16"))
    assert proc.returncode == 1
    assert "the loader yielded no batches: drop_last=True with 10 samples < batch_size 16" in (
        proc.stderr
    )
    assert "drop_last=False" in proc.stderr  # what to do
    assert "StopIteration" not in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "rec.json").exists()


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["search", "no/such/train.py"], 1, "does not exist"),
        (["search", "tests/scripts/short.py", "--batch-sizes", "0,32"], 2, "positive integers"),
        (["search", "tests/scripts/short.py", "--budget", "-5"], 2, "--budget"),
        (["search", "tests/scripts/short.py", "--budget", "0"], 2, "--budget"),
        (
            ["search", "tests/scripts/short.py", "--max-workers", "100000"],
            1,
            "more than anything sensible",
        ),
        (
            ["search", "tests/scripts/short.py", "--loader", "x"],
            2,
            "N (order of creation) or FILE:LINE",
        ),
        (
            ["search", "tests/scripts/short.py", "--storage", "nosuchdb://x"],
            1,
            "not a storage Optuna can open",
        ),
    ],
)
def test_bad_input_is_a_clear_error(args: list[str], code: int, message: str) -> None:
    proc = loadertune(*args, cwd=Path(__file__).parent.parent)
    assert proc.returncode == code, proc.stderr
    assert message in proc.stderr


def test_a_file_that_is_not_python_is_refused(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("these are my notes: {\n")
    proc = loadertune("search", str(notes))
    assert proc.returncode == 1 and "is not valid Python" in proc.stderr


def test_a_corrupt_out_file_is_reported_before_searching_and_kept(tmp_path: Path) -> None:
    out = tmp_path / "rec.json"
    out.write_text("{not json")
    proc = loadertune("search", str(SCRIPTS / "short.py"), "--out", str(out))
    assert proc.returncode == 1 and "is not valid JSON" in proc.stderr and str(out) in proc.stderr
    assert out.read_text() == "{not json"


def _entry(num_workers: int) -> dict:
    return {
        "loader_kwargs": {
            "batch_size": 16,
            "num_workers": num_workers,
            "prefetch_factor": 2,
            "pin_memory": False,
            "persistent_workers": False,
        },
        "workload": {"loader_index": 1, "call_site": "short.py:7"},
        "samples_per_s": 123.0,
    }


def test_run_applies_this_machines_settings(tmp_path: Path) -> None:
    out = tmp_path / "rec.json"
    store.save_entry(out, hardware.current_key(), _entry(2))
    proc = loadertune("run", str(SCRIPTS / "short.py"), "--file", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "DataLoader #1 at" in proc.stderr and "bs=16 w=2 pf=2" in proc.stderr


def test_run_without_an_entry_runs_unchanged_and_says_why(tmp_path: Path) -> None:
    out = tmp_path / "rec.json"
    store.save_entry(out, "some-other-machine", _entry(2))
    proc = loadertune("run", str(SCRIPTS / "short.py"), "--file", str(out))
    assert proc.returncode == 0
    assert "running without changes" in proc.stderr and "some-other-machine" in proc.stderr


def test_run_tune_with_nproc_per_node_is_a_usage_error(tmp_path: Path) -> None:
    out = tmp_path / "rec.json"
    proc = loadertune(
        "run", "--tune", "--nproc-per-node", "2", str(SCRIPTS / "short.py"), "--file", str(out)
    )
    assert proc.returncode == 2, proc.stderr
    assert "--tune runs in one training process" in proc.stderr
    assert "loadertune search --nproc-per-node N SCRIPT" in proc.stderr
    assert not out.exists()


@pytest.mark.parametrize("command", ["search", "run"])
def test_a_scripts_option_before_the_double_dash_says_where_it_goes(command: str) -> None:
    proc = loadertune(command, str(SCRIPTS / "short.py"), "--epochs", "1")
    assert proc.returncode == 2
    assert "No such option '--epochs': the script's own arguments go after `--`" in proc.stderr
    assert f"(loadertune {command} [OPTIONS] SCRIPT -- ARGS)" in proc.stderr


def test_run_returns_the_scripts_exit_status(tmp_path: Path) -> None:
    script = tmp_path / "exit3.py"
    script.write_text("raise SystemExit(3)\n")
    assert loadertune("run", str(script), "--file", str(tmp_path / "none.json")).returncode == 3


def test_run_shows_a_scripts_exception_as_python_does(tmp_path: Path) -> None:
    """A new user's `run` buried their traceback under about 20 frames of loadertune, click
    and runpy; it now starts at the script's own frame, and the exit status is 1."""
    proc = loadertune("run", str(SCRIPTS / "crash_early.py"), "--file", str(tmp_path / "n.json"))
    assert proc.returncode == 1
    tb = proc.stderr[proc.stderr.index("Traceback (most recent call last):") :]
    first = tb.splitlines()[1]
    assert "crash_early.py" in first and "line 5" in first, tb
    assert "click" not in tb and "loadertune" not in tb, tb
    assert tb.rstrip().endswith("KeyError: 'learning_rate'"), tb


def test_show_marks_this_machine(tmp_path: Path) -> None:
    out = tmp_path / "rec.json"
    store.save_entry(out, hardware.current_key(), _entry(2))
    store.save_entry(out, "another-box", _entry(8))
    proc = loadertune("show", str(out))
    assert proc.returncode == 0
    assert "this machine" in proc.stdout and "another-box" in proc.stdout
    data = json.loads(loadertune("show", str(out), "--json").stdout)
    assert data["this_machine"] == hardware.current_key()


@pytest.mark.parametrize(
    ("verdict", "words"),
    [
        ({"within_noise": False}, ")"),
        ({"within_noise": True}, ", within the noise)"),
        ({"within_noise": True, "unconfirmed": True}, ", not confirmed)"),
    ],
)
def test_show_says_when_the_speedup_is_within_the_noise(tmp_path: Path, verdict, words) -> None:
    """A speed-up the search itself called within the noise, or could not compare, is not
    shown as a plain figure."""
    out = tmp_path / "rec.json"
    store.save_entry(out, hardware.current_key(), _entry(2) | {"speedup": 1.34, **verdict})
    proc = loadertune("show", str(out))
    assert proc.returncode == 0 and f"(1.34x over baseline{words}" in proc.stdout, proc.stdout


@pytest.mark.parametrize(
    ("run_ended", "words"),
    [
        (False, "partial: an interrupted search"),
        (True, "partial: the training run ended before its tuning did"),
    ],
)
def test_show_says_why_an_entry_is_partial(tmp_path: Path, run_ended: bool, words: str) -> None:
    """A best-so-far saved by Ctrl-C is an interrupted search; one saved by `run --tune` whose
    training ended before its tuning was not interrupted, and is not called so."""
    from loadertune.api import saved
    from loadertune.errors import SearchInterrupted

    out = tmp_path / "rec.json"
    best = {"loader_kwargs": {"batch_size": 16, "num_workers": 1}, "samples_per_s": 100.0}
    stop = SearchInterrupted("stop", study_name="s", storage="mem", n_complete=2, best=best)
    stop.workload = {"kind": "script", "script": "train.py", "call_site": "train.py:9"}
    assert saved.save_partial(out, stop, run_ended=run_ended) == str(out)
    proc = loadertune("show", str(out))
    assert proc.returncode == 0 and words in proc.stdout, proc.stdout


def test_show_reports_a_damaged_entry_in_one_line_and_lists_the_rest(tmp_path: Path) -> None:
    """Issue 14: no traceback; each damaged entry is one line saying what is wrong. An old
    (version 1) file: one entry per machine."""
    out = tmp_path / "rec.json"
    good = {**_entry(2), "hardware": {"description": "[bold]markup[/bold] in [red]text"}}
    machines = {
        "kwargs-a-list": {**_entry(2), "loader_kwargs": [1, 2]},
        "not-an-object": [1, 2],
        "rate-a-string": {**_entry(2), "samples_per_s": "fast"},
        "bad-setting": {**_entry(2), "loader_kwargs": {"batch_size": "x"}},
        "good-box": good,
    }
    out.write_text(json.dumps({"schema": store.SCHEMA, "schema_version": 1, "machines": machines}))
    proc = loadertune("show", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    damaged = [line for line in lines if "damaged:" in line]
    assert len(damaged) == 4, proc.stdout
    for reason in (
        'the entry has "loader_kwargs" that is a list [1, 2], not a mapping',
        "the entry is a list [1, 2], not an object",
        "the entry has \"samples_per_s\" that is a str 'fast', not a number",
        "batch_size must be a positive int",
    ):
        assert sum(reason in line for line in damaged) == 1, reason
    at = lines.index("good-box")
    assert lines[at + 1].strip() == "[bold]markup[/bold] in [red]text"  # printed as it is
    assert "bs=16 w=2 pf=2" in lines[at + 3] and "123 samples/s" in lines[at + 3]


def test_show_reports_a_damaged_machine_record_in_one_line(tmp_path: Path) -> None:
    out = tmp_path / "rec.json"
    store.save_entry(out, "good-box", _entry(2))
    doc = json.loads(out.read_text())
    doc["machines"]["bad-box"] = ["not", "a", "record"]
    doc["machines"]["good-box"]["workloads"]["dataset x.Y"] = "not an entry"
    out.write_text(json.dumps(doc))
    proc = loadertune("show", str(out))
    assert proc.returncode == 0 and "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    (bad,) = [line for line in proc.stdout.splitlines() if line.startswith("bad-box")]
    assert 'damaged: its record is a list without a "workloads" object' in bad
    assert "dataset x.Y  damaged: the entry is a str 'not an entry', not an object" in proc.stdout
    assert "bs=16 w=2 pf=2" in proc.stdout


def test_help_on_every_command() -> None:
    for cmd in ([], ["search"], ["run"], ["show"], ["hardware"]):
        proc = loadertune(*cmd, "--help")
        assert proc.returncode == 0 and "Usage:" in proc.stdout


def _start_and_wait(
    args: list[str],
    study_name: str,
    n_complete: int = 3,
    preexec_fn: Callable[[], object] | None = None,
) -> subprocess.Popen[str]:
    """Start `loadertune ARGS` and return once its study holds ``n_complete`` finished trials
    (complete or pruned: a search whose every exploration trial is pruned, a loader whose
    workers only slow it, holds none complete until its confirmation, at its very end)."""
    import optuna

    proc = subprocess.Popen(
        [sys.executable, "-m", "loadertune", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=preexec_fn,
    )
    storage = f"sqlite:///{Path(os.environ['LOADERTUNE_CACHE_DIR']) / 'studies.db'}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)  # the signal must come while the search runs: look often
        try:
            study = optuna.load_study(study_name=study_name, storage=storage)
        except KeyError:
            continue
        if sum(t.state.name in ("COMPLETE", "PRUNED") for t in study.trials) >= n_complete:
            break
    return proc


def _communicate_or_dump(proc: subprocess.Popen[str], timeout: float) -> str:
    """The CLI's stderr once it exits; past ``timeout``, its threads' stacks (SIGUSR1 makes it
    print them) in the failure message, so a hang says where it is."""
    try:
        return proc.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)
        time.sleep(2)
        proc.kill()
        err = proc.communicate()[1]
        raise AssertionError(f"the CLI did not exit within {timeout} s:\n{err[-6000:]}") from None


@pytest.mark.slow
def test_ctrl_c_keeps_the_study_and_the_file_and_resumes(tmp_path: Path) -> None:
    out = tmp_path / "rec.json"
    args = [
        "search",
        str(SCRIPTS / "style_alias.py"),
        "--out",
        str(out),
        "--budget",
        "120",
        "--window",
        "0.3",
        "--study",
        "ctrl-c",
        "--json",
    ]
    proc = _start_and_wait(args, "ctrl-c")
    proc.send_signal(signal.SIGINT)
    err = _communicate_or_dump(proc, timeout=30)
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted" in err and "run the same command again" in err
    assert not out.exists()  # the recommendation file is left as it was
    again = loadertune(*[a if a != "120" else "20" for a in args], "--trials", "3")
    data = summary(again)
    assert data["search"]["n_previous_trials"] >= 3
    # the probe's trials are the earlier run's, kept; none is measured again
    assert "probe" not in [t["phase"] for t in data["trials"] if not t["kept"]]
    assert "baseline" in [t["phase"] for t in data["trials"] if t["kept"]]


@pytest.mark.slow
def test_ctrl_c_during_the_probe_keeps_its_finished_trials(tmp_path: Path) -> None:
    """Ctrl-C after the baseline, while the probe runs (issue 14): the resumed search does not
    measure the baseline again, its figures are the interrupted run's, read back from the study,
    and the probe goes on from there; a third run measures none of the probe's trials again."""
    args = ["search", str(SCRIPTS / "slow_samples.py"), "--out", str(tmp_path / "rec.json")]
    args += ["--window", "0.3", "--study", "ctrl-c-probe", "--json"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadertune", *args, "--budget", "120", "--fresh"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:  # one plain line per trial: stderr is no terminal
        seen.append(line)
        if line.startswith("baseline "):
            break
    proc.send_signal(signal.SIGINT)
    err = "".join(seen) + _communicate_or_dump(proc, timeout=30)
    assert proc.returncode == 130, err[-2000:]
    baseline_lines = [line for line in err.splitlines() if line.startswith("baseline ")]
    assert len(baseline_lines) == 1, err[-4000:]  # (rich once printed it twice: test_report)
    (baseline_line,) = baseline_lines
    assert "samples/s" in baseline_line, err[-2000:]
    assert "replay " not in err  # interrupted before the probe was done
    assert "run it again with --resume instead of --fresh" in err  # (the same command: afresh)

    data = summary(loadertune(*args, "--budget", "40", "--trials", "2"))
    (base,) = [t for t in data["trials"] if t["phase"] == "baseline"]
    assert base.get("kept") is True, data["trials"]  # not measured again...
    assert f" {base['samples_per_s']:,.0f} samples/s " in baseline_line  # ...the earlier figure
    ran = [t["phase"] for t in data["trials"] if not t.get("kept")]
    assert "replay" in ran and "baseline" not in ran  # the probe went on where it stopped
    assert data["baseline"]["loader_kwargs"]["num_workers"] == 2  # the script's own, learnt

    third = summary(loadertune(*args, "--budget", "30", "--trials", "1"))
    kept = [t["phase"] for t in third["trials"] if t["kept"]]
    ran = [t["phase"] for t in third["trials"] if not t["kept"]]
    assert "baseline" in kept and "replay" in kept
    assert not {"baseline", "probe", "replay"} & set(ran), ran


@pytest.mark.slow
def test_sigint_stops_a_search_started_with_sigint_ignored(tmp_path: Path) -> None:
    """`cmd &` in a script (no job control) starts the CLI with SIGINT ignored; `kill -INT`
    must still stop it cleanly."""
    args = [
        "search",
        str(SCRIPTS / "style_alias.py"),
        "--out",
        str(tmp_path / "rec.json"),
        "--budget",
        "120",
        "--window",
        "0.3",
        "--study",
        "sigint-ignored",
        "--fresh",
    ]
    proc = _start_and_wait(
        args,
        "sigint-ignored",
        n_complete=1,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    proc.send_signal(signal.SIGINT)
    err = _communicate_or_dump(proc, timeout=30)
    assert proc.returncode == 130, err[-2000:]
    # --fresh would start the study afresh again: the way back is --resume
    assert "run it again with --resume instead of --fresh" in err


@pytest.mark.slow
def test_sigterm_saves_the_best_so_far_when_asked(tmp_path: Path) -> None:
    out = tmp_path / "rec.json"
    store.save_entry(out, "another-box", _entry(8))
    args = [
        "search",
        str(SCRIPTS / "style_alias.py"),
        "--out",
        str(out),
        "--budget",
        "120",
        "--window",
        "0.3",
        "--study",
        "sigterm",
        "--fresh",
        "--save-partial",
    ]
    proc = _start_and_wait(args, "sigterm")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, err[-2000:]
    assert "marked partial" in err
    assert store.entry_for(out, "another-box")["loader_kwargs"]["num_workers"] == 8  # still there
    ((key, mine),) = store.entries_for(out, hardware.current_key()).items()
    assert mine["partial"] is True and mine["loader_kwargs"]["batch_size"] == 16
    assert key.startswith("script ") and key.split(":")[0].endswith("style_alias.py")


def _carrying(name: str, value: str) -> list[psutil.Process]:
    """Live processes with ``name=value`` in their environment."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(name) == value and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except psutil.Error:
            pass
    return found


@pytest.mark.slow
@pytest.mark.parametrize("context", ["", "spawn", "forkserver"])
def test_workers_die_with_a_sigkilled_cli(context: str, tmp_path: Path) -> None:
    """kill -9 on `loadertune search` (an OOM killer, a CI timeout) while the trial's workers are
    stuck in __getitem__: the trial process dies with the CLI, and its workers with it, under
    every start method (multiprocessing's helpers then end too); the script's own
    worker_init_fn still ran."""
    args = ["search", str(SCRIPTS / "stuck_workers.py"), "--out", str(tmp_path / "rec.json")]
    _sigkill_while_stuck([*args, "--budget", "120", "--fresh"], context, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("tune", "context", "after"),
    [(False, "", ""), (False, "spawn", ""), (False, "forkserver", ""), (True, "", "1")],
)
def test_workers_die_with_a_sigkilled_run(
    tune: bool, context: str, after: str, tmp_path: Path
) -> None:
    """The same for `loadertune run` (issue 14), where the script runs in the CLI's own process:
    with no entry to apply, and with --tune, where the stuck loader is not the one tuned."""
    tuning = ["--tune", "--budget", "60"] if tune else []
    args = ["run", "--file", str(tmp_path / "rec.json"), *tuning, str(SCRIPTS / "stuck_workers.py")]
    _sigkill_while_stuck(args, context, tmp_path, STUCK_AFTER_ANOTHER=after)


def _sigkill_while_stuck(args: list[str], context: str, tmp_path: Path, **env: str) -> None:
    """Run `loadertune ARGS` on stuck_workers.py, SIGKILL it once both workers are stuck, and
    check that no process of it is left a few seconds later, and that what they left in their
    temporary folder is all the next search's sweep removes."""
    pids_dir = tmp_path / "pids"
    pids_dir.mkdir()
    temp = Path(tempfile.mkdtemp(prefix="lt-"))  # short, as conftest's short_temp
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadertune", *args],
        env={
            **os.environ,
            "STUCK_PIDS_DIR": str(pids_dir),
            "STUCK_CONTEXT": context,
            "TMPDIR": str(temp),
            **env,
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while len(list(pids_dir.iterdir())) < 2 and time.monotonic() < deadline:
            assert proc.poll() is None, f"`loadertune {args[0]}` ended before its workers got stuck"
            time.sleep(0.1)
        assert sorted(p.read_text() for p in pids_dir.iterdir()) == ["0", "1"]  # worker ids
        workers = {int(p.name) for p in pids_dir.iterdir()}
        assert workers <= {p.pid for p in _carrying("STUCK_PIDS_DIR", str(pids_dir))}
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 3  # torch's own check of a stuck worker's parent never runs
    while (left := _carrying("STUCK_PIDS_DIR", str(pids_dir))) and time.monotonic() < deadline:
        time.sleep(0.05)
    for p in left:  # clean up before failing
        with contextlib.suppress(psutil.Error):
            p.kill()
    assert not {p.pid for p in left} & workers, "DataLoader workers outlived the SIGKILLed CLI"
    assert not left, f"processes outlived the SIGKILLed CLI: {[p.cmdline() for p in left]}"
    try:
        deadline = time.monotonic() + 10  # the killed processes may take a moment to go
        leftovers.sweep(temp)
        while any(temp.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.2)
            leftovers.sweep(temp)
        assert sorted(p.name for p in temp.iterdir()) == []
    finally:
        shutil.rmtree(temp)


def _marking_script(tmp_path: Path) -> tuple[Path, Path]:
    """A script that leaves a mark when a trial runs it."""
    mark = tmp_path / "a-trial-ran"
    script = tmp_path / "marks.py"
    script.write_text(
        f"open({str(mark)!r}, 'w').close()\n"
        "import torch\nfrom torch.utils.data import DataLoader\n"
        "for _ in range(100):\n"
        "    for x in DataLoader(torch.arange(4000.0), batch_size=16):\n"
        "        pass\n"
    )
    return script, mark


def test_a_read_only_out_file_is_refused_before_any_trial(tmp_path: Path) -> None:
    script, mark = _marking_script(tmp_path)
    out = tmp_path / "rec.json"
    store.save_entry(out, "another-box", _entry(8))
    out.chmod(0o444)
    before = out.read_bytes()
    proc = loadertune("search", str(script), "--out", str(out), *FAST)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert f"{out} is read-only" in proc.stderr and "chmod u+w" in proc.stderr
    assert not mark.exists()
    assert out.read_bytes() == before and stat.S_IMODE(out.stat().st_mode) == 0o444


def test_an_unwritable_out_folder_is_refused_before_any_trial(tmp_path: Path) -> None:
    """sysfs refuses new files, root included (a 555 folder would not stop root)."""
    if not Path("/sys/kernel").is_dir():
        pytest.skip("no sysfs")
    script, mark = _marking_script(tmp_path)
    proc = loadertune("search", str(script), "--out", "/sys/kernel/rec.json", *FAST)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "cannot create files in the folder /sys/kernel" in proc.stderr
    assert "locked by another process" not in proc.stderr
    assert not mark.exists()


def _two_scripts(folder: Path) -> tuple[Path, Path]:
    """Two small training scripts, ``a.py`` and ``b.py``; their argument is the epochs."""
    text = (
        "import sys\nimport torch\nfrom torch.utils.data import DataLoader\n\n"
        "loader = DataLoader(torch.arange({n}.0), batch_size={bs})\n"
        "for _ in range(int(sys.argv[1])):\n    for x in loader:\n        pass\n"
    )
    a, b = folder / "a.py", folder / "b.py"
    a.write_text(text.format(n=2048, bs=16))
    b.write_text("# the second script\n" + text.format(n=4096, bs=64))
    return a, b


@pytest.mark.slow
def test_two_scripts_tuned_into_one_file_keep_both_and_run_picks_its_own(tmp_path: Path) -> None:
    """Issue 14: entries are per machine and workload. Tuning two scripts into one file keeps
    both; `run` applies each script its own; a third script gets nothing, and is told why."""
    a, b = _two_scripts(tmp_path)
    out = tmp_path / "rec.json"
    for script in (a, b):
        summary(loadertune("search", str(script), "--out", str(out), "--json", *FAST, "--", "500"))
    entries = store.entries_for(out, hardware.current_key())
    assert set(entries) == {"script a.py:5", "script b.py:6"}
    assert entries["script a.py:5"]["baseline"]["loader_kwargs"]["batch_size"] == 16
    assert entries["script b.py:6"]["baseline"]["loader_kwargs"]["batch_size"] == 64
    for script, site in ((a, "a.py:5"), (b, "b.py:6")):
        proc = loadertune("run", str(script), "--file", str(out), "--", "1")
        assert proc.returncode == 0, proc.stderr
        (line,) = [x for x in proc.stderr.splitlines() if "DataLoader #1 at" in x]
        assert line.split(":")[1].strip().endswith(site.split(":")[0]), line
        assert "was measured on the loader at" not in line  # its own, not the other's
    other = tmp_path / "c.py"
    other.write_text(a.read_text())
    proc = loadertune("run", str(other), "--file", str(out), "--", "1")
    assert proc.returncode == 0, proc.stderr
    assert "running without changes" in proc.stderr
    assert "no entry for c.py on this machine" in proc.stderr
    assert "other workloads only: script a.py:5; script b.py:6" in proc.stderr


@pytest.mark.slow
def test_a_partial_result_never_replaces_a_complete_one(tmp_path: Path) -> None:
    a, _ = _two_scripts(tmp_path)
    out = tmp_path / "rec.json"
    summary(loadertune("search", str(a), "--out", str(out), "--json", *FAST, "--", "500"))
    complete = out.read_bytes()
    # SIGTERM once the baseline is in: every worker setting is pruned here, and the rest of the
    # search takes a few seconds (a fork per launch); waiting for three trials, the SIGTERM came
    # after the search, its handler gone with it (-15, not 143).
    args = ["search", str(a), "--out", str(out), "--budget", "120", "--window", "0.3"]
    proc = _start_and_wait(
        [*args, "--study", "partial-vs-complete", "--fresh", "--save-partial", "--", "100000"],
        "partial-vs-complete",
        n_complete=1,
    )
    assert proc.poll() is None, "the search ended before the SIGTERM: the test tests nothing"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, err[-2000:]
    assert "which a partial one never replaces; it was kept" in err
    assert out.read_bytes() == complete


def test_force_says_where_the_unreadable_file_is_kept(tmp_path: Path) -> None:
    """A recommendation file that is not JSON stops a search, unless --force: then the search
    says, before it starts, that the file will be replaced and where its copy is kept."""
    out = tmp_path / "rec.json"
    out.write_text("{not json")
    stopped = search("short.py", tmp_path)
    assert stopped.returncode == 1 and "not valid JSON" in stopped.stderr, stopped.stderr
    forced = search("short.py", tmp_path, "--force", "--trials", "2")
    assert forced.returncode == 0, forced.stderr[-3000:]
    assert "kept beside it as rec.json.corrupt-" in forced.stderr, forced.stderr
    (copy,) = tmp_path.glob("rec.json.corrupt-*")
    assert copy.read_text() == "{not json"
    assert json.loads(out.read_text())["machines"]


def test_an_interrupt_past_the_search_exits_130_and_says_what_is_kept(tmp_path, monkeypatch):
    """Ctrl-C after the search's own handling (saving the file): exit 130 with a line on what
    is kept, not click's 'Aborted!' and exit 1."""
    from click.testing import CliRunner

    from loadertune import api
    from loadertune.cli import cli

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(api, "tune_script", interrupted)
    script = tmp_path / "train.py"
    script.write_text("print('never run')\n")
    result = CliRunner().invoke(cli, ["search", str(script), "--out", str(tmp_path / "r.json")])
    assert result.exit_code == 130, result.output
    assert "trials are kept in its study" in result.output
    assert "Aborted" not in result.output


def test_ctrl_c_ends_run_as_it_ends_python_with_the_scripts_traceback(tmp_path: Path) -> None:
    """`loadertune run` interrupted: the script's KeyboardInterrupt, its own frames shown, and
    exit 130 as `python SCRIPT` gives (click's "Aborted!" and 1 before)."""
    script = tmp_path / "forever.py"
    script.write_text(
        "import sys\n"
        "from torch.utils.data import DataLoader\n"
        "loader = DataLoader(list(range(64)), batch_size=8)\n"
        "print('looping', flush=True)\n"
        "while True:\n"
        "    for batch in loader:\n"
        "        pass\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadertune", "run", str(script), "--file", str(tmp_path / "r")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "looping"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert "Aborted!" not in err
    # Its own frame: the loop's line, or the print's when the signal came as the line it waited
    # for was flushed (a loaded machine, beside a CI run).
    assert re.search(rf'File "{re.escape(str(script))}", line [4-7], in <module>', err), err
    assert "KeyboardInterrupt" in err
