"""What a user reads when their own code raises: their file and line first, one line saying what
to do, and their frames, with loadertune's, torch's and Python's left out and marked."""

from __future__ import annotations

import subprocess
import sys
import traceback
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

from loadertune import UserCodeError, tune_loader
from loadertune.tracebacks import is_hidden, trim

from workloads import FaultDataset

SCRIPTS = Path(__file__).parent / "scripts"
WORKLOADS = str(Path(__file__).parent / "workloads.py")


def _frames(text: str) -> list[str]:
    return [line.split('"')[1] for line in text.splitlines() if line.strip().startswith('File "')]


def test_a_real_traceback_through_torch_keeps_only_the_users_frames() -> None:
    try:
        for _ in DataLoader(FaultDataset("raise", at=3), batch_size=4):
            pass
    except ValueError as exc:
        text = "".join(traceback.format_exception(exc))
    trimmed = trim(text)
    assert trimmed.hidden >= 3  # torch's fetch, next(), the list comprehension's frames
    assert all(not is_hidden(f) for f in _frames(trimmed.text))
    assert _frames(trimmed.text) == [__file__, WORKLOADS]
    assert "frames of loadertune, torch or Python left out]" in trimmed.text
    assert trimmed.origin is not None and trimmed.origin.startswith(f"{WORKLOADS}:")
    assert trimmed.origin.endswith(" in __getitem__")
    assert trimmed.exception is not None and trimmed.exception.startswith("ValueError: corrupt")


def test_text_without_a_traceback_is_kept() -> None:
    trimmed = trim("the script printed this\nand this")
    assert trimmed.text == "the script printed this\nand this"
    assert trimmed.origin is None and trimmed.hidden == 0


@pytest.mark.slow
def test_a_dataset_bug_in_a_worker_opens_with_the_users_file_and_line() -> None:
    with pytest.raises(UserCodeError) as info:
        tune_loader(
            FaultDataset("raise", at=10),
            batch_size=8,
            baseline={"num_workers": 2},
            budget_s=10,
            window_s=0.3,
            resume=False,
            verbose=False,
        )
    first, second, *rest = str(info.value).splitlines()
    assert first.startswith(f"{WORKLOADS}:")
    assert " in __getitem__: ValueError: corrupt sample" in first
    assert "bug in the dataset" in second and "fix the dataset" in second
    assert all(not is_hidden(f) for f in _frames("\n".join(rest)))
    # Raised from the API without loadertune's way down to the trial in its traceback.
    frames = traceback.extract_tb(info.value.__traceback__)
    assert [f.name for f in frames][:2] == [
        "test_a_dataset_bug_in_a_worker_opens_with_the_users_file_and_line",
        "tune_loader",
    ]
    assert len(frames) <= 3


@pytest.mark.slow
def test_the_cli_prints_a_script_dataset_bug_from_the_users_line(tmp_path: Path) -> None:
    script = SCRIPTS / "dataset_bug.py"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "loadertune",
            "search",
            str(script),
            "--out",
            str(tmp_path / "rec.json"),
            *("--budget", "20", "--fresh"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(str(script)))
    assert lines[at] == f"{script}:11 in __getitem__: ValueError: cannot decode sample 3"
    assert "fix the dataset" in lines[at + 1]
    shown = _frames("\n".join(lines[at:]))
    assert shown == [str(script), str(script)]  # the loop (line 15), then __getitem__ (line 11)
    assert "frames of loadertune, torch or Python left out]" in proc.stderr
