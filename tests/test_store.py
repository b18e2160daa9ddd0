"""Tests of loadertune.results.store: reading, merging and atomically replacing the recommendation
file."""

from __future__ import annotations

import functools
import json
import os
import re
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import loadertune
from loadertune.errors import NoRecommendationError, PartialNotSaved, RecommendationFileError
from loadertune.results import store


def _entry(bs: int = 64, **extra: object) -> dict[str, object]:
    return {"loader_kwargs": {"batch_size": bs, "num_workers": 2}, **extra}


def _flat(doc: dict) -> dict[str, object]:
    """Machine key -> its only entry (these tests save one workload per machine)."""
    out = {}
    for key, machine in doc["machines"].items():
        ((entry,),) = [list(machine["workloads"].values())]
        out[key] = entry
    return out


def _backups(path: Path) -> list[Path]:
    return sorted(path.parent.glob(f"{path.name}.corrupt-*"))


def test_read_missing_file_is_empty_document(tmp_path: Path) -> None:
    doc = store.read(tmp_path / "nope.json")
    assert doc == {"schema": store.SCHEMA, "schema_version": store.SCHEMA_VERSION, "machines": {}}
    assert not (tmp_path / "nope.json").exists()


def test_save_creates_file_and_directories(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "rec.json"
    written = store.save_entry(path, "cpu-x2+nogpu", _entry())
    assert written == path
    doc = json.loads(path.read_text())
    assert doc["schema"] == store.SCHEMA
    assert doc["schema_version"] == store.SCHEMA_VERSION
    assert _flat(doc) == {"cpu-x2+nogpu": _entry()}


def test_save_accepts_str_path(tmp_path: Path) -> None:
    path = tmp_path / "rec.json"
    assert store.save_entry(str(path), "k", _entry()) == path
    assert _flat(store.read(str(path)))["k"] == _entry()


def test_save_merges_entries_of_two_keys(tmp_path: Path) -> None:
    path = tmp_path / "rec.json"
    store.save_entry(path, "machine-a", _entry(32))
    store.save_entry(path, "machine-b", _entry(128))
    machines = _flat(store.read(path))
    assert machines == {"machine-a": _entry(32), "machine-b": _entry(128)}


def test_save_replaces_the_entry_of_the_same_key(tmp_path: Path) -> None:
    path = tmp_path / "rec.json"
    store.save_entry(path, "machine-a", _entry(32))
    store.save_entry(path, "machine-b", _entry(128))
    store.save_entry(path, "machine-a", _entry(256, note="again"))
    machines = _flat(store.read(path))
    assert machines["machine-a"] == _entry(256, note="again")
    assert machines["machine-b"] == _entry(128)


def test_save_keeps_unknown_top_level_fields(tmp_path: Path) -> None:
    path = tmp_path / "rec.json"
    path.write_text(
        json.dumps(
            {
                "schema": store.SCHEMA,
                "schema_version": 1,
                "comment": "mine",
                "machines": {"old": _entry(8)},
            }
        )
    )
    store.save_entry(path, "new", _entry(16))
    doc = store.read(path)
    assert doc["comment"] == "mine"
    assert set(doc["machines"]) == {"old", "new"}


def test_save_leaves_no_temporary_files(tmp_path: Path) -> None:
    path = tmp_path / "rec.json"
    for i in range(3):
        store.save_entry(path, f"k{i}", _entry())
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []
    visible = [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")]
    assert visible == ["rec.json"]  # the lock file, if it stays, is hidden


def test_save_writes_non_json_values_as_text(tmp_path: Path) -> None:
    path = tmp_path / "rec.json"
    store.save_entry(path, "k", _entry(where=tmp_path))
    assert _flat(store.read(path))["k"]["where"] == str(tmp_path)


# -- mode, owner, permissions (issue 14) ---------------------------------------------------------


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o664], ids=oct)
def test_save_keeps_the_files_mode(tmp_path: Path, mode: int) -> None:
    """A shared file stays readable to the others who read it."""
    path = tmp_path / "rec.json"
    store.save_entry(path, "a", _entry())
    path.chmod(mode)
    store.save_entry(path, "b", _entry())
    assert stat.S_IMODE(path.stat().st_mode) == mode
    assert set(store.read(path)["machines"]) == {"a", "b"}


def test_a_new_file_gets_the_mode_open_would_give_it(tmp_path: Path) -> None:
    mask = os.umask(0o027)
    try:
        store.save_entry(tmp_path / "rec.json", "a", _entry())
    finally:
        os.umask(mask)
    assert stat.S_IMODE((tmp_path / "rec.json").stat().st_mode) == 0o640


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file to another user")
def test_save_keeps_the_files_owner(tmp_path: Path) -> None:
    path = tmp_path / "rec.json"
    store.save_entry(path, "a", _entry())
    os.chown(path, 65534, 65534)
    store.save_entry(path, "b", _entry())
    assert (path.stat().st_uid, path.stat().st_gid) == (65534, 65534)


def test_a_read_only_file_is_not_replaced(tmp_path: Path) -> None:
    path = tmp_path / "rec.json"
    store.save_entry(path, "a", _entry())
    path.chmod(0o444)
    before = path.read_bytes()
    with pytest.raises(RecommendationFileError, match=r"is read-only"):
        store.save_entry(path, "b", _entry())
    assert path.read_bytes() == before
    with pytest.raises(RecommendationFileError, match=r"is read-only \(mode 444\).*chmod u\+w"):
        store.check_writable(path)


def _unwritable_folders(tmp_path: Path) -> list[Path]:
    """Folders that refuse new files, for real: sysfs always (root included), and a 555 folder
    when not root (root may write there)."""
    folders = [Path("/sys/kernel")] if Path("/sys/kernel").is_dir() else []
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o555)
        folders.append(locked)
    return folders


def test_an_unwritable_folder_is_a_clear_error_at_once(tmp_path: Path) -> None:
    folders = _unwritable_folders(tmp_path)
    if not folders:
        pytest.skip("no folder here refuses new files")
    for folder in folders:
        for path in (folder / "rec.json", folder / "sub" / "rec.json"):
            t0 = time.monotonic()
            with pytest.raises(RecommendationFileError, match=r"cannot create files in the folder"):
                store.save_entry(path, "a", _entry())
            assert time.monotonic() - t0 < 5  # not the lock's 30 s timeout
            with pytest.raises(RecommendationFileError, match=re.escape(str(folder))):
                store.check_writable(path)


# -- entries per machine and workload (issue 14) -------------------------------------------------


def _script(folder: Path, name: str, line: int, bs: int = 16, **extra: object) -> dict[str, object]:
    """An entry of script ``folder/name``, its loader created at line ``line``."""
    workload = {"kind": "script", "script": str(folder / name), "call_site": f"{name}:{line}"}
    return {"loader_kwargs": {"batch_size": bs}, "workload": workload, **extra}


def test_workload_keys(tmp_path: Path) -> None:
    key = store.workload_key
    assert key({"kind": "script", "script": "train.py", "call_site": "train.py:42"}) == (
        "script train.py:42"
    )
    assert key({"kind": "script", "script": "./src/train.py", "call_site": "src/data.py:7"}) == (
        "script src/train.py @ data.py:7"
    )
    assert key({"kind": "script", "script": "train.py"}) == "script train.py"
    assert key({"kind": "dataset", "dataset": "pkg.Images"}) == "dataset pkg.Images"
    assert key(None) == key({}) == key({"kind": "script"}) == store.UNKNOWN_WORKLOAD
    # relative to the file's folder, wherever the search ran
    script = tmp_path / "proj" / "train.py"
    workload = {"kind": "script", "script": str(script), "call_site": "x/train.py:3"}
    assert key(workload, file=tmp_path / "proj" / "rec.json") == "script train.py:3"
    assert key(workload, file=tmp_path / "rec.json") == "script proj/train.py:3"


def test_two_workloads_of_one_machine_are_both_kept(tmp_path: Path) -> None:
    entry = functools.partial(_script, tmp_path)
    path = tmp_path / "rec.json"
    store.save_entry(path, "box", entry("a.py", 5, bs=16))
    store.save_entry(path, "box", entry("b.py", 9, bs=64))
    store.save_entry(path, "other", entry("a.py", 5, bs=8))
    entries = store.entries_for(path, "box")
    assert {k: e["loader_kwargs"]["batch_size"] for k, e in entries.items()} == {
        "script a.py:5": 16,
        "script b.py:9": 64,
    }
    assert store.entry_for(path, "box", "script b.py:9")["loader_kwargs"] == {"batch_size": 64}
    store.save_entry(path, "box", entry("a.py", 5, bs=32))  # the same workload: replaced
    assert store.entry_for(path, "box", "script a.py:5")["loader_kwargs"] == {"batch_size": 32}
    assert len(store.entries_for(path, "box")) == 2


def test_entry_for_says_which_workloads_there_are(tmp_path: Path) -> None:
    entry = functools.partial(_script, tmp_path)
    path = tmp_path / "rec.json"
    store.save_entry(path, "box", entry("a.py", 5))
    assert store.entry_for(path, "box") == entry("a.py", 5)  # the only one: no need to say
    with pytest.raises(NoRecommendationError, match=r"no entry for script c.py:1 on this machine"):
        store.entry_for(path, "box", "script c.py:1")
    store.save_entry(path, "box", entry("b.py", 9))
    with pytest.raises(
        NoRecommendationError,
        match=r"2 entries for this machine \(box\), one per workload: script a.py:5; "
        r"script b.py:9. Say which one",
    ):
        store.entry_for(path, "box")
    with pytest.raises(NoRecommendationError, match=r"other workloads only: script a.py:5"):
        store.entry_for(path, "box", "script c.py:1")


def test_a_dataset_class_tuned_as_main_is_named_when_its_module_is_imported(
    tmp_path: Path,
) -> None:
    """``tune_loader`` in a script keys its dataset ``__main__.Docs``; the training code that
    imports it asks for ``mod.Docs``. The error names the entry to pass, and tells to tune a
    dataset with ``tune_loader`` (it said to run ``loadertune search``)."""
    path = tmp_path / "rec.json"
    entry = {"loader_kwargs": {"batch_size": 8, "num_workers": 1}, "samples_per_s": 1.0}
    store.save_entry(
        path, "box", {**entry, "workload": {"kind": "dataset", "dataset": "__main__.Docs"}}
    )
    store.save_entry(path, "box", {**entry, "workload": {"kind": "dataset", "dataset": "m.Other"}})
    with pytest.raises(NoRecommendationError, match=r'pass workload="dataset __main__.Docs"'):
        store.entry_for(path, "box", "dataset mod.Docs")
    with pytest.raises(NoRecommendationError, match=r"Tune it with tune_loader\(\) to add it"):
        store.entry_for(path, "box", "dataset mod.Images")


def test_a_partial_entry_never_replaces_a_complete_one(tmp_path: Path) -> None:
    entry = functools.partial(_script, tmp_path)
    path = tmp_path / "rec.json"
    store.save_entry(path, "box", entry("a.py", 5, bs=16))
    before = path.read_bytes()
    with pytest.raises(PartialNotSaved, match=r"holds a complete result for script a.py:5"):
        store.save_entry(path, "box", entry("a.py", 5, bs=64, partial=True))
    assert path.read_bytes() == before
    store.save_entry(path, "box", entry("b.py", 9, bs=64, partial=True))  # another workload
    store.save_entry(path, "box", entry("b.py", 9, bs=32, partial=True))  # partial over partial
    store.save_entry(path, "box", entry("b.py", 9, bs=8))  # complete over partial
    assert store.entry_for(path, "box", "script b.py:9") == entry("b.py", 9, bs=8)


def test_a_version_1_file_is_read_and_written_back_as_version_2(tmp_path: Path) -> None:
    entry = functools.partial(_script, tmp_path)
    path = tmp_path / "rec.json"
    saved = entry("a.py", 5)
    saved["workload"]["script"] = "a.py"  # as given to the search, in the file's folder
    v1 = {
        "schema": store.SCHEMA,
        "schema_version": 1,
        "machines": {"box": saved, "old": {"loader_kwargs": {"batch_size": 4}}},
    }
    path.write_text(json.dumps(v1))
    assert store.entry_for(path, "box") == saved
    assert store.entry_for(path, "old") == {"loader_kwargs": {"batch_size": 4}}
    assert set(store.entries_for(path, "box")) == {"script a.py:5"}
    assert set(store.entries_for(path, "old")) == {store.UNKNOWN_WORKLOAD}
    store.save_entry(path, "box", entry("b.py", 9))
    doc = json.loads(path.read_text())
    assert doc["schema_version"] == 2
    assert set(doc["machines"]["box"]["workloads"]) == {"script a.py:5", "script b.py:9"}
    assert doc["machines"]["old"] == {"workloads": {"unknown": v1["machines"]["old"]}}


# -- unreadable files -----------------------------------------------------------------------------

_HEAD = '{"schema": "loadertune.recommendations", '
_BAD_FILES = {
    "corrupt_json": (_HEAD + '"machines": {', r"is not valid JSON"),
    "empty_file": ("", r"is not valid JSON"),
    "wrong_schema": ('{"foo": 1, "machines": {}}', r"is not a loadertune recommendation file"),
    "json_list": ("[1, 2, 3]", r"is not a loadertune recommendation file"),
    "newer_version": (
        _HEAD + '"schema_version": 3, "machines": {}}',
        r"has schema_version 3; this loadertune reads version 2",
    ),
    "version_zero": (_HEAD + '"schema_version": 0, "machines": {}}', r"has schema_version 0"),
    "version_text": (_HEAD + '"schema_version": "1", "machines": {}}', r"has schema_version '1'"),
    "no_version": (
        '{"schema": "loadertune.recommendations", "machines": {}}',
        r"has schema_version None",
    ),
    "machines_not_object": (
        '{"schema": "loadertune.recommendations", "schema_version": 1, "machines": []}',
        r"has no \"machines\" object",
    ),
}


@pytest.fixture(params=sorted(_BAD_FILES))
def bad_file(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, str, str]:
    text, pattern = _BAD_FILES[request.param]
    path = tmp_path / "rec.json"
    path.write_text(text)
    return path, text, pattern


def test_read_bad_file_raises_naming_the_file(bad_file: tuple[Path, str, str]) -> None:
    path, _, pattern = bad_file
    with pytest.raises(RecommendationFileError, match=re.escape(str(path)) + ".*" + pattern):
        store.read(path)


def test_save_refuses_bad_file_and_leaves_it_alone(bad_file: tuple[Path, str, str]) -> None:
    path, text, pattern = bad_file
    before = path.read_bytes()
    with pytest.raises(RecommendationFileError, match=re.escape(str(path)) + ".*" + pattern):
        store.save_entry(path, "k", _entry())
    assert path.read_bytes() == before == text.encode()
    assert _backups(path) == []


def test_save_with_force_replaces_bad_file_keeping_a_copy(bad_file: tuple[Path, str, str]) -> None:
    path, text, _ = bad_file
    store.save_entry(path, "k", _entry(), force=True)
    assert _flat(store.read(path)) == {"k": _entry()}
    backups = _backups(path)
    assert len(backups) == 1
    assert backups[0].parent == path.parent
    assert backups[0].read_text() == text


def test_entry_for_bad_file_raises(bad_file: tuple[Path, str, str]) -> None:
    path, _, pattern = bad_file
    with pytest.raises(RecommendationFileError, match=pattern):
        store.entry_for(path, "k")


def test_force_does_not_touch_a_good_file(tmp_path: Path) -> None:
    path = tmp_path / "rec.json"
    store.save_entry(path, "a", _entry(1))
    store.save_entry(path, "b", _entry(2), force=True)
    assert set(store.read(path)["machines"]) == {"a", "b"}
    assert _backups(path) == []


# -- entry_for ------------------------------------------------------------------------------------


def test_entry_for_returns_the_entry(tmp_path: Path) -> None:
    path = tmp_path / "rec.json"
    store.save_entry(path, "a", _entry(32))
    store.save_entry(path, "b", _entry(64))
    assert store.entry_for(path, "b") == _entry(64)


def test_entry_for_unknown_key_lists_keys_present(tmp_path: Path) -> None:
    path = tmp_path / "rec.json"
    store.save_entry(path, "zeta-x2cpu+nogpu", _entry())
    store.save_entry(path, "alpha-x8cpu+nvidia-h100-x1", _entry())
    with pytest.raises(
        NoRecommendationError,
        match=r"no entry for this machine \(mine\); it has: "
        r"alpha-x8cpu\+nvidia-h100-x1, zeta-x2cpu\+nogpu",
    ):
        store.entry_for(path, "mine")


def test_entry_for_empty_file_says_none(tmp_path: Path) -> None:
    path = tmp_path / "rec.json"
    path.write_text(json.dumps(store.read(path)))
    with pytest.raises(NoRecommendationError, match=r"it has: none"):
        store.entry_for(path, "mine")


def test_entry_for_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "missing.json"
    with pytest.raises(NoRecommendationError, match=re.escape(str(path)) + r" does not exist"):
        store.entry_for(path, "k")


def test_no_recommendation_error_is_a_lookup_error(tmp_path: Path) -> None:
    with pytest.raises(LookupError):
        store.entry_for(tmp_path / "missing.json", "k")
    assert issubclass(NoRecommendationError, loadertune.LoadertuneError)


def test_entry_for_entry_without_loader_kwargs(tmp_path: Path) -> None:
    path = tmp_path / "rec.json"
    store.save_entry(path, "k", {"samples_per_s": 10.0})
    with pytest.raises(RecommendationFileError, match=r"entry for k has no \"loader_kwargs\""):
        store.entry_for(path, "k")


# -- two processes at once ------------------------------------------------------------------------

_N_SAVES = 100

# Loads loadertune.results.store without the package's __init__ (which imports torch and optuna),
# so each child starts in a fraction of a second. The code under test is the same file.
_CHILD = textwrap.dedent(
    """
    import os, sys, time, types
    pkg = types.ModuleType("loadertune")
    pkg.__path__ = [sys.argv[1]]
    sys.modules["loadertune"] = pkg
    from loadertune import store
    path, key, go, n = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
    deadline = time.monotonic() + 30
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            sys.exit("never told to go")
        time.sleep(0.001)
    for i in range(n):
        entry = {"loader_kwargs": {"batch_size": i + 1}, "i": i, "pid": os.getpid()}
        store.save_entry(path, key, entry)
    """
)


def test_concurrent_saves_from_two_processes_both_land(tmp_path: Path) -> None:
    """Two processes merge into one file at once: no lost entry, and the file always parses."""
    path = tmp_path / "rec.json"
    go = tmp_path / "go"
    pkg_dir = str(Path(store.__file__).parent)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CHILD, pkg_dir, str(path), key, str(go), str(_N_SAVES)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for key in ("machine-a", "machine-b")
    ]
    try:
        go.touch()
        seen: dict[str, int] = {}
        while any(p.poll() is None for p in procs):
            if path.exists():
                machines = _flat(store.read(path))  # must parse at every moment
                # An entry, once written, is never lost or rolled back by the other process.
                assert set(seen) <= set(machines)
                for key, entry in machines.items():
                    assert entry["i"] >= seen.get(key, -1)
                    seen[key] = entry["i"]
            time.sleep(0.002)
        outputs = [p.communicate(timeout=30) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err.decode()
    doc = store.read(path)
    assert set(doc["machines"]) == {"machine-a", "machine-b"}
    for entry in _flat(doc).values():
        assert entry["i"] == _N_SAVES - 1
        assert entry["loader_kwargs"] == {"batch_size": _N_SAVES}
    assert _flat(doc)["machine-a"]["pid"] != _flat(doc)["machine-b"]["pid"]
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_entries_are_picked_for_the_world_size() -> None:
    one = {"loader_kwargs": {"num_workers": 4}, "workload": {"kind": "script", "script": "t.py"}}
    two = {"loader_kwargs": {"num_workers": 2}, "workload": {"kind": "script", "world_size": 2}}
    entries = {"script t.py:3": one, "script t.py:3 [2 ranks]": two}
    assert store.for_world_size(entries, 2) == ({"script t.py:3 [2 ranks]": two}, None)
    assert store.for_world_size(entries, 1)[0] == {"script t.py:3": one}
    picked, warning = store.for_world_size(entries, 4)
    assert picked == {"script t.py:3 [2 ranks]": two}
    assert warning is not None and "world size 4" in warning and "--nproc-per-node 4" in warning
    assert store.workload_key({**two["workload"], "script": "t.py", "call_site": "t.py:3"}) == (
        "script t.py:3 [2 ranks]"
    )
