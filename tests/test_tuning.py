"""Tuning inside the real training run: every batch trains, each sample once per epoch, a failing
setting gives way to the last good one, and the winner is saved and then used."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, get_worker_info

from loadertune import hardware, tuned
from loadertune.api.live import TunedLoader
from loadertune.config import Config
from loadertune.errors import ConfigError
from loadertune.results import store
from loadertune.search import SearchSettings
from loadertune.trials import Limits, TrialResult, window_for
from loadertune.trials.hotswap.live_runner import LiveConductor, LiveRunner
from loadertune.trials.hotswap.swap import HotSwap

SCRIPTS = Path(__file__).parent / "scripts"
pytestmark = pytest.mark.e2e


class Indices(Dataset):
    def __init__(self, n: int = 400, kill_with_workers: int | None = None) -> None:
        self.n, self.kill_with_workers = n, kill_with_workers

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        info = get_worker_info()
        if info is not None and info.num_workers == self.kill_with_workers and i % 40 == 7:
            os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer does
        time.sleep(0.0003)
        return torch.tensor([i])


def whole(epoch: list[int], n: int = 400) -> bool:
    return sorted(epoch) == list(range(n))


def test_a_killed_worker_falls_back_to_the_last_good_setting_and_the_sequence_goes_on() -> None:
    """The search's side runs in a thread, as in a real run; the loop never sees the failure."""
    loader = DataLoader(Indices(kill_with_workers=3), batch_size=16, shuffle=True)
    runner = LiveRunner()
    conductor = LiveConductor(runner)
    swap = HotSwap(loader, conductor, fall_back=True)
    conductor.attach(swap)
    limits = Limits(timeout_s=60, startup_s=30, hang_s=10)
    results: list[TrialResult] = []

    def search() -> None:
        for config in (None, Config(16, 3, 2), Config(16, 2, 2)):
            window = window_for(config or Config(16), window_s=0.2)
            results.append(runner.run(config, window=window, limits=limits))
        runner.winner = Config(16, 2, 2)

    thread = threading.Thread(target=search)
    thread.start()
    epochs = []
    while thread.is_alive() or len(epochs) < 2:
        epochs.append([i for batch in swap.epoch() for i in batch.flatten().tolist()])
    epochs.append([i for batch in swap.epoch() for i in batch.flatten().tolist()])
    assert swap.current is not None and swap.current.step.config == Config(16, 2, 2)
    conductor.close()
    swap.close()
    thread.join()
    assert [r.error for r in results] == [None, "worker_killed", None], [
        r.failure.detail if r.failure else None for r in results
    ]
    assert results[0].config == Config(16) and results[0].extra["loader"]["epoch_samples"] == 400
    assert all(whole(e) for e in epochs)


def test_a_length_asked_after_the_search_turns_the_run_back_to_its_own_batch_size() -> None:
    """The search picked batch size 32 and the run went on with it; then the loop asked the
    length (a scheduler made late): from that batch on, the run is at its own 16 again, with the
    best setting measured there, and every epoch has the 25 batches the loop was told."""
    loader = DataLoader(Indices(), batch_size=16, shuffle=True)
    runner = LiveRunner()
    lines: list[str] = []
    conductor = LiveConductor(runner, lines.append)
    swap = HotSwap(loader, conductor, fall_back=True)
    conductor.attach(swap)

    def search() -> None:
        window = window_for(Config(16), window_s=0.2)
        runner.run(None, window=window, limits=Limits(timeout_s=60, startup_s=30, hang_s=10))
        runner.best_at_own = Config(16, 2, 2)
        runner.winner = Config(32, 2, 2)

    thread = threading.Thread(target=search)
    thread.start()
    epochs = []
    while thread.is_alive() or not epochs:
        epochs.append([i for batch in swap.epoch() for i in batch.flatten().tolist()])
    thread.join()
    sizes = [len(batch) for batch in swap.epoch()]  # the winner's
    assert sizes == [32] * 12 + [16], sizes
    epoch = swap.epoch()
    assert len(epoch) == 25  # the loop asks now
    batches = list(epoch)
    assert [len(b) for b in batches] == [16] * 25
    assert whole([i for b in batches for i in b.flatten().tolist()])
    assert swap.current is not None and swap.current.step.config == Config(16, 2, 2)
    assert sum("after the tuning picked batch size 32" in line for line in lines) == 1, lines
    conductor.close()
    swap.close()
    assert all(whole(e) for e in epochs)


def _tuned_indices(
    tmp_path: Path, out: Path, report: Callable[[str], object]
) -> tuple[SearchSettings, TunedLoader]:
    """A loader of 400 indices in batches of 16, tuned for 4 s, the winner saved to ``out``."""
    settings = SearchSettings(window_s=0.2, max_workers=2, storage=f"sqlite:///{tmp_path}/s.db")
    loader = tuned(
        DataLoader(Indices(), batch_size=16, shuffle=True),
        budget_s=4,
        out=out,
        settings=settings,
        report=report,
    )
    return settings, loader


def test_tuned_trains_on_every_sample_once_per_epoch_and_saves_the_winner(tmp_path: Path) -> None:
    out = tmp_path / "rec.json"
    lines: list[str] = []
    settings, loader = _tuned_indices(tmp_path, out, lines.append)
    epochs = []
    with loader:
        assert len(loader) == 25 and loader.batch_size == 16  # the loader's own
        t0 = time.monotonic()
        while loader.tuner.runner.winner is None and time.monotonic() - t0 < 60:
            epochs.append([i for batch in loader for i in batch.flatten().tolist()])
        epochs.append([i for batch in loader for i in batch.flatten().tolist()])
        winner = loader.tuner.runner.winner
        assert winner is not None and winner.batch_size == 16  # the batch size is kept
        current = loader.tuner.swap.current  # type: ignore[union-attr]
        assert current is not None and current.step.config == winner
        assert _n_trials_stored(settings.storage) == 0  # written once the training is over
    assert all(whole(e) for e in epochs)
    assert _n_trials_stored(settings.storage) >= 3
    assert any("tuned in" in line for line in lines), lines
    entries = store.entries_for(out, hardware.current_key())
    assert len(entries) == 1
    (entry,) = entries.values()
    assert Config.from_kwargs(entry["loader_kwargs"]) == winner


def test_tuned_takes_an_epoch_the_loop_ends_early_as_long_as_the_loop_makes_it(
    tmp_path: Path,
) -> None:
    """A loop that breaks after 5 of the loader's 25 batches starts workers again every 80
    samples, not every 400: the trials' epochs, and the saved entry's, are that long."""
    out = tmp_path / "rec.json"
    _, loader = _tuned_indices(tmp_path, out, lambda line: None)
    with loader:
        t0 = time.monotonic()
        while loader.tuner.runner.winner is None and time.monotonic() - t0 < 60:
            for i, _ in enumerate(loader):
                if i + 1 == 5:
                    break
    assert loader.tuner.runner.winner is not None
    assert loader.tuner.runner.epoch_samples == 80
    (entry,) = store.entries_for(out, hardware.current_key()).values()
    assert entry["workload"]["epoch_samples"] == 80
    lengths = [t["epoch_samples"] for t in entry["trials"]]
    assert lengths[-1] == 80 and set(lengths) <= {80, 400}, lengths


def _n_trials_stored(storage: str) -> int:
    import optuna

    if not os.path.exists(storage.removeprefix("sqlite:///")):
        return 0
    summaries = optuna.get_all_study_summaries(storage)
    return sum(s.n_trials for s in summaries)


def test_tuned_writes_its_study_at_exit_when_the_loader_is_never_closed(tmp_path: Path) -> None:
    code = f"""
import time
from torch.utils.data import DataLoader
from loadertune import tuned
from loadertune.search import SearchSettings
from tests.test_tuning import Indices
settings = SearchSettings(window_s=0.2, max_workers=2, storage="sqlite:///{tmp_path}/s.db")
loader = tuned(DataLoader(Indices(), batch_size=16), budget_s=3, out="{tmp_path}/rec.json",
               settings=settings, report=print)
t0 = time.monotonic()
while loader.tuner.runner.winner is None and time.monotonic() - t0 < 60:
    for batch in loader:
        pass
"""
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).parent.parent,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "tuned in" in proc.stdout, proc.stdout
    assert _n_trials_stored(f"sqlite:///{tmp_path}/s.db") >= 3


def test_tuned_keeps_the_batch_size_once_the_loop_asked_its_length(tmp_path: Path) -> None:
    """Other batch sizes are allowed, but the loop asked ``len(loader)`` (a progress bar, a
    schedule) on its first batch: from then on no other batch size is tried or picked, and
    every epoch has the 25 batches the loop was told."""
    lines: list[str] = []
    settings = SearchSettings(window_s=0.2, max_workers=2, storage=f"sqlite:///{tmp_path}/s.db")
    loader = tuned(
        DataLoader(Indices(), batch_size=16, shuffle=True),
        budget_s=4,
        batch_size=[4, 16, 32],
        out=tmp_path / "rec.json",
        settings=settings,
        report=lines.append,
    )
    batches = []
    with loader:
        t0 = time.monotonic()
        while loader.tuner.runner.winner is None and time.monotonic() - t0 < 60:
            n = 0
            for n, _ in enumerate(loader, 1):
                if n == 1:
                    assert len(loader) == 25
            batches.append(n)
    assert loader.tuner.runner.winner is not None
    assert loader.tuner.runner.winner.batch_size == 16
    assert batches and set(batches) == {25}, batches
    assert any("batch size left out of the search" in line for line in lines), lines


def test_tuned_rejects_a_bad_budget() -> None:
    with pytest.raises(ConfigError, match="budget_s must be > 0"):
        tuned(DataLoader(Indices(), batch_size=4), budget_s=0)


def _loadertune(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loadertune", *args], capture_output=True, text=True, timeout=300
    )


def test_run_tune_completes_every_epoch_and_the_next_run_uses_the_winner(tmp_path: Path) -> None:
    counts, rec = tmp_path / "counts.jsonl", tmp_path / "rec.json"
    script = [str(SCRIPTS / "counts.py"), "--", str(counts), "40"]
    proc = _loadertune("run", "--tune", "--budget", "4", "--file", str(rec), *script)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "tuned in" in proc.stderr or "ended before the tuning" in proc.stderr, proc.stderr
    # no file yet: not "run `loadertune search` first", which --tune does not need
    assert f"{rec} does not exist yet; the winner is saved there" in proc.stderr
    assert "A new study created" not in proc.stderr + proc.stdout  # Optuna's log stays quiet
    epochs = [json.loads(line) for line in counts.read_text().splitlines()]
    assert len(epochs) == 40  # the run went to its end
    assert all(sorted(e["samples"]) == list(range(600)) for e in epochs)
    entries = store.entries_for(rec, hardware.current_key())
    assert len(entries) == 1
    (entry,) = entries.values()
    assert entry["workload"]["loader_index"] == 1
    again = _loadertune("run", "--file", str(rec), *script)
    assert again.returncode == 0 and "DataLoader #1 at" in again.stderr, again.stderr[-2000:]


@pytest.mark.parametrize("workers", ["0", "2"])
def test_run_tune_passes_a_bad_records_error_to_the_loop_and_the_epoch_goes_on(
    tmp_path: Path, workers: str
) -> None:
    """A loop that catches a bad record's error around ``next()`` and goes on, as plain torch
    lets it: every epoch under ``run --tune`` holds every sample but the bad batches', each bad
    batch raised once. The epoch had ended at the first error, for the rest of the run (a new
    user's run trained on 2,000 of 8,500 samples, and nothing said so). The tuning goes on
    through them and finishes: no setting loads a bad record (it had stopped at the first one,
    "the dataset raised an error; this is a bug in the dataset")."""
    counts, rec = tmp_path / "counts.jsonl", tmp_path / "rec.json"
    # 60 epochs of 480 samples: about 8 s at 3,700 samples/s, twice the tuning's budget (30 took
    # about 4 s, and on a loaded machine the run once ended before the tuning did)
    script = [str(SCRIPTS / "bad_records.py"), "--", str(counts), "60", workers]
    proc = _loadertune("run", "--tune", "--budget", "4", "--file", str(rec), *script)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "tuned in" in proc.stderr and "FAILED" not in proc.stderr, proc.stderr[-3000:]
    epochs = [json.loads(line) for line in counts.read_text().splitlines()]
    assert len(epochs) == 60
    for e in epochs:
        assert len(e["samples"]) == len(set(e["samples"])), e["epoch"]
        assert not {17, 123, 250, 391} & set(e["samples"])
        # every other sample arrives, but those batched with a bad record (1-4 batches)
        assert 1 <= e["raised"] <= 4 and len(e["samples"]) >= 480 - 4 * 16, e


def test_run_tune_leaves_out_a_setting_whose_workers_fail_where_the_main_process_loads(
    tmp_path: Path,
) -> None:
    """Records that raise in a worker only (state that does not survive the workers' start)
    fail the settings with workers, not the tuning: the batch loads with the last good
    setting, so the search leaves those settings out, says why, and goes on; the script gets
    every batch, from the setting it falls back to."""
    counts, rec = tmp_path / "counts.jsonl", tmp_path / "rec.json"
    script = [str(SCRIPTS / "bad_records.py"), "--", str(counts), "30", "0", "in-workers"]
    proc = _loadertune("run", "--tune", "--budget", "4", "--file", str(rec), *script)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "tuned in" in proc.stderr, proc.stderr[-3000:]
    assert "with this setting only: the same batch loads with" in proc.stderr, proc.stderr
    for e in (json.loads(line) for line in counts.read_text().splitlines()):
        assert sorted(e["samples"]) == list(range(480)) and e["raised"] == 0, e
    (entry,) = store.entries_for(rec, hardware.current_key()).values()
    assert Config.from_kwargs(entry["loader_kwargs"]).num_workers == 0
    failed = [t for t in entry["trials"] if t.get("error")]
    assert failed and all(t["error"] == "dataset_error_with_setting" for t in failed), failed
    workers = [t["params"]["num_workers"] for t in failed]
    # each failure rules out as many workers and more: none is tried after it
    assert all(w > 0 for w in workers) and workers == sorted(set(workers), reverse=True), workers


def test_run_tune_keeps_no_workers_for_a_dataset_whose_open_file_workers_would_share(
    tmp_path: Path,
) -> None:
    """A dataset that opened a file in ``__init__`` (reads by ``seek`` then ``read``) is right
    without workers and wrong with forked ones, which share the file's offset. A run that
    loads it without workers is not tuned, and says why: a new user's ``run --tune`` fed up to
    425 wrong records an epoch (of 8,000) into the training of such a dataset."""
    counts, rec = tmp_path / "counts.jsonl", tmp_path / "rec.json"
    script = [str(SCRIPTS / "open_file.py"), "--", str(counts), "20"]
    proc = _loadertune("run", "--tune", "--budget", "4", "--file", str(rec), *script)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "its dataset holds Records.f (an open file), made in the main process" in proc.stderr
    epochs = [json.loads(line) for line in counts.read_text().splitlines()]
    assert len(epochs) == 20
    for e in epochs:
        assert sorted(e["samples"]) == list(range(400)) and e["wrong"] == 0, e
        assert e["workers"] == 0
    assert not rec.exists()


def test_ctrl_c_of_run_tune_says_so_and_run_tells_the_entry_is_a_best_so_far(
    tmp_path: Path,
) -> None:
    """Ctrl-C in the middle of the tuning: the best so far is saved, marked partial as an
    interrupted one (it had said "the run ended before the tuning"), and ``loadertune run``
    says the entry it applies is a best so far (it had applied it as a finished search's)."""
    counts, rec = tmp_path / "counts.jsonl", tmp_path / "rec.json"
    script = [str(rec), str(SCRIPTS / "counts.py"), "--", str(counts), "100000"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadertune", "run", "--tune", "--budget", "120", "--file", *script],
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (
        not counts.exists() or len(counts.read_text().splitlines()) < 12
    ):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "the run was interrupted before the tuning ended; the best so far saved to" in err
    (entry,) = store.entries_for(rec, hardware.current_key()).values()
    assert entry["partial"] and entry["search"]["stop_reason"] == "interrupted"
    again = _loadertune(
        "run", "--file", str(rec), str(SCRIPTS / "counts.py"), "--", str(counts), "1"
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "a best so far, not a finished search's winner (an interrupted search)" in again.stderr


def test_a_ctrl_c_while_a_trials_workers_start_interrupts_run_tune(tmp_path: Path) -> None:
    """A Ctrl-C that lands in the fork of a trial's workers: Python runs its modules' at-fork
    callbacks where an exception is printed and dropped. It had been lost there (the run went
    on), and lost in logging's callback it left logging's lock held, so the tuner's thread
    waited for ever: one run of the Ctrl-C test above never ended (CI, stop 47)."""
    rec = tmp_path / "rec.json"
    proc = _loadertune(
        "run", "--tune", "--budget", "60", "--file", str(rec),
        str(SCRIPTS / "ctrl_c_at_fork.py"), "--", "400",
    )  # fmt: skip
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert "the run was interrupted before the tuning ended" in proc.stderr
    assert "Exception ignored" not in proc.stderr
    assert len(proc.stdout.splitlines()) < 400


@pytest.mark.parametrize("bad", ["corrupt", "read-only"])
def test_run_tune_with_a_file_it_cannot_save_to_runs_untuned_and_says_why(
    tmp_path: Path, bad: str
) -> None:
    """A winner that cannot be saved is not worth the run's time: the run goes on untuned, and
    says why at its start. It had tuned for the whole budget (16 workers included), then
    thrown the winner away."""
    counts, rec = tmp_path / "counts.jsonl", tmp_path / "rec.json"
    if bad == "corrupt":
        rec.write_text("{not json")
    else:
        empty = {"schema": store.SCHEMA, "schema_version": store.SCHEMA_VERSION, "machines": {}}
        rec.write_text(json.dumps(empty))
        rec.chmod(0o444)
    script = [str(SCRIPTS / "counts.py"), "--", str(counts), "3"]
    proc = _loadertune("run", "--tune", "--budget", "4", "--file", str(rec), *script)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "not tuning this run, whose winner could not be saved" in proc.stderr
    assert "baseline" not in proc.stderr and "tuning the DataLoader" not in proc.stderr
    assert ("is not valid JSON" if bad == "corrupt" else "is read-only") in proc.stderr
    assert "--out" not in proc.stderr  # run names its file with --file
    assert len(counts.read_text().splitlines()) == 3


def test_run_tune_follows_a_loader_the_script_creates_again_every_epoch(tmp_path: Path) -> None:
    """A new DataLoader every epoch (made by a function) is the same loader: the tuning goes
    on over each new one and finishes. Before, every loader after the first was taken for
    another loader and ran untuned, the search waited for trials that never came, and the end
    said "the run ended before the tuning"."""
    counts, rec = tmp_path / "counts.jsonl", tmp_path / "rec.json"
    script = [str(SCRIPTS / "rebuilt_each_epoch.py"), "--", str(counts), "60"]
    proc = _loadertune("run", "--tune", "--budget", "4", "--file", str(rec), *script)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "tuned in" in proc.stderr and "ended before" not in proc.stderr, proc.stderr
    epochs = [json.loads(line) for line in counts.read_text().splitlines()]
    assert len(epochs) == 60
    assert all(sorted(e["samples"]) == list(range(600)) for e in epochs)
    assert len({e["workers"] for e in epochs[1:]}) > 1, "the loaders after the first were not tuned"
    (entry,) = store.entries_for(rec, hardware.current_key()).values()
    winner = Config.from_kwargs(entry["loader_kwargs"])
    assert epochs[-1]["workers"] == winner.num_workers


def test_run_tune_leaves_a_loader_created_again_at_another_batch_size(tmp_path: Path) -> None:
    """A loader created again at another batch size (a schedule of batch sizes) is the
    script's own choice: the tuning stops there, and that loader runs as the script built it."""
    counts, rec = tmp_path / "counts.jsonl", tmp_path / "rec.json"
    script = [str(SCRIPTS / "rebuilt_each_epoch.py"), "--", str(counts), "8", "grow"]
    proc = _loadertune("run", "--tune", "--budget", "60", "--file", str(rec), *script)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "created again with batch size 32, where the tuning began at 16" in proc.stderr
    assert "ended before" not in proc.stderr, proc.stderr  # the run did not end
    epochs = [json.loads(line) for line in counts.read_text().splitlines()]
    assert all(sorted(e["samples"]) == list(range(600)) for e in epochs)
    assert all(set(e["lengths"][:-1]) == {32} and e["workers"] == 0 for e in epochs[3:]), epochs


@pytest.mark.parametrize("when", ["before", "lazy"])
def test_run_tune_keeps_the_batch_size_once_the_script_asked_the_loader_length(
    tmp_path: Path, when: str
) -> None:
    """one_cycle.py sizes a OneCycleLR by ``epochs * len(loader)`` at its batch size of 16,
    before its loop or (``lazy``) at its first step, once the tuning has begun. A real run keeps
    every sample, so batch size 4 would give an epoch 120 steps (the scheduler raises) and 32
    give it 15 (the schedule never completes): the run keeps 16 and says so, and every epoch
    has the 30 steps the script was told."""
    out = tmp_path / "epochs.jsonl"
    tune = ["run", "--tune", "--budget", "4", "--batch-sizes", "4,16,32"]
    script = [str(SCRIPTS / "one_cycle.py"), "--", str(out), "40", *(["lazy"] * (when == "lazy"))]
    proc = _loadertune(*tune, "--file", str(tmp_path / "rec.json"), *script)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "batch size left out of the search" in proc.stderr, proc.stderr
    assert "the script asked the loader's length" in proc.stderr, proc.stderr
    epochs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(epochs) == 40
    assert all(sorted(e["samples"]) == list(range(480)) for e in epochs)  # every sample, once
    assert [e["batches"] for e in epochs] == [30] * 40


@pytest.mark.parametrize("edit", ["above", "its_line"])
def test_run_tune_follows_a_moved_loader_and_says_when_its_line_changed(
    tmp_path: Path, edit: str
) -> None:
    """The script changed after its entry was measured. A line added above the loader moves
    it: the entry still names it by its text, and the run tunes it as that entry's loader. The
    loader's own line edited: the entry matches no loader, and the run tunes the loader it
    iterates and says so, rather than tuning nothing in silence; the stale entry is named at
    the end."""
    import shutil

    for name in ("counts.py", "_data.py"):
        shutil.copy(SCRIPTS / name, tmp_path / name)
    counts, rec = tmp_path / "counts.jsonl", tmp_path / "rec.json"
    script = [str(tmp_path / "counts.py"), "--", str(counts), "30"]
    first = _loadertune("run", "--tune", "--budget", "3", "--file", str(rec), *script)
    assert first.returncode == 0, first.stderr[-3000:]
    (old,) = store.entries_for(rec, hardware.current_key())
    source = (tmp_path / "counts.py").read_text()
    if edit == "above":
        source = "# a line added since\n" + source
    else:
        source = source.replace("shuffle=True, **own)", "shuffle=True, drop_last=False, **own)")
    (tmp_path / "counts.py").write_text(source)
    proc = _loadertune("run", "--tune", "--budget", "3", "--file", str(rec), *script)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "tuned in" in proc.stderr or "ended before the tuning" in proc.stderr, proc.stderr
    if edit == "above":
        assert f"the loader {old} was measured on" in proc.stderr, proc.stderr
        assert re.search(r"\(measured at \S*counts\.py:17\)", proc.stderr), proc.stderr
        assert "not applied" not in proc.stderr, proc.stderr
    else:
        assert f"no DataLoader of this run is the one {old} was measured on" in proc.stderr
        assert "the first the script iterates with gradients on" in proc.stderr
        assert f"{old}: no DataLoader the script created matches" in proc.stderr, proc.stderr
    entries = store.entries_for(rec, hardware.current_key())
    assert len(entries) == (2 if edit == "above" else 1)
    assert old in entries


def _run_tune_tunes_loader_2(
    script: Path, tmp_path: Path, *, line: int
) -> subprocess.CompletedProcess[str]:
    """``run --tune SCRIPT`` (3 s): it completes, says it tunes DataLoader #2, created at
    ``line``, and saves that loader's entry."""
    rec = tmp_path / "r.json"
    proc = _loadertune("run", "--tune", "--budget", "3", "--file", str(rec), str(script))
    assert proc.returncode == 0, proc.stderr[-3000:]
    where = rf"tuning DataLoader #2 at \S*{re.escape(script.name)}:{line} "
    assert re.search(where, proc.stderr), proc.stderr
    ((key, entry),) = store.entries_for(rec, hardware.current_key()).items()
    assert entry["workload"]["loader_index"] == 2, key
    return proc


def test_run_tune_leaves_a_loader_iterated_without_gradients_to_the_one_that_trains(
    tmp_path: Path,
) -> None:
    """An evaluation before training (Lightning's sanity check; a script's baseline accuracy)
    iterates its loader under ``torch.no_grad()``: the run tunes the first loader iterated with
    gradients on, and says which."""
    script = tmp_path / "eval_first.py"
    script.write_text(
        "import time\n"
        "import torch\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "data = TensorDataset(torch.arange(512.0))\n"
        "val = DataLoader(data, batch_size=64)\n"
        "train = DataLoader(data, batch_size=16, shuffle=True)\n"
        "for epoch in range(400):\n"
        "    with torch.no_grad():\n"
        "        for batch in val:\n"
        "            pass\n"
        "    for batch in train:\n"
        "        time.sleep(0.001)\n"
    )
    proc = _run_tune_tunes_loader_2(script, tmp_path, line=6)
    assert "the first the script iterates with gradients on" in proc.stderr


def test_torchs_warning_about_the_scripts_own_loader_comes_once_not_every_epoch(
    tmp_path: Path,
) -> None:
    """The script's own validation loader has more workers than CPUs: torch warns about it once
    per place, as under `python SCRIPT`, not again at every epoch of a tuned run (each warnings
    filter loadertune set and took back made Python forget it had warned: 40 lines a run)."""
    script = tmp_path / "val_many.py"
    script.write_text(
        "import os\n"
        "import torch\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "data = TensorDataset(torch.arange(256.0))\n"
        "train = DataLoader(data, batch_size=16, shuffle=True)\n"
        "for epoch in range(12):\n"
        "    for batch in train:\n"
        "        pass\n"
        "    val = DataLoader(data, batch_size=64, num_workers=len(os.sched_getaffinity(0)) + 1)\n"
        "    for batch in val:\n"
        "        pass\n"
    )
    plain = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300
    )
    proc = _loadertune(
        "run", "--tune", "--budget", "3", "--file", str(tmp_path / "r.json"), str(script)
    )
    assert plain.returncode == 0 and proc.returncode == 0, proc.stderr[-3000:]
    warned = proc.stderr.count("worker processes in total")
    assert 1 <= warned <= plain.stderr.count("worker processes in total"), proc.stderr[-3000:]


def test_run_tune_takes_the_loader_by_its_line_and_says_when_none_is_it(tmp_path: Path) -> None:
    """`--loader FILE:LINE`, as `search` takes it; a line that names no loader tunes nothing, and
    the run says so instead of ending in silence."""
    counts, rec = tmp_path / "counts.jsonl", tmp_path / "rec.json"
    script = [str(SCRIPTS / "counts.py"), "--", str(counts), "20"]
    proc = _loadertune(
        "run", "--tune", "--budget", "2", "--loader", "counts.py:17", "--file", str(rec), *script
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "nothing was tuned" not in proc.stderr
    ((key, entry),) = store.entries_for(rec, hardware.current_key()).items()
    assert key.endswith("counts.py:17") and entry["workload"]["call_site"].endswith("counts.py:17")
    none = _loadertune(
        "run", "--tune", "--budget", "2", "--loader", "counts.py:99", "--file", str(rec), *script
    )
    assert none.returncode == 0, none.stderr[-3000:]
    assert "nothing was tuned: no DataLoader the script iterated is counts.py:99" in none.stderr


def test_tuned_says_what_to_do_for_a_loader_it_cannot_swap(tmp_path: Path) -> None:
    """An IterableDataset cannot change setting mid-epoch: the run goes on untuned, every
    sample once, and the message says where such a loader is tuned (a side search)."""
    from torch.utils.data import IterableDataset

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(torch.arange(40).split(1))

    lines: list[str] = []
    loader = tuned(
        DataLoader(Stream(), batch_size=8),
        budget_s=4,
        out=tmp_path / "rec.json",
        settings=SearchSettings(storage=f"sqlite:///{tmp_path}/s.db"),
        report=lines.append,
    )
    with loader:
        for _ in range(2):
            assert sorted(int(i) for b in loader for i in b.flatten()) == list(range(40))
    said = [line for line in lines if "not tuning this DataLoader" in line]
    assert said and "IterableDataset" in said[0] and "loadertune search" in said[0], lines


def test_run_tune_leaves_a_sanity_pass_before_the_optimizer_to_the_loader_that_trains(
    tmp_path: Path,
) -> None:
    """A sanity pass of 2 batches over the validation loader, gradients on, before the
    script makes its optimizer: the validation loader had been tuned (the first iterated with
    gradients on), and the run had stopped inside it. The loader first iterated once an
    optimizer exists is the one; a loop that trains nothing still gets its loader tuned, at
    its second pass (``eval_first.py`` above, and ``counts.py``)."""
    script = tmp_path / "sanity_first.py"
    script.write_text(
        "import torch\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "data = TensorDataset(torch.randn(512, 4), torch.randint(0, 2, (512,)))\n"
        "val = DataLoader(data, batch_size=128)\n"
        "model = torch.nn.Linear(4, 2)\n"
        "for i, (x, y) in enumerate(val):\n"
        "    model(x)\n"
        "    if i >= 1:\n"
        "        break\n"
        "train = DataLoader(data, batch_size=16, shuffle=True)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        "for epoch in range(300):\n"
        "    for x, y in train:\n"
        "        loss = torch.nn.functional.cross_entropy(model(x), y)\n"
        "        opt.zero_grad()\n"
        "        loss.backward()\n"
        "        opt.step()\n"
        "    for x, y in val:\n"
        "        model(x)\n"
    )
    _run_tune_tunes_loader_2(script, tmp_path, line=10)


def test_looking_for_an_optimizer_warns_nothing() -> None:
    """The scan of the garbage collector's objects met ``torch.distributed.reduce_op``, whose
    ``isinstance`` warns: a FutureWarning from loadertune's own line reached a new user's
    ``run --tune`` output."""
    import warnings

    import torch.distributed  # noqa: F401  (what holds the deprecated attribute)

    from loadertune.trials.inside.target import optimizer_exists

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        optimizer_exists()
