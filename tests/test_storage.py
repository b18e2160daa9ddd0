"""Where a search's study lives when none is named, and what happens when that cannot be."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loadertune.search.settings import StorageUnavailable, default_storage, storage_or_fallback

SCRIPTS = Path(__file__).parent / "scripts"


def test_the_default_storage_is_sqlite_in_the_cache_folder(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("LOADERTUNE_CACHE_DIR", str(tmp_path / "cache"))
    assert default_storage() == f"sqlite:///{tmp_path / 'cache' / 'studies.db'}"
    assert (tmp_path / "cache").is_dir()


def test_a_cache_folder_that_cannot_be_made_is_named(tmp_path, monkeypatch) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("LOADERTUNE_CACHE_DIR", str(blocker / "loadertune"))
    with pytest.raises(StorageUnavailable) as info:
        default_storage()
    assert info.value.root == blocker / "loadertune"


def test_the_fallback_is_a_writable_study_and_a_note_says_how_to_choose(
    tmp_path, monkeypatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("LOADERTUNE_CACHE_DIR", str(blocker / "loadertune"))
    notes: list[str] = []
    url = storage_or_fallback(notes.append)
    assert url.startswith("sqlite:///") and url.endswith("studies.db")
    folder = Path(url.removeprefix("sqlite:///")).parent
    assert folder.is_dir() and os.access(folder, os.W_OK)
    (note,) = notes
    assert "cannot be resumed" in note and "--storage" in note and "XDG_CACHE_HOME" in note
    assert str(blocker / "loadertune") in note
    folder.rmdir()


@pytest.mark.e2e
def test_search_with_an_unusable_cache_saves_its_recommendation(tmp_path: Path) -> None:
    """XDG_CACHE_HOME naming a file: the search says it cannot resume and saves its result."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    env = {k: v for k, v in os.environ.items() if k != "LOADERTUNE_CACHE_DIR"}
    env["XDG_CACHE_HOME"] = str(blocker)
    env["TMPDIR"] = str(tmp_path / "tmp")  # where the temporary study goes, and is removed
    (tmp_path / "tmp").mkdir()
    out = tmp_path / "rec.json"
    proc = subprocess.run(
        [sys.executable, "-m", "loadertune", "search", str(SCRIPTS / "style_alias.py"),
         "--out", str(out), "--budget", "8", "--trials", "2", "--window", "0.3", "--fresh"],
        capture_output=True, text=True, env=env, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = proc.stdout + proc.stderr
    assert "Traceback" not in text
    assert "cannot be resumed" in text and "--storage" in text
    assert json.loads(out.read_text())
    assert not list((tmp_path / "tmp").glob("loadertune-study-*"))  # it leaves nothing behind
