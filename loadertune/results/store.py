"""The recommendation file: one JSON document, one entry per machine (CPU/GPU pairing) and
workload (what was tuned).

::

    {
      "schema": "loadertune.recommendations",
      "schema_version": 2,
      "machines": {
        "<hardware key>": {
          "workloads": {
            "<workload key>": { "loader_kwargs": {...}, "workload": {...}, "winner": {...}, ... }
          }
        }
      }
    }

A workload key (:func:`workload_key`, in :mod:`loadertune.results.keys`) names the script,
relative to the file's folder, and the line that creates its loader (``script train.py:42``), or
the dataset's type for ``tune_loader`` (``dataset mypkg.data.Images``). Version 1 files (one entry
per machine) are read as version 2, each entry under its own workload's key, and written back as
version 2.

Saving merges: the other machines' and workloads' entries survive, and a partial entry (an
interrupted search) never replaces a complete one. The new document is written to a temporary
file in the same directory, flushed to disk and renamed over the old one, all under a lock file
(``.<file>.lock``, hidden beside it), so two searches saving at once both land and a crash never
leaves half a file.
The new file gets the old one's mode and owner (a shared 644 file stays readable to others); a
new file gets the mode ``open()`` would give it. A read-only file (no write permission) is never
replaced, and a folder that cannot be written is an error: :func:`check_writable` says so before
a search starts.
A file that does not parse, or that has an unknown schema, is an error naming the file; it is
replaced only with ``force=True``, and then kept beside it as ``<file>.corrupt-<time>``.
"""

from __future__ import annotations

import contextlib
import json
import os
import reprlib
import shutil
import stat
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from loadertune.config import Config
from loadertune.errors import (
    ConfigError,
    NoRecommendationError,
    PartialNotSaved,
    RecommendationFileError,
)
from loadertune.results.keys import (
    UNKNOWN_WORKLOAD,
    for_world_size,
    of_script,
    script_name,
    workload_key,
    world_size,
)

# The workload keys (workload_keys.py) are the file's keys: they are imported from here too.
__all__ = [
    "LOCK_TIMEOUT_S",
    "SCHEMA",
    "SCHEMA_VERSION",
    "UNKNOWN_WORKLOAD",
    "check_writable",
    "entries_for",
    "entry_for",
    "entry_problem",
    "for_world_size",
    "of_script",
    "read",
    "save_entry",
    "script_name",
    "workload_key",
    "workloads_of",
    "world_size",
]

SCHEMA = "loadertune.recommendations"
SCHEMA_VERSION = 2
LOCK_TIMEOUT_S = 30.0


def partial_why(entry: dict[str, Any]) -> str | None:
    """Why ``entry`` holds a best-so-far, not a finished search (``"partial": true``, by
    :func:`loadertune.api.saved.save_partial`), in words; None for a finished one."""
    if not entry.get("partial"):
        return None
    if (entry.get("search") or {}).get("stop_reason") == "run_ended":
        return "the training run ended before its tuning did"
    return "an interrupted search"


def _empty() -> dict[str, Any]:
    return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "machines": {}}


def read(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The document at ``path`` (an empty one if the file does not exist).

    Raises:
        RecommendationFileError: the file is not valid JSON, or not a recommendation file of a
            schema version this loadertune reads.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return _empty()
    except OSError as exc:
        raise RecommendationFileError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecommendationFileError(
            f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}). "
            "Fix or move the file; `loadertune search --force` replaces it (keeping a copy)."
        ) from exc
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise RecommendationFileError(
            f'{path} is not a loadertune recommendation file (no "schema": "{SCHEMA}"). '
            "Choose another file (search's --out, run's and show's --file), or replace it "
            "with `loadertune search --force` (keeping a copy)."
        )
    version = doc.get("schema_version")
    if not isinstance(version, int) or version > SCHEMA_VERSION or version < 1:
        raise RecommendationFileError(
            f"{path} has schema_version {version!r}; this loadertune reads version "
            f"{SCHEMA_VERSION}. Upgrade loadertune, or use another file (search's --out, run's "
            "and show's --file)."
        )
    if not isinstance(doc.get("machines"), dict):
        raise RecommendationFileError(f'{path} has no "machines" object; the file is damaged.')
    if version == 1:
        doc["machines"] = {
            key: {"workloads": {workload_key(_workload_of(entry, path), file=path): entry}}
            for key, entry in doc["machines"].items()
        }
        doc["schema_version"] = SCHEMA_VERSION
    return doc


def _workload_of(entry: object, path: Path) -> object:
    """A version 1 entry's workload, its script's path taken as relative to the file's folder
    (where the search that saved it ran, most likely; its own folder is not recorded)."""
    workload = entry.get("workload") if isinstance(entry, dict) else None
    if isinstance(workload, dict) and isinstance(workload.get("script"), str):
        script = os.path.join(os.path.dirname(os.path.abspath(path)), workload["script"])
        return {**workload, "script": script}
    return workload


def workloads_of(machine: object) -> dict[str, Any] | None:
    """A machine's entries by workload key; None when the machine's record is damaged."""
    if isinstance(machine, dict) and isinstance(machine.get("workloads"), dict):
        return machine["workloads"]
    return None


def _umask() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # no /proc: read it the only other way (briefly process-wide)
    os.umask(mask)
    return mask


def _existing_folder(folder: Path) -> Path:
    """``folder``, or its nearest ancestor that exists (saving creates the rest)."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def check_writable(path: str | os.PathLike[str], *, option: str = "--out") -> None:
    """Raise unless saving to ``path`` can work: the file, if it exists, is writable, and a file
    can be created in its folder. Tried for real (a probe file), so read-only file systems and
    folders that refuse new files are found too. ``option``: the command's option that names
    the file, for the message.

    Raises:
        RecommendationFileError: saying what is wrong and what to do.
    """
    path = Path(path)
    try:
        st: os.stat_result | None = path.stat()
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise RecommendationFileError(f"cannot use {path}: {exc.strerror or exc}") from exc
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise RecommendationFileError(f"{path} is a folder; pass a file name with {option}.")
    if st is not None and (not st.st_mode & 0o222 or not os.access(path, os.W_OK)):
        raise RecommendationFileError(
            f"{path} is read-only (mode {stat.S_IMODE(st.st_mode):o}), so loadertune will not "
            f"replace it. Make it writable (chmod u+w {path}), or choose another file with "
            f"{option}."
        )
    folder = _existing_folder(path.parent)
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=folder)
    except OSError as exc:
        raise RecommendationFileError(
            f"cannot create files in the folder {folder} ({exc.strerror or exc}), so {path} "
            f"cannot be saved. Choose a file in a writable folder with {option}, or make this "
            "one writable."
        ) from exc
    os.close(fd)
    os.unlink(probe)


def _write_atomic(path: Path, doc: dict[str, Any]) -> None:
    """Replace ``path`` with ``doc``: a temporary file with the old file's mode and owner,
    flushed, then renamed over it."""
    try:
        old: os.stat_result | None = path.stat()
    except FileNotFoundError:
        old = None
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, stat.S_IMODE(old.st_mode) if old else 0o666 & ~_umask())
        if old is not None and (old.st_uid, old.st_gid) != (os.geteuid(), os.getegid()):
            with contextlib.suppress(PermissionError):  # only root may give a file away
                os.fchown(fd, old.st_uid, old.st_gid)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2, sort_keys=False, default=str)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def save_entry(
    path: str | os.PathLike[str],
    key: str,
    entry: dict[str, Any],
    *,
    workload: str | None = None,
    force: bool = False,
) -> Path:
    """Merge ``entry`` under machine ``key`` and its workload into the file at ``path``; return
    the path written.

    Args:
        path: the recommendation file (created with its directory if missing).
        key: the hardware key (:attr:`loadertune.hardware.Hardware.key`).
        entry: the entry (JSON-able); ``entry["workload"]`` says what was tuned.
        workload: the workload key (default: :func:`workload_key` of ``entry["workload"]``).
        force: replace a file that cannot be read, after copying it aside.

    Raises:
        PartialNotSaved: ``entry`` is partial and the file holds a complete one for the same
            machine and workload (which is kept).
        RecommendationFileError: the file cannot be read (without ``force``), is read-only, or
            its folder cannot be written.
    """
    path = Path(path)
    wkey = workload or workload_key(entry.get("workload"), file=path)
    check_writable(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RecommendationFileError(
            f"cannot create the folder {path.parent}: {exc.strerror or exc}"
        ) from exc
    lock_path = path.with_name(f".{path.name}.lock")
    lock = FileLock(lock_path, timeout=LOCK_TIMEOUT_S)
    try:
        with lock:
            try:
                doc = read(path)
            except RecommendationFileError:
                if not force:
                    raise
                backup = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
                shutil.copy2(path, backup)
                doc = _empty()
            doc["schema_version"] = SCHEMA_VERSION
            workloads = workloads_of(doc["machines"].get(key))
            if workloads is None:  # new, or damaged: this machine's record starts afresh
                workloads = {}
                doc["machines"][key] = {"workloads": workloads}
            old = workloads.get(wkey)
            if entry.get("partial") and isinstance(old, dict) and not old.get("partial"):
                raise PartialNotSaved(
                    f"{path} holds a complete result for {wkey} on this machine, which a "
                    "partial one never replaces; it was kept (run the search to its end to "
                    "replace it)."
                )
            workloads[wkey] = entry
            _write_atomic(path, doc)
    except Timeout as exc:
        raise RecommendationFileError(
            f"{path} is locked by another process (lock file {lock_path}) for over "
            f"{LOCK_TIMEOUT_S:.0f} s; if no loadertune is running, delete the lock file."
        ) from exc
    return path


def entries_for(path: str | os.PathLike[str], key: str) -> dict[str, Any]:
    """Machine ``key``'s entries, by workload key.

    Raises:
        NoRecommendationError: the file is missing or has no entry for ``key``; the message
            lists the machines it does have.
        RecommendationFileError: the file, or this machine's record in it, is damaged.
    """
    path = Path(path)
    if not path.exists():
        raise NoRecommendationError(f"{path} does not exist; run `loadertune search` first.")
    machines = read(path)["machines"]
    if key not in machines:
        have = ", ".join(sorted(machines)) or "none"
        raise NoRecommendationError(
            f"{path} has no entry for this machine ({key}); it has: {have}. "
            "Run `loadertune search` here to add one."
        )
    workloads = workloads_of(machines[key])
    if workloads is None:
        raise RecommendationFileError(
            f'{path}: the record of {key} has no "workloads" object; it is damaged. '
            "Run `loadertune search` again to replace it."
        )
    if not workloads:
        raise NoRecommendationError(f"{path} has no entry for this machine ({key}).")
    return workloads


def _how_to_add(workload: str, workloads: Mapping[str, Any]) -> str:
    """What to do about a workload the file has no entry for: a dataset's class tuned where its
    module ran as ``__main__`` (a script calling ``tune_loader``) has another key when imported;
    a dataset is tuned by ``tune_loader``, a script by ``loadertune search``."""
    if not workload.startswith("dataset "):
        return "Run `loadertune search` on this one to add it."
    name = workload.removeprefix("dataset ").rsplit(".", 1)[-1]
    ran_as_main = f"dataset __main__.{name}"
    if ran_as_main in workloads:
        return (
            f"If {ran_as_main} is the same class, tuned where its module ran as a script, pass "
            f'workload="{ran_as_main}"; else tune this one with tune_loader() to add it.'
        )
    return "Tune it with tune_loader() to add it."


def entry_for(
    path: str | os.PathLike[str], key: str, workload: str | None = None
) -> dict[str, Any]:
    """The entry for machine ``key`` and ``workload`` (a workload key); without ``workload``,
    the machine's only entry.

    Raises:
        NoRecommendationError: the file is missing, or has no entry for ``key`` (the message
            lists the machines it has) or for ``workload`` on it (it lists the workloads), or
            several for ``key`` and no ``workload`` was named.
        RecommendationFileError: the file or the entry is damaged.
    """
    workloads = entries_for(path, key)
    have = "; ".join(sorted(workloads))
    if workload is None:
        if len(workloads) > 1:
            raise NoRecommendationError(
                f"{path} has {len(workloads)} entries for this machine ({key}), one per "
                f"workload: {have}. Say which one (`--workload` on the command line, "
                "`workload=` in Python)."
            )
        ((workload, entry),) = workloads.items()
    elif workload in workloads:
        entry = workloads[workload]
    else:
        raise NoRecommendationError(
            f"{path} has no entry for {workload} on this machine ({key}); it has entries "
            f"for other workloads only: {have}. {_how_to_add(workload, workloads)}"
        )
    problem = entry_problem(entry)
    if problem is not None:
        which = "" if workload == UNKNOWN_WORKLOAD else f" ({workload})"
        raise RecommendationFileError(
            f"{path}: the entry for {key}{which} {problem}. "
            "Run `loadertune search` again to replace it."
        )
    return entry


def _kind(value: object) -> str:
    return f"{type(value).__name__} {reprlib.repr(value)}"


def entry_problem(entry: object) -> str | None:
    """What makes a file's entry unusable, as the end of "the entry ..."; None if it is usable.

    Checks what is read from it: an object, with ``loader_kwargs`` that build a valid setting,
    and numbers where numbers are expected.
    """
    if not isinstance(entry, dict):
        return f"is a {_kind(entry)}, not an object"
    kwargs = entry.get("loader_kwargs")
    if kwargs is None:
        return 'has no "loader_kwargs"'
    if not isinstance(kwargs, dict):
        return f'has "loader_kwargs" that is a {_kind(kwargs)}, not a mapping'
    try:
        Config.from_kwargs(kwargs, batch_size=1)
    except (ConfigError, TypeError, ValueError) as exc:
        return f'has "loader_kwargs" that are not a valid setting ({exc})'
    for name in ("samples_per_s", "speedup"):
        value = entry.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            return f'has "{name}" that is a {_kind(value)}, not a number'
    return None
