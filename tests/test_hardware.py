"""Tests of loadertune.hardware: cgroup limits, usable CPUs and the hardware key."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from loadertune import hardware
from loadertune.hardware import (
    Hardware,
    cgroup_cpu_quota,
    cgroup_memory_limit,
    current_key,
    detect,
    usable_cpus,
)
from loadertune.measure import nvml
from loadertune.measure.nvml import GpuInfo

GIB = 2**30


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")  # the kernel ends these files with a newline


# -- cgroup CPU quota -----------------------------------------------------------------------------


def test_cpu_quota_v2_unlimited(tmp_path: Path) -> None:
    _write(tmp_path, "cpu.max", "max 100000")
    assert cgroup_cpu_quota(str(tmp_path)) is None


def test_cpu_quota_v2_fractional(tmp_path: Path) -> None:
    _write(tmp_path, "cpu.max", "150000 100000")
    assert cgroup_cpu_quota(str(tmp_path)) == pytest.approx(1.5)


def test_cpu_quota_v2_whole_cpus(tmp_path: Path) -> None:
    _write(tmp_path, "cpu.max", "400000 100000")
    assert cgroup_cpu_quota(str(tmp_path)) == pytest.approx(4.0)


def test_cpu_quota_v2_without_period(tmp_path: Path) -> None:
    _write(tmp_path, "cpu.max", "max")
    assert cgroup_cpu_quota(str(tmp_path)) is None


def test_cpu_quota_v1(tmp_path: Path) -> None:
    _write(tmp_path, "cpu/cpu.cfs_quota_us", "200000")
    _write(tmp_path, "cpu/cpu.cfs_period_us", "100000")
    assert cgroup_cpu_quota(str(tmp_path)) == pytest.approx(2.0)


def test_cpu_quota_v1_unlimited(tmp_path: Path) -> None:
    _write(tmp_path, "cpu/cpu.cfs_quota_us", "-1")
    _write(tmp_path, "cpu/cpu.cfs_period_us", "100000")
    assert cgroup_cpu_quota(str(tmp_path)) is None


def test_cpu_quota_v2_preferred_over_v1(tmp_path: Path) -> None:
    _write(tmp_path, "cpu.max", "50000 100000")
    _write(tmp_path, "cpu/cpu.cfs_quota_us", "800000")
    _write(tmp_path, "cpu/cpu.cfs_period_us", "100000")
    assert cgroup_cpu_quota(str(tmp_path)) == pytest.approx(0.5)


def test_cpu_quota_without_cgroup_files(tmp_path: Path) -> None:
    assert cgroup_cpu_quota(str(tmp_path)) is None
    assert cgroup_cpu_quota(str(tmp_path / "does-not-exist")) is None


# -- cgroup memory limit --------------------------------------------------------------------------


def test_memory_limit_v2_unlimited(tmp_path: Path) -> None:
    _write(tmp_path, "memory.max", "max")
    assert cgroup_memory_limit(str(tmp_path)) is None


def test_memory_limit_v2(tmp_path: Path) -> None:
    _write(tmp_path, "memory.max", str(4 * GIB))
    assert cgroup_memory_limit(str(tmp_path)) == 4 * GIB


def test_memory_limit_v1(tmp_path: Path) -> None:
    _write(tmp_path, "memory/memory.limit_in_bytes", str(2 * GIB))
    assert cgroup_memory_limit(str(tmp_path)) == 2 * GIB


def test_memory_limit_v1_unlimited(tmp_path: Path) -> None:
    """cgroup v1 spells "no limit" as a page-rounded 2**63 - 1."""
    _write(tmp_path, "memory/memory.limit_in_bytes", "9223372036854771712")
    assert cgroup_memory_limit(str(tmp_path)) is None


def test_memory_limit_v2_preferred_over_v1(tmp_path: Path) -> None:
    _write(tmp_path, "memory.max", str(GIB))
    _write(tmp_path, "memory/memory.limit_in_bytes", str(8 * GIB))
    assert cgroup_memory_limit(str(tmp_path)) == GIB


def test_memory_limit_without_cgroup_files(tmp_path: Path) -> None:
    assert cgroup_memory_limit(str(tmp_path)) is None


# -- usable CPUs ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("affinity", "quota", "expected"),
    [
        (4, None, 4),
        (4, 1.5, 2),  # a quota of 1.5 CPUs keeps two CPUs partly busy
        (4, 2.0, 2),
        (4, 0.5, 1),
        (4, 0.01, 1),
        (2, 8.0, 2),  # a quota above the affinity mask does not add CPUs
        (64, 4.2, 5),
        (0, None, 1),
        (0, 3.0, 1),
    ],
)
def test_usable_cpus(affinity: int, quota: float | None, expected: int) -> None:
    assert usable_cpus(affinity, quota) == expected


def test_usable_cpus_defaults_to_affinity_mask() -> None:
    expected = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert usable_cpus() == expected
    assert usable_cpus(quota=1.0) == 1


# -- Hardware -------------------------------------------------------------------------------------


def _gpu(name: str, index: int = 0, memory_gib: int = 80) -> GpuInfo:
    return GpuInfo(
        index=index,
        name=name,
        uuid=f"GPU-{index:08x}",
        pci_bus_id=f"00000000:{index:02x}:00.0",
        memory_total_bytes=memory_gib * GIB,
        memory_free_bytes=memory_gib * GIB,
        pcie_generation=4,
        pcie_width=16,
    )


def _hardware(**overrides: object) -> Hardware:
    fields: dict[str, object] = {
        "cpu_model": "AMD EPYC 7B13 64-Core Processor",
        "usable_cpus": 2,
        "logical_cpus": 2,
        "physical_cores": 1,
        "cpu_quota": None,
        "memory_total_bytes": 16 * GIB,
        "memory_available_bytes": 12 * GIB,
        "memory_limit_bytes": None,
        "shm_total_bytes": 8 * GIB,
        "shm_free_bytes": 8 * GIB,
        "open_files_limit": 1024,
        "gpus": (),
        "gpu_note": "NVML unavailable: NVMLError_LibraryNotFound",
        "driver_version": None,
    }
    fields.update(overrides)
    return Hardware(**fields)  # type: ignore[arg-type]


def test_key_without_gpu() -> None:
    assert _hardware().key == "amd-epyc-7b13-64-core-x2cpu+nogpu"


def test_key_drops_trademarks_cpu_word_and_clock() -> None:
    hw = _hardware(cpu_model="Intel(R) Xeon(R) CPU @ 2.20GHz", usable_cpus=4)
    assert hw.key == "intel-xeon-x4cpu+nogpu"


def test_key_counts_gpus_by_name_in_sorted_order() -> None:
    gpus = (
        _gpu("NVIDIA H100 80GB HBM3", 0),
        _gpu("NVIDIA A100-SXM4-40GB", 1, 40),
        _gpu("NVIDIA H100 80GB HBM3", 2),
    )
    hw = _hardware(gpus=gpus)
    assert hw.key == "amd-epyc-7b13-64-core-x2cpu+nvidia-a100-sxm4-40gb-x1+nvidia-h100-80gb-hbm3-x2"
    assert _hardware(gpus=tuple(reversed(gpus))).key == hw.key


def test_key_ignores_what_changes_between_runs() -> None:
    """Free memory, the driver and versions vary; the key does not."""
    a = _hardware(gpus=(_gpu("NVIDIA H100 80GB HBM3"),))
    b = dataclasses.replace(
        a,
        memory_available_bytes=1,
        shm_free_bytes=0,
        driver_version="999",
        versions={"torch": "x"},
        gpus=(dataclasses.replace(a.gpus[0], memory_free_bytes=0),),
    )
    assert a.key == b.key


def test_key_depends_on_usable_cpus() -> None:
    assert _hardware(usable_cpus=2).key != _hardware(usable_cpus=4).key


def test_ram_budget_is_capped_by_cgroup_limit() -> None:
    assert _hardware().ram_budget_bytes == 12 * GIB
    assert _hardware(memory_limit_bytes=4 * GIB).ram_budget_bytes == 4 * GIB
    assert _hardware(memory_limit_bytes=64 * GIB).ram_budget_bytes == 12 * GIB


def test_describe_synthetic() -> None:
    text = _hardware(cpu_quota=1.5).describe()
    assert "2 usable CPUs (AMD EPYC 7B13 64-Core Processor; 2 logical, quota 1.5 CPUs)" in text
    assert "16.0 GiB RAM" in text
    assert "/dev/shm 8.0 GiB" in text
    assert text.endswith(", no GPU") and "NVML" not in text
    text = _hardware(gpus=(_gpu("NVIDIA H100 80GB HBM3"),), gpu_note=None).describe()
    assert "NVIDIA H100 80GB HBM3 (80 GiB)" in text
    assert "no GPU" not in text


def test_no_gpu_says_why_only_where_nvml_is_there_but_fails() -> None:
    """A new user's CPU-only machine printed "no GPU (NVML unavailable:
    NVMLError_LibraryNotFound: NVML Shared Library Not Found)" in every command's header: no
    NVIDIA driver is the normal CPU machine, said as "no GPU". A driver that NVML cannot reach
    is worth seeing; the saved JSON keeps every reason."""
    missing = "NVML unavailable: NVMLError_LibraryNotFound: NVML Shared Library Not Found"
    hw = _hardware(gpu_note=missing)
    assert hw.describe().endswith(", no GPU")
    assert hw.to_dict()["gpu_note"] == missing
    for note in (
        "NVML unavailable: NVMLError_DriverNotLoaded: Driver Not Loaded",
        "NVML unavailable: NVMLError_LibRmVersionMismatch: RM has detected an NVML/RM version "
        "mismatch.",
        "NVML lists no visible device",
    ):
        assert _hardware(gpu_note=note).describe().endswith(f", no GPU ({note})")


def test_detect_key_is_stable() -> None:
    first, second = detect(), detect()
    assert first.key == second.key
    assert first.key == current_key()
    assert f"-x{first.usable_cpus}cpu" in first.key


def test_detect_reads_this_machine() -> None:
    hw = detect()
    assert hw.usable_cpus >= 1
    assert hw.usable_cpus <= hw.logical_cpus
    assert hw.memory_total_bytes > 0
    assert 0 < hw.ram_budget_bytes <= hw.memory_total_bytes
    assert hw.open_files_limit > 0
    assert hw.versions["loadertune"] is not None
    assert hw.versions["torch"]


@pytest.fixture
def no_nvml() -> None:
    if nvml.unavailable_reason() is None:
        pytest.skip("NVML is available here")


@pytest.mark.usefixtures("no_nvml")
def test_detect_without_nvml_has_no_gpu() -> None:
    hw = detect()
    assert hw.gpus == ()
    assert hw.key.endswith("+nogpu")
    assert hw.gpu_note is not None
    assert hw.gpu_note.startswith("NVML unavailable: ")
    assert hw.driver_version is None


@pytest.mark.usefixtures("no_nvml")
def test_describe_mentions_cpus_and_why_no_gpu() -> None:
    hw = detect()
    text = hw.describe()
    assert f"{hw.usable_cpus} usable CPUs" in text
    reason = nvml.unavailable_reason()
    assert reason is not None
    if reason.startswith(nvml.LIBRARY_NOT_FOUND):  # no NVIDIA driver: nothing to see
        assert text.endswith(", no GPU")
    else:
        assert f"no GPU (NVML unavailable: {reason})" in text


def test_to_dict_has_key_and_description() -> None:
    hw = detect()
    data = hw.to_dict()
    assert data["key"] == hw.key
    assert data["description"] == hw.describe()
    assert data["usable_cpus"] == hw.usable_cpus
    again = json.loads(json.dumps(data))  # plain JSON: the recommendation file holds it
    assert again["key"] == hw.key
    assert again["memory_total_bytes"] == hw.memory_total_bytes


def test_to_dict_with_gpus_is_plain_data() -> None:
    hw = _hardware(gpus=(_gpu("NVIDIA H100 80GB HBM3"),), gpu_note=None)
    data = hw.to_dict()
    assert data["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
    assert data["key"].endswith("+nvidia-h100-80gb-hbm3-x1")
    assert json.loads(json.dumps(data))["gpus"][0]["memory_total_bytes"] == 80 * GIB


def test_detect_uses_cgroup_quota(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hardware, "cgroup_cpu_quota", lambda root="/sys/fs/cgroup": 1.0)
    hw = detect()
    assert hw.cpu_quota == 1.0
    assert hw.usable_cpus == 1
    assert "-x1cpu" in hw.key


def test_the_quota_of_this_process_cgroup_and_its_parents(tmp_path: Path) -> None:
    """A process in a nested cgroup (a systemd slice, a pod without a cgroup namespace) is bound
    by its own cgroup's quota and by every parent's: the lowest counts."""
    proc = tmp_path / "cgroup"
    proc.write_text("4:memory:/job/step\n2:cpu,cpuacct:/job/step\n0::/\n")
    _write(tmp_path, "cpu/job/cpu.cfs_quota_us", "300000")
    _write(tmp_path, "cpu/job/cpu.cfs_period_us", "100000")
    _write(tmp_path, "cpu/job/step/cpu.cfs_quota_us", "-1")  # unlimited itself
    _write(tmp_path, "cpu/job/step/cpu.cfs_period_us", "100000")
    assert cgroup_cpu_quota(str(tmp_path), str(proc)) == pytest.approx(3.0)
    _write(tmp_path, "memory/job/step/memory.limit_in_bytes", str(2 * GIB))
    _write(tmp_path, "memory/memory.limit_in_bytes", str(2**63 - 4096))
    assert cgroup_memory_limit(str(tmp_path), str(proc)) == 2 * GIB


def test_the_quota_of_a_v2_cgroup_below_the_root(tmp_path: Path) -> None:
    proc = tmp_path / "cgroup"
    proc.write_text("0::/user.slice/job\n")
    _write(tmp_path, "cpu.max", "max 100000")
    _write(tmp_path, "user.slice/job/cpu.max", "50000 100000")
    assert cgroup_cpu_quota(str(tmp_path), str(proc)) == pytest.approx(0.5)
