"""Which entry of a recommendation file is which: a machine's entries are keyed by workload
(what was tuned), and a workload key names the script, relative to the file's folder, and the
line that creates its loader (``script train.py:42``), or the dataset's type for ``tune_loader``
(``dataset mypkg.data.Images``); one tuned with several ranks says how many
(``script train.py:42 [2 ranks]``). :mod:`loadertune.results.store` files entries under these keys.
"""

from __future__ import annotations

import os
from typing import Any

UNKNOWN_WORKLOAD = "unknown"  # an entry that does not say what was tuned (hand-written, old)


def script_name(script: str | os.PathLike[str], *, file: str | os.PathLike[str] | None) -> str:
    """``script`` as the recommendation ``file`` names it: relative to the file's folder (the
    same on every machine that checks the project out); as given when no file is known."""
    if file is None:
        return os.path.normpath(script)
    return os.path.relpath(os.path.abspath(script), os.path.dirname(os.path.abspath(file)))


def workload_key(workload: object, *, file: str | os.PathLike[str] | None = None) -> str:
    """The key of a workload (:attr:`Recommendation.workload`) in the recommendation ``file``:

    - ``script train.py:42``: the script (see :func:`script_name`) and the line creating the
      loader; ``script train.py @ data.py:17`` when the loader is created in another file;
    - ``dataset mypkg.data.Images``: the dataset's type (``tune_loader``);
    - ``unknown`` when the workload does not say.
    """
    if not isinstance(workload, dict):
        return UNKNOWN_WORKLOAD
    kind = workload.get("kind")
    if kind == "dataset" and isinstance(workload.get("dataset"), str):
        return f"dataset {workload['dataset']}"
    if kind != "script" or not isinstance(workload.get("script"), str):
        return UNKNOWN_WORKLOAD
    script = script_name(workload["script"], file=file)
    size = world_size(workload)
    ranks = f" [{size} ranks]" if size > 1 else ""
    site = workload.get("call_site")
    if not isinstance(site, str) or ":" not in site:
        return f"script {script}{ranks}"
    site_file, _, line = site.rpartition(":")
    if os.path.basename(site_file) == os.path.basename(script):
        return f"script {script}:{line}{ranks}"
    return f"script {script} @ {os.path.basename(site_file)}:{line}{ranks}"


def world_size(workload: object) -> int:
    """The ranks a workload was tuned with (``torchrun --nproc-per-node``; 1 when not said)."""
    size = workload.get("world_size") if isinstance(workload, dict) else None
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else 1


def for_world_size(workloads: dict[str, Any], size: int) -> tuple[dict[str, Any], str | None]:
    """The entries of ``workloads`` tuned at ``size`` ranks, and None; when there are none, the
    entries of the nearest size tuned, and a warning that says so."""

    def size_of(entry: object) -> int:
        return world_size(entry.get("workload") if isinstance(entry, dict) else None)

    same = {k: e for k, e in workloads.items() if size_of(e) == size}
    if same or not workloads:
        return same, None
    sizes = sorted({size_of(e) for e in workloads.values()})
    nearest = min(sizes, key=lambda s: (abs(s - size), s))
    warning = (
        f"no entry was tuned at world size {size} (only at {', '.join(map(str, sizes))}); "
        f"using the one tuned at {nearest}: its workers per rank assume {nearest} ranks "
        f"sharing the machine. Tune at this size: loadertune search --nproc-per-node {size}"
    )
    return {k: e for k, e in workloads.items() if size_of(e) == nearest}, warning


def of_script(
    workloads: dict[str, Any], script: str | os.PathLike[str], *, file: str | os.PathLike[str]
) -> dict[str, Any]:
    """The entries of ``workloads`` (one machine's) that were measured on ``script``."""
    name = f"script {script_name(script, file=file)}"
    return {
        key: entry
        for key, entry in workloads.items()
        if key == name or key.startswith((f"{name}:", f"{name} @ "))
    }
