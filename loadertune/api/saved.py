"""Saved settings in use: ``load_recommendation`` (for your own code), ``run_script`` (what
``loadertune run`` does: apply them to a script's loaders and run it for real), and
``save_partial`` (the best so far of an interrupted search)."""

from __future__ import annotations

import datetime as _dt
import os
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from loadertune import hardware
from loadertune.errors import (
    NoRecommendationError,
    RecommendationFileError,
    SearchInterrupted,
)
from loadertune.results import store

if TYPE_CHECKING:
    from loadertune.trials.inside.apply_saved import ApplySaved
    from loadertune.trials.inside.patch import Controller


def current_world_size() -> int:
    """This process's world size, as torch's launcher says it (1 outside a launcher)."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def load_recommendation(
    path: str | os.PathLike[str] = "loadertune.json",
    *,
    hardware_key: str | None = None,
    workload: object = None,
) -> dict[str, Any]:
    """The saved DataLoader keyword arguments for this machine (and workload).

    Args:
        path: the recommendation file.
        hardware_key: another machine's key (default: this machine's).
        workload: which workload's entry, when the file holds several for the machine: the
            dataset you tuned (its type picks the entry), or a workload key as ``loadertune
            show`` prints it (``"script train.py:42"``). None: the machine's only entry, or
            its only entry for this world size (``$WORLD_SIZE``, set by torch's launcher; with
            a warning, the nearest size tuned when this one was not).

    Raises:
        NoRecommendationError: no entry for the machine, or for the workload (the message lists
            those there are), or several and no ``workload`` named.
        RecommendationFileError: the file is not a readable recommendation file.

    Example:
        >>> loader = DataLoader(dataset, **load_recommendation("loadertune.json"))
        >>> loader = DataLoader(dataset, **load_recommendation("loadertune.json", workload=dataset))
    """
    key = hardware_key or hardware.current_key()
    if workload is not None and not isinstance(workload, str):
        kind = type(workload)
        workload = store.workload_key(
            {"kind": "dataset", "dataset": f"{kind.__module__}.{kind.__qualname__}"}
        )
    if workload is None:  # several entries: the one for this world size, if it is one
        picked, warning = store.for_world_size(store.entries_for(path, key), current_world_size())
        if warning:
            warnings.warn(warning, stacklevel=2)
        if len(picked) == 1:
            (workload,) = picked
    return dict(store.entry_for(path, key, workload)["loader_kwargs"])


def apply_saved(
    script: str | os.PathLike[str], path: str | os.PathLike[str], report: Callable[[str], None]
) -> ApplySaved:
    """The controller applying this machine's entries for ``script``, each to the loader it was
    measured on (its key, call site and dataset)."""
    from loadertune.trials.inside.apply_saved import ApplySaved, SavedEntry

    workloads = store.entries_for(path, hardware.current_key())
    mine = store.of_script(workloads, script, file=path)
    if not mine and set(workloads) == {store.UNKNOWN_WORKLOAD}:
        mine = workloads  # an entry that does not say what it was measured on
    mine, warning = store.for_world_size(mine, current_world_size())
    if warning:
        report(f"loadertune: {warning}")
    if not mine:
        name = store.script_name(script, file=path)
        raise NoRecommendationError(
            f"{path} has no entry for {name} on this machine; it has entries for other "
            f"workloads only: {'; '.join(sorted(workloads))}. "
            f"Run `loadertune search {script}` to add one."
        )
    entries = []
    for wkey, entry in sorted(mine.items()):
        problem = store.entry_problem(entry)
        if problem is not None:
            raise RecommendationFileError(f"{path}: the entry for {wkey} {problem}.")
        entries.append(SavedEntry.from_entry(wkey, entry))
    return ApplySaved(entries, report=report)


def _quiet(line: str) -> None:
    pass


def run_script(
    script: str | os.PathLike[str],
    args: Sequence[str] = (),
    *,
    path: str | os.PathLike[str] = "loadertune.json",
    report: Callable[[str], None] = print,
    nproc_per_node: int | None = None,
) -> int:
    """Run a training script for real with this machine's saved settings for it applied to the
    loaders they were measured on.

    Prints (through ``report``) what was applied, or why nothing was: an entry for another
    workload only (another script) is never applied, nor an entry to a loader that is not the
    one it was measured on (another call site, dataset or way of creating it). Every loader's
    workers die with this process, however it dies (a SIGKILL included). Returns the
    script's exit status; the script's own exceptions propagate. With ``nproc_per_node``, the
    script runs as ``torchrun --standalone --nproc-per-node N`` runs it, each rank with the
    entry for that world size applied (rank 0 reports).
    """
    from loadertune.errors import LoadertuneError
    from loadertune.trials.inside.apply_saved import ApplySaved
    from loadertune.trials.script.runner import check_script

    check_script(script)
    if nproc_per_node is not None:
        return _run_ranks(script, args, path=path, nproc_per_node=nproc_per_node)
    if os.environ.get("RANK", "0") != "0":  # a rank of torch's launcher: rank 0 speaks for all
        report = _quiet
    try:
        controller = apply_saved(script, path, report)
    except LoadertuneError as exc:
        report(f"loadertune: running without changes: {exc}")
        controller = ApplySaved([], report=report)  # the workers' lifeline still
    return run_patched(controller, script, args, report, controller.unapplied)


def run_patched(
    controller: Controller,
    script: str | os.PathLike[str],
    args: Sequence[str],
    report: Callable[[str], None],
    said_at_end: Callable[[], list[str]],
) -> int:
    """Run ``script`` as ``__main__`` with every DataLoader going through ``controller``; the
    lines ``said_at_end()`` gives are reported however the script ends. Returns its exit
    status; its own exceptions propagate."""
    from loadertune.trials import leftovers
    from loadertune.trials.inside.child import run_as_main
    from loadertune.trials.inside.patch import patched

    leftovers.sweep()  # what an earlier run or search, killed, left in /tmp
    leftovers.own_temp_dir()  # this one's (a forkserver's socket) goes too, should it be killed
    try:
        with patched(controller):
            try:
                run_as_main(str(script), list(args))
            finally:
                for line in said_at_end():
                    report(line)
    except SystemExit as exc:
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0


def _run_ranks(
    script: str | os.PathLike[str],
    args: Sequence[str],
    *,
    path: str | os.PathLike[str],
    nproc_per_node: int,
) -> int:
    """``loadertune run`` in each rank of torch's launcher."""
    import subprocess
    import sys

    from loadertune.trials.script.launch import PARENT_ENV

    command = [
        sys.executable,
        "-m",
        "loadertune.trials.script.launch",
        "--standalone",
        f"--nproc-per-node={nproc_per_node}",
        "--module",
        "loadertune",
        "run",
        "--file",
        str(path),
        str(script),
        "--",
        *args,
    ]
    return subprocess.call(command, env={**os.environ, PARENT_ENV: str(os.getpid())})


def save_partial(
    path: str | os.PathLike[str],
    interrupted: SearchInterrupted,
    *,
    force: bool = False,
    run_ended: bool = False,
) -> str | None:
    """After an interrupted search, merge its best setting so far into ``path``, marked
    ``"partial": true``; ``run_ended``: not interrupted, but a tuning whose training run ended
    first (:func:`loadertune.results.store.partial_why` says which). Returns the path, or None when
    no trial had finished.

    Raises:
        PartialNotSaved: the file holds a complete entry for this machine and workload, which
            is kept.
    """
    if not interrupted.best:
        return None
    hw = hardware.detect()
    entry = {
        **interrupted.best,
        "partial": True,
        "workload": interrupted.workload or {},
        "hardware": hw.to_dict(),
        "measured_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "versions": hw.versions,
        "search": {
            "study_name": interrupted.study_name,
            "storage": interrupted.storage,
            "stop_reason": "run_ended" if run_ended else "interrupted",
            "n_complete": interrupted.n_complete,
        },
    }
    return str(store.save_entry(path, hw.key, entry, force=force))
