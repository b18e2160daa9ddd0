"""``loadertune doctor``: this machine's fingerprint, and what commonly hurts data loading here,
each measured on this process and said with its fix.

Every check reads the state this process really has (the size of ``/dev/shm``, the cgroup CPU
quota and the affinity mask, ``RLIMIT_NOFILE``, NVML, the thread variables, the start method,
the torch internals loadertune relies on): run it the way training runs (same container, same
``ulimit``, same ``taskset``, same environment) to see what training will meet.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
from collections.abc import Callable
from dataclasses import asdict, dataclass

from loadertune import hardware
from loadertune.hardware import Hardware
from loadertune.measure import nvml
from loadertune.trials import torch_internals
from loadertune.units import GIB, MIB

OK, NOTE, PROBLEM = "ok", "note", "problem"
SMALL_SHM_BYTES = GIB  # Docker gives 64 MiB; a few workers' batches in flight need more
LOW_OPEN_FILES = 4096  # every batch a worker hands over holds descriptors until it is used
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
BUSY_GPU_MEMORY = 0.10  # another process holding this share of a GPU's memory makes it busy


@dataclass(frozen=True)
class Finding:
    """One check: what was measured, whether it hurts loading, and what to do about it.

    Attributes:
        topic: what was checked (``"/dev/shm"``, ``"open files"``...).
        level: ``"ok"``, ``"note"`` (worth knowing) or ``"problem"`` (hurts loading).
        measured: what this process has, in one line.
        fix: what to do (None when nothing needs doing).
    """

    topic: str
    level: str
    measured: str
    fix: str | None = None


def _size(n: float) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / MIB:.0f} MiB"


def check_shm(hw: Hardware) -> Finding:
    if hw.shm_total_bytes is None:
        return Finding(
            "/dev/shm",
            PROBLEM,
            "no /dev/shm: DataLoader workers hand batches over through shared memory",
            "mount a tmpfs at /dev/shm (docker run --shm-size=8g, or --ipc=host)",
        )
    measured = f"{_size(hw.shm_total_bytes)}, {_size(hw.shm_free_bytes or 0)} free"
    if hw.shm_total_bytes >= SMALL_SHM_BYTES:
        return Finding("/dev/shm", OK, measured)
    docker = " (Docker's default is 64 MiB)" if hw.shm_total_bytes <= 64 * MIB else ""
    return Finding(
        "/dev/shm",
        PROBLEM,
        f"{measured}{docker}: every batch in flight from a worker lives there, and workers "
        "die with 'Bus error' when it is full",
        "give the container more: docker run --shm-size=8g (or --ipc=host); on Kubernetes "
        "mount an emptyDir with medium: Memory at /dev/shm",
    )


def check_cpus(hw: Hardware) -> list[Finding]:
    out = []
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if affinity and len(affinity) < hw.logical_cpus:
        out.append(
            Finding(
                "CPU affinity",
                PROBLEM,
                f"this process may run on {len(affinity)} of the machine's {hw.logical_cpus} "
                f"CPUs ({_ranges(affinity)}); DataLoader workers inherit the mask",
                "run without the restriction (taskset, numactl, the job scheduler's CPU "
                "binding), or tune under the same restriction training runs with: settings "
                f"tuned here fit {len(affinity)} CPU(s)",
            )
        )
    if hw.cpu_quota is not None and hw.cpu_quota < hw.logical_cpus:
        out.append(
            Finding(
                "CPU quota",
                PROBLEM,
                f"the cgroup allows {hw.cpu_quota:g} CPUs' worth of time of the machine's "
                f"{hw.logical_cpus}; workers past that only queue (and are throttled)",
                "raise the quota (docker run --cpus, a pod's CPU limit) or tune where training "
                f"runs, under the same quota: settings tuned here fit {hw.usable_cpus} CPU(s)",
            )
        )
    if not out:
        out.append(Finding("CPUs", OK, f"{hw.usable_cpus} usable of {hw.logical_cpus}"))
    return out


def _ranges(cpus: list[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2,5``."""
    parts, start = [], None
    for i, c in enumerate(cpus):
        if start is None:
            start = c
        if i + 1 == len(cpus) or cpus[i + 1] != c + 1:
            parts.append(str(start) if start == c else f"{start}-{c}")
            start = None
    return "CPU " + ",".join(parts)


def check_open_files(hw: Hardware) -> Finding:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    shown = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    measured = f"ulimit -n is {soft} (hard limit {shown})"
    if soft >= LOW_OPEN_FILES:
        return Finding("open files", OK, measured)
    target = 65536 if hard == resource.RLIM_INFINITY else min(65536, hard)
    raise_it = (
        f"ulimit -n {target} before training"
        if target > soft
        else "ask for a higher hard limit (limits.conf, docker run --ulimit nofile=65536)"
    )
    return Finding(
        "open files",
        PROBLEM,
        f"{measured}: each batch a worker hands over holds descriptors until it is used, and "
        "many workers with a deep prefetch fail with 'Too many open files' or hang",
        f"{raise_it}, or torch.multiprocessing.set_sharing_strategy('file_system') in the "
        "training script",
    )


def check_gpus(hw: Hardware) -> list[Finding]:
    if not hw.gpus:
        reason = nvml.unavailable_reason()
        if reason:
            return [
                Finding(
                    "NVML",
                    NOTE,
                    f"unavailable ({reason}): no GPU utilization can be measured",
                    "on a GPU machine: install the NVIDIA driver and `pip install nvidia-ml-py`; "
                    "on a CPU-only machine nothing needs doing",
                )
            ]
        return [
            Finding("GPUs", NOTE, "NVML works but lists no visible GPU (CUDA_VISIBLE_DEVICES?)")
        ]
    out = []
    freest = max(hw.gpus, key=lambda g: g.memory_free_bytes)
    for g in hw.gpus:
        procs = nvml.compute_processes(g.index)
        util = nvml.utilization_now(g.index)
        held = g.memory_total_bytes - g.memory_free_bytes
        measured = (
            f"{g.name}: {_size(g.memory_free_bytes)} of {_size(g.memory_total_bytes)} free"
            + (f", {util}% busy" if util is not None else "")
            + (f", {len(procs)} process(es) on it" if procs else "")
        )
        busy = bool(procs) and held > BUSY_GPU_MEMORY * g.memory_total_bytes
        if not busy and not (util is not None and util > 50):
            out.append(Finding(f"GPU {g.index}", OK, measured))
            continue
        better = (
            f"CUDA_VISIBLE_DEVICES={freest.index} (the freest: "
            f"{_size(freest.memory_free_bytes)} free)"
            if freest.index != g.index
            else "wait for the other processes, or stop them"
        )
        out.append(
            Finding(
                f"GPU {g.index}",
                PROBLEM,
                f"{measured}: other work on the GPU slows the step and skews what is measured",
                f"train on another GPU: {better}",
            )
        )
    return out


def check_threads(hw: Hardware) -> Finding:
    import torch

    unset = [v for v in THREAD_VARIABLES if not os.environ.get(v)]
    threads = torch.get_num_threads()
    measured = (
        f"{', '.join(unset)} unset; torch uses {threads} threads in the training process"
        if unset
        else ", ".join(f"{v}={os.environ[v]}" for v in THREAD_VARIABLES)
    )
    if not unset or hw.usable_cpus <= 1:
        return Finding("threads", OK, measured)
    return Finding(
        "threads",
        NOTE,
        f"{measured}: while workers run, the training process's threads and every worker's "
        "numpy/OpenCV threads compete for the same CPUs",
        "export OMP_NUM_THREADS=<CPUs / (workers + 1)> (at least 1), or torch.set_num_threads "
        "in the training process; cv2.setNumThreads(0) in worker_init_fn",
    )


def check_start_method() -> Finding:
    method = multiprocessing.get_start_method(allow_none=True)
    default = multiprocessing.get_context().get_start_method()
    name = method or f"{default} (the default)"
    if default == "fork":
        return Finding(
            "start method",
            OK,
            f"{name}: workers start fast and share the dataset's memory; CUDA must not be "
            "used in the dataset (a forked worker cannot re-initialize it)",
        )
    return Finding(
        "start method",
        NOTE,
        f"{name}: every worker imports the script and unpickles the dataset at each epoch "
        "(slower start; the dataset must pickle)",
        "persistent_workers=True pays the start once; or "
        "multiprocessing_context='fork' in DataLoader when the dataset uses no CUDA or threads",
    )


def check_torch_internals() -> Finding:
    import torch

    gone = torch_internals.missing_live()
    if not gone:
        return Finding(
            "torch internals",
            OK,
            f"torch {torch.__version__} has every private name loadertune relies on",
        )
    return Finding(
        "torch internals",
        PROBLEM,
        f"torch {torch.__version__} lacks {', '.join(gone)}: loadertune cleans up failed "
        "trials less promptly (workers linger until garbage collection)",
        "install a torch that loadertune was checked on (2.1 to 2.13), or upgrade loadertune",
    )


_CHECKS: tuple[Callable[[Hardware], Finding | list[Finding]], ...] = (
    check_shm,
    check_cpus,
    check_open_files,
    check_gpus,
    check_threads,
    lambda hw: check_start_method(),
    lambda hw: check_torch_internals(),
)


def diagnose(hw: Hardware | None = None) -> list[Finding]:
    """Every check, in order; ``hw`` defaults to this machine now."""
    hw = hw or hardware.detect()
    out: list[Finding] = []
    for check in _CHECKS:
        found = check(hw)
        out.extend(found if isinstance(found, list) else [found])
    return out


def to_dict(hw: Hardware, findings: list[Finding]) -> dict[str, object]:
    return {"hardware": hw.to_dict(), "findings": [asdict(f) for f in findings]}
