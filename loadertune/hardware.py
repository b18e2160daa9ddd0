"""The hardware fingerprint: the CPU/GPU pairing a recommendation is valid for.

What matters for DataLoader settings is what this process may *use*: the CPUs in its affinity
mask capped by the cgroup CPU quota (a container on a 64-core host with ``--cpus=4`` has 4), the
memory the cgroup allows, the size of ``/dev/shm`` (worker batches travel through it) and the
open-file limit (every in-flight batch holds descriptors). GPUs come from NVML, never from CUDA,
so that reading the fingerprint does not create a CUDA context.
"""

from __future__ import annotations

import math
import os
import platform
import re
import resource
import shutil
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import psutil

from loadertune.measure import nvml


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _own_cgroup(controller: str, proc_cgroup: str) -> tuple[str, str]:
    """This process's cgroup: its path in the v1 hierarchy of ``controller``, and in v2 (both
    "/" when ``proc_cgroup`` does not say)."""
    v1 = v2 = "/"
    for line in (_read(proc_cgroup) or "").splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers:
            v2 = path or "/"
        elif controller in controllers.split(","):
            v1 = path or "/"
    return v1, v2


def _up_from(base: str, path: str) -> list[str]:
    """``base/path`` and each of its ancestors up to ``base``: a parent's limit binds its
    children too. A folder not mounted here (the path of a cgroup namespace's outside) is
    skipped."""
    parts = [p for p in path.split("/") if p]
    return [os.path.join(base, *parts[:i]) for i in range(len(parts), -1, -1)]


def cgroup_cpu_quota(
    root: str = "/sys/fs/cgroup", proc_cgroup: str = "/proc/self/cgroup"
) -> float | None:
    """CPUs' worth of time the cgroup allows (v2 ``cpu.max``, else v1), the lowest over this
    process's cgroup and its ancestors; None if unlimited."""
    v1, v2 = _own_cgroup("cpu", proc_cgroup)
    found_v2 = False
    quotas: list[float] = []
    for folder in _up_from(root, v2):
        text = _read(f"{folder}/cpu.max")
        if text is None:
            continue
        found_v2 = True
        quota, _, period = text.partition(" ")
        if quota != "max" and period:
            quotas.append(int(quota) / int(period))
    if not found_v2:
        for folder in _up_from(f"{root}/cpu", v1):
            quota_us = _read(f"{folder}/cpu.cfs_quota_us")
            period_us = _read(f"{folder}/cpu.cfs_period_us")
            if quota_us and period_us and int(quota_us) > 0:
                quotas.append(int(quota_us) / int(period_us))
    return min(quotas) if quotas else None


def cgroup_memory_limit(
    root: str = "/sys/fs/cgroup", proc_cgroup: str = "/proc/self/cgroup"
) -> int | None:
    """Bytes the cgroup allows (v2 ``memory.max``, else v1), the lowest over this process's
    cgroup and its ancestors; None if unlimited."""
    v1, v2 = _own_cgroup("memory", proc_cgroup)
    limits = []
    for path in [
        *(f"{folder}/memory.max" for folder in _up_from(root, v2)),
        *(f"{folder}/memory.limit_in_bytes" for folder in _up_from(f"{root}/memory", v1)),
    ]:
        text = _read(path)
        if text and text != "max" and int(text) < 2**60:  # v1 reports "unlimited" as ~2**63
            limits.append(int(text))
    return min(limits) if limits else None


def usable_cpus(affinity: int | None = None, quota: float | None = None) -> int:
    """CPUs this process can really run on: affinity ∩ cgroup quota (rounded up), at least 1."""
    if affinity is None:
        affinity = (
            len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else os.cpu_count() or 1
        )
    if quota is None:
        return max(1, affinity)
    return max(1, min(affinity, math.ceil(quota)))


def _cpu_model() -> str:
    text = _read("/proc/cpuinfo") or ""
    match = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    return match.group(1).strip() if match else (platform.processor() or platform.machine())


def _slug(text: str) -> str:
    text = re.sub(r"\((R|TM|tm)\)|\bCPU\b|\bProcessor\b|@.*$", "", text)
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


@dataclass(frozen=True)
class Hardware:
    """What this process can use, and the key under which recommendations are stored."""

    cpu_model: str
    usable_cpus: int
    logical_cpus: int
    physical_cores: int | None
    cpu_quota: float | None
    memory_total_bytes: int
    memory_available_bytes: int
    memory_limit_bytes: int | None
    shm_total_bytes: int | None
    shm_free_bytes: int | None
    open_files_limit: int
    gpus: tuple[nvml.GpuInfo, ...]
    gpu_note: str | None  # why no GPU is listed (no NVML, no device), or None
    driver_version: str | None
    versions: dict[str, str | None] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """Stable key of the CPU/GPU pairing, e.g. ``amd-epyc-7b13-x2cpu+nvidia-h100-x1``."""
        cpu = f"{_slug(self.cpu_model)}-x{self.usable_cpus}cpu"
        if not self.gpus:
            return f"{cpu}+nogpu"
        names = sorted({g.name for g in self.gpus})
        gpu = "+".join(f"{_slug(n)}-x{sum(g.name == n for g in self.gpus)}" for n in names)
        return f"{cpu}+{gpu}"

    @property
    def ram_budget_bytes(self) -> int:
        """Memory the process tree may use: available RAM, capped by the cgroup limit."""
        available = self.memory_available_bytes
        return min(available, self.memory_limit_bytes) if self.memory_limit_bytes else available

    def describe(self) -> str:
        """One human line: ``2 usable CPUs (Intel Xeon; 2 logical), 23.5 GiB RAM, ...``."""
        gib = 2**30
        quota = f", quota {self.cpu_quota:g} CPUs" if self.cpu_quota else ""
        parts = [
            f"{self.usable_cpus} usable CPUs "
            f"({self.cpu_model}; {self.logical_cpus} logical{quota})",
            f"{self.memory_total_bytes / gib:.1f} GiB RAM",
        ]
        if self.shm_total_bytes is not None:
            parts.append(f"/dev/shm {self.shm_total_bytes / gib:.1f} GiB")
        if self.gpus:
            parts.append(
                ", ".join(f"{g.name} ({g.memory_total_bytes / gib:.0f} GiB)" for g in self.gpus)
            )
        else:
            note = self.gpu_note
            parts.append(f"no GPU ({note})" if note and not _no_nvidia_driver(note) else "no GPU")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["key"] = self.key
        data["description"] = self.describe()
        return data


def _no_nvidia_driver(gpu_note: str) -> bool:
    """The note says NVML's shared library is not installed: no NVIDIA driver, the normal
    CPU-only machine, which every command's header calls "no GPU" and no more. NVML present
    but failing (a driver problem) is worth seeing there; ``loadertune doctor`` and the saved
    ``gpu_note`` keep the reason in every case."""
    return gpu_note.startswith(f"NVML unavailable: {nvml.LIBRARY_NOT_FOUND}")


def _versions() -> dict[str, str | None]:
    import torch

    from loadertune import __version__

    return {
        "loadertune": __version__,
        "python": platform.python_version(),
        "torch": str(torch.__version__),
        "cuda": torch.version.cuda,
        "platform": platform.platform(),
    }


def detect() -> Hardware:
    """Read this machine's fingerprint now (memory figures change; the key does not)."""
    quota = cgroup_cpu_quota()
    try:
        shm = shutil.disk_usage("/dev/shm")
        shm_total: int | None = shm.total
        shm_free: int | None = shm.free
    except OSError:
        shm_total = shm_free = None
    gpus = tuple(nvml.visible_gpus())
    if gpus:
        note = None
    elif nvml.unavailable_reason():
        note = f"NVML unavailable: {nvml.unavailable_reason()}"
    else:
        note = "NVML lists no visible device"
    vm = psutil.virtual_memory()
    return Hardware(
        cpu_model=_cpu_model(),
        usable_cpus=usable_cpus(quota=quota),
        logical_cpus=os.cpu_count() or 1,
        physical_cores=psutil.cpu_count(logical=False),
        cpu_quota=quota,
        memory_total_bytes=vm.total,
        memory_available_bytes=vm.available,
        memory_limit_bytes=cgroup_memory_limit(),
        shm_total_bytes=shm_total,
        shm_free_bytes=shm_free,
        open_files_limit=resource.getrlimit(resource.RLIMIT_NOFILE)[0],
        gpus=gpus,
        gpu_note=note,
        driver_version=nvml.driver_version(),
        versions=_versions(),
    )


@cache
def current_key() -> str:
    """This machine's key, computed once per process."""
    return detect().key
