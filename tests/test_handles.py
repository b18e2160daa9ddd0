"""The open files and connections a dataset made in the main process, which forked workers
would share: found where they are, and only where workers fork."""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path

import pytest
from torch.utils.data import ConcatDataset, Dataset, Subset

from loadertune.config import Config
from loadertune.trials import Limits, handles, window_for
from loadertune.trials.inline import InlineRunner
from loadertune.trials.script.runner import ScriptRunner

SCRIPTS = Path(__file__).parent / "scripts"


class Rows(Dataset):
    def __init__(self) -> None:
        self.con = sqlite3.connect(":memory:", check_same_thread=False)
        self.f = tempfile.TemporaryFile()  # noqa: SIM115 (held open: what is checked)
        self.names = {"train": ["a", "b"]}

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        return i


class Plain(Dataset):
    def __init__(self) -> None:
        self.path, self.items = "/data/rows.db", list(range(1000))

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        return i


def test_a_datasets_handles_are_found_in_it_and_in_what_wraps_it() -> None:
    rows = Rows()
    assert handles.shared_handles(rows) == [
        "Rows.con (an sqlite3 connection)",
        "Rows.f (an open file)",
    ]
    assert handles.shared_handles(Subset(rows, [0, 1])) == [
        "Subset.dataset.con (an sqlite3 connection)",
        "Subset.dataset.f (an open file)",
    ]
    assert handles.shared_handles(ConcatDataset([Plain(), rows]))[0] == (
        "ConcatDataset.datasets[1].con (an sqlite3 connection)"
    )
    assert handles.shared_handles(Plain()) == []
    rows.f.close()
    assert handles.shared_handles(rows) == ["Rows.con (an sqlite3 connection)"]


def test_only_forked_workers_share_them() -> None:
    rows = Rows()
    forked = handles.fork_warning(rows, "fork")
    assert forked is not None and "forked workers share them" in forked
    assert "worker_init_fn opens them again" not in forked
    assert "worker_init_fn opens them again" in (handles.fork_warning(rows, "fork", print) or "")
    # spawn and forkserver pickle the dataset for each worker: such handles refuse it
    assert handles.fork_warning(rows, "spawn") is None
    assert handles.fork_warning(rows, "forkserver") is None


@pytest.mark.slow
def test_a_script_trial_reports_them(tmp_path: Path) -> None:
    """A script trial reports them; the search's summary shows them as a warning."""
    runner = ScriptRunner(SCRIPTS / "open_file.py", [str(tmp_path / "counts.jsonl"), "50"])
    try:
        result = runner.run(
            None,
            window=window_for(Config(16), window_s=0.3),
            limits=Limits(timeout_s=60, startup_s=30, hang_s=5),
        )
    finally:
        runner.close()
    assert result.ok, result.failure
    (warning,) = result.extra["warnings"]
    assert warning.startswith("the dataset holds Records.f (an open file), made in the main")


def test_an_in_process_trial_reports_them_once() -> None:
    """``tune_loader``'s trials: the first reports them (the summary shows it), no later one."""
    runner = InlineRunner(Rows())
    limits = Limits(timeout_s=30, startup_s=20, hang_s=5)
    try:
        first, second = (
            runner.run(Config(2), window=window_for(Config(2), window_s=0.1), limits=limits)
            for _ in range(2)
        )
    finally:
        runner.close()
    assert first.extra["warnings"] and "Rows.f (an open file)" in first.extra["warnings"][0]
    assert second.extra["warnings"] == []
