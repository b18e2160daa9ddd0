"""A thin, failure-tolerant layer over NVML (the ``pynvml`` module of nvidia-ml-py).

Every function here works without a GPU, without a driver and without the package: it returns
``None`` or an empty list and leaves the reason in :func:`unavailable_reason`. NVML is
initialised once per process and never shut down explicitly (the driver does it at exit),
because other libraries in the same process may hold it too.
"""

from __future__ import annotations

import itertools
import os
import threading
from dataclasses import dataclass
from typing import Any

# The error pynvml raises where NVML's shared library is not installed (no NVIDIA driver).
LIBRARY_NOT_FOUND = "NVMLError_LibraryNotFound"

_lock = threading.Lock()
_state: dict[str, Any] = {"ready": None, "reason": None, "module": None}


def _nvml() -> Any | None:
    """The initialised ``pynvml`` module, or None (reason kept for :func:`unavailable_reason`)."""
    with _lock:
        if _state["ready"] is None:
            try:
                import pynvml

                pynvml.nvmlInit()
                _state.update(ready=True, module=pynvml)
            except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, DriverNotLoaded...
                _state.update(ready=False, reason=f"{type(exc).__name__}: {exc}".strip(": "))
        return _state["module"] if _state["ready"] else None


def unavailable_reason() -> str | None:
    """Why NVML cannot be used here, or None when it can."""
    _nvml()
    return _state["reason"]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class GpuInfo:
    """Static facts about one visible GPU, as NVML reports them."""

    index: int  # NVML index (physical), not the CUDA ordinal
    name: str
    uuid: str
    pci_bus_id: str
    memory_total_bytes: int
    memory_free_bytes: int
    pcie_generation: int | None
    pcie_width: int | None


def _visible_filter(n_devices: int, uuids: list[str]) -> list[int]:
    """NVML indices that CUDA_VISIBLE_DEVICES leaves visible, in CUDA order."""
    spec = os.environ.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return list(range(n_devices))
    visible: list[int] = []
    for token in (t.strip() for t in spec.split(",")):
        if not token:
            break
        if token.isdigit():
            idx = int(token)
        else:  # a UUID or a prefix of one ("GPU-8f2b...")
            matches = [i for i, u in enumerate(uuids) if u.startswith(token)]
            idx = matches[0] if len(matches) == 1 else -1
        if not 0 <= idx < n_devices:
            break  # CUDA stops at the first invalid entry, and so do we
        visible.append(idx)
    return visible


def visible_gpus() -> list[GpuInfo]:
    """The GPUs this process may use, in CUDA order; empty without NVML."""
    nv = _nvml()
    if nv is None:
        return []
    try:
        n = nv.nvmlDeviceGetCount()
        handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        uuids = [_text(nv.nvmlDeviceGetUUID(h)) for h in handles]
        gpus = []
        for i in _visible_filter(n, uuids):
            h = handles[i]
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            gpus.append(
                GpuInfo(
                    index=i,
                    name=_text(nv.nvmlDeviceGetName(h)),
                    uuid=uuids[i],
                    pci_bus_id=_text(nv.nvmlDeviceGetPciInfo(h).busId),
                    memory_total_bytes=int(mem.total),
                    memory_free_bytes=int(mem.free),
                    pcie_generation=_optional(nv.nvmlDeviceGetCurrPcieLinkGeneration, h),
                    pcie_width=_optional(nv.nvmlDeviceGetCurrPcieLinkWidth, h),
                )
            )
        return gpus
    except Exception as exc:
        _state["reason"] = f"NVML query failed: {exc}"
        return []


def _optional(fn: Any, handle: Any) -> int | None:
    try:
        return int(fn(handle))
    except Exception:  # not supported on this product (e.g. SXM boards report no PCIe link)
        return None


def driver_version() -> str | None:
    nv = _nvml()
    if nv is None:
        return None
    try:
        return _text(nv.nvmlSystemGetDriverVersion())
    except Exception:
        return None


def _handle(nvml_index: int) -> Any | None:
    nv = _nvml()
    if nv is None:
        return None
    try:
        return nv.nvmlDeviceGetHandleByIndex(nvml_index)
    except Exception:
        return None


def utilization_samples(nvml_index: int, since_us: int) -> list[tuple[int, int]] | None:
    """GPU-busy samples the driver buffered since ``since_us`` (µs since the epoch).

    Returns ``(timestamp_us, percent)`` pairs, or None when the device cannot report them (the
    caller then polls :func:`utilization_now`). Reading the driver's buffer covers the whole
    window, not only the moments a poller happened to look.
    """
    nv = _nvml()
    handle = _handle(nvml_index)
    if nv is None or handle is None:
        return None
    try:
        _, samples = nv.nvmlDeviceGetSamples(handle, nv.NVML_GPU_UTILIZATION_SAMPLES, since_us)
    except Exception:
        return None
    out = []
    for s in samples:
        value = s.sampleValue
        percent = getattr(value, "uiVal", value)  # a c_union in pynvml
        out.append((int(s.timeStamp), int(percent)))
    return out


# The longest sample period a device may use for its busy figure (NVML: 1/6 s to 1 s).
SAMPLE_PERIOD_MAX_US = 1_000_000


def utilization_within(nvml_index: int, start_us: int, end_us: int) -> list[int] | None:
    """The busy percents of the driver's samples whose period lies inside the window from
    ``start_us`` to ``end_us`` (µs since the epoch), or None when the device cannot report them.

    A sample is the busy percent over the period since the sample before it, so the first one
    after the window's start covers time before it (a trial's start-up, the GPU idle): it is
    kept only when the sample before it is inside the window too. A window shorter than a
    period keeps none, which is no reading rather than a wrong one (the one sample straddling
    a short, GPU-bound window can read 0% busy).
    """
    samples = utilization_samples(nvml_index, start_us - SAMPLE_PERIOD_MAX_US)
    if samples is None:
        return None
    samples.sort()
    return [
        percent
        for (before, _), (ts, percent) in itertools.pairwise(samples)
        if before >= start_us and ts <= end_us
    ]


def utilization_now(nvml_index: int) -> int | None:
    """The device's busy percent over its last sample period, or None."""
    nv = _nvml()
    handle = _handle(nvml_index)
    if nv is None or handle is None:
        return None
    try:
        return int(nv.nvmlDeviceGetUtilizationRates(handle).gpu)
    except Exception:
        return None


def index_for_bus_id(pci_bus_id: str) -> int | None:
    """NVML index of the device at ``pci_bus_id`` (as torch or CUDA spell it), or None."""
    nv = _nvml()
    if nv is None:
        return None
    try:
        return int(nv.nvmlDeviceGetIndex(nv.nvmlDeviceGetHandleByPciBusId(pci_bus_id)))
    except Exception:
        return None


def compute_processes(nvml_index: int) -> list[tuple[int, int | None]] | None:
    """Processes running CUDA work on the device: (pid, GPU memory used in bytes or None), or
    None when NVML cannot say. In a container, pids are the host's."""
    nv = _nvml()
    handle = _handle(nvml_index)
    if nv is None or handle is None:
        return None
    try:
        procs = nv.nvmlDeviceGetComputeRunningProcesses(handle)
    except Exception:
        return None
    out = []
    for p in procs:
        used = getattr(p, "usedGpuMemory", None)
        out.append((int(p.pid), int(used) if isinstance(used, int) else None))
    return out
