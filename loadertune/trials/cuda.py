"""A batch on the GPU: its copy to the device, CUDA's sync point, which device this process
uses (as NVML names it), its memory peaks and capacity, and the host-to-device copy rate. Every
function is a no-op or None where this process has not started CUDA."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch

from loadertune.measure import nvml
from loadertune.measure.counting import structure_count


def to_device(batch: Any, device: torch.device, non_blocking: bool) -> Any:
    """Move every tensor of a batch to ``device``; ``non_blocking`` pays off with pinned memory."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, Mapping):
        return {k: to_device(v, device, non_blocking) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        moved = [to_device(v, device, non_blocking) for v in batch]
        return type(batch)(*moved) if hasattr(batch, "_fields") else type(batch)(moved)
    return batch


def cuda_sync() -> None:
    """Wait for queued GPU work, if this process uses CUDA (a CPU-GPU sync point)."""
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def cuda_bus_id() -> str | None:
    """PCI bus id of the current CUDA device (as NVML spells it), or None without CUDA in use."""
    if not torch.cuda.is_initialized():
        return None
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    bus = getattr(props, "pci_bus_id", None)
    if bus is None:
        return None
    domain, device = getattr(props, "pci_domain_id", 0), getattr(props, "pci_device_id", 0)
    return f"{domain:08x}:{bus:02x}:{device:02x}.0"


def nvml_index_for_current_device() -> int | None:
    """NVML index of the current CUDA device, or None when CUDA is not in use."""
    if not torch.cuda.is_initialized():
        return None
    bus = cuda_bus_id()
    index = nvml.index_for_bus_id(bus) if bus else None
    if index is not None:
        return index
    ordinal = torch.cuda.current_device()
    gpus = nvml.visible_gpus()
    return gpus[ordinal].index if ordinal < len(gpus) else None


def cuda_capacity() -> int | None:
    """Bytes this process could hold on its GPU: free memory plus what its allocator reserved."""
    if not torch.cuda.is_initialized():
        return None
    free, _total = torch.cuda.mem_get_info()
    return int(free + torch.cuda.memory_reserved())


def _tensors(batch: Any) -> list[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, Mapping):
        return [t for v in batch.values() for t in _tensors(v)]
    if isinstance(batch, (list, tuple)):
        return [t for v in batch for t in _tensors(v)]
    return []


def transfer_rates(batch: Any, *, repeats: int = 10) -> dict[str, float] | None:
    """Host-to-device copy rate of this batch, from pageable and from pinned memory.

    Returns samples/s and GB/s for each, or None without CUDA or without tensors.
    """
    if not torch.cuda.is_available():
        return None
    tensors = [t for t in _tensors(batch) if t.device.type == "cpu"]
    nbytes = sum(t.element_size() * t.nelement() for t in tensors)
    if not nbytes:
        return None
    samples = structure_count(batch)
    device = torch.device("cuda", torch.cuda.current_device())
    out: dict[str, float] = {}
    for name, pinned in (("pageable", False), ("pinned", True)):
        source = [t.pin_memory() if pinned else t for t in tensors]
        for t in source:  # warm-up: allocator, pinned staging buffers
            t.to(device, non_blocking=pinned)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(repeats):
            for t in source:
                t.to(device, non_blocking=pinned)
        torch.cuda.synchronize()  # a CPU-GPU sync point: every copy has landed
        seconds = (time.perf_counter() - t0) / repeats
        out[f"{name}_samples_per_s"] = samples / seconds
        out[f"{name}_gb_per_s"] = nbytes / seconds / 1e9
    return out


def reset_cuda_peaks() -> None:
    """Start counting peak GPU memory afresh (a new trial in the same process).

    The allocator's cache goes back to the driver first: a peak of *reserved* memory starts from
    what is reserved now, and what an earlier trial's larger batch left cached would otherwise
    be this trial's peak (every trial after a grid's largest batch would read the same peak,
    and the fitted memory line would have no slope)."""
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def cuda_peaks() -> tuple[int | None, int | None]:
    """(peak allocated, peak reserved) bytes since the last reset, or Nones without CUDA."""
    if not torch.cuda.is_initialized():
        return None, None
    return torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
