"""Tests of loadertune.nvml: CUDA_VISIBLE_DEVICES filtering and graceful behaviour without NVML."""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import pytest

from loadertune.measure import nvml
from loadertune.measure.nvml import GpuInfo, _visible_filter

UUIDS = ["GPU-8f2b0c1d-aaaa-bbbb-cccc-000000000000", "GPU-1e3d9a77-dddd-eeee-ffff-111111111111"]


# -- _visible_filter ------------------------------------------------------------------------------


def test_visible_filter_unset_lists_every_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert _visible_filter(2, UUIDS) == [0, 1]
    assert _visible_filter(0, []) == []


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("1,0", [1, 0]),  # CUDA order, not NVML order
        ("1", [1]),
        (" 1 , 0 ", [1, 0]),
        ("0,7", [0]),  # 7 does not exist: CUDA stops there
        ("7,0", []),
        ("0,-1,1", [0]),  # -1 hides everything after it
        ("", []),  # empty: no device visible
        ("0,,1", [0]),  # an empty entry ends the list too
        ("GPU-1e3d", [1]),  # a UUID prefix
        (UUIDS[0], [0]),  # a whole UUID
        ("GPU-1e3d,GPU-8f2b", [1, 0]),
        ("GPU-1e3d,0", [1, 0]),
        ("GPU-", []),  # ambiguous prefix: invalid
        ("GPU-ffff,0", []),  # no such UUID: invalid, stops there
    ],
)
def test_visible_filter(monkeypatch: pytest.MonkeyPatch, spec: str, expected: list[int]) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", spec)
    assert _visible_filter(2, UUIDS) == expected


# -- without NVML ---------------------------------------------------------------------------------


@pytest.fixture
def nvml_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``import pynvml`` fail and forget any earlier initialisation (restored afterwards)."""
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setitem(nvml._state, "ready", None)
    monkeypatch.setitem(nvml._state, "reason", None)
    monkeypatch.setitem(nvml._state, "module", None)


def _assert_all_graceful() -> None:
    assert nvml.visible_gpus() == []
    assert nvml.driver_version() is None
    assert nvml.utilization_samples(0, 0) is None
    assert nvml.utilization_now(0) is None
    assert nvml.index_for_bus_id("00000000:01:00.0") is None
    assert nvml._handle(0) is None


@pytest.mark.usefixtures("nvml_missing")
def test_public_functions_without_pynvml_module() -> None:
    _assert_all_graceful()
    reason = nvml.unavailable_reason()
    assert reason is not None
    assert "Error" in reason  # the exception's class name leads the reason


def test_public_functions_on_this_machine() -> None:
    """This machine (no GPU, no driver): every function answers, none raises."""
    if nvml.unavailable_reason() is None:
        pytest.skip("NVML is available here")
    _assert_all_graceful()
    assert nvml.unavailable_reason()


@pytest.mark.usefixtures("nvml_missing")
def test_initialisation_failure_is_remembered(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def init() -> None:
        calls.append(1)
        raise RuntimeError("Driver Not Loaded")

    monkeypatch.setitem(sys.modules, "pynvml", SimpleNamespace(nvmlInit=init))
    assert nvml.visible_gpus() == []
    assert nvml.unavailable_reason() == "RuntimeError: Driver Not Loaded"
    assert nvml.driver_version() is None
    assert len(calls) == 1  # initialised once per process, not at every call


# -- with a fake NVML -----------------------------------------------------------------------------


class _Mem:
    def __init__(self, total: int, free: int) -> None:
        self.total, self.free = total, free


def _fake_pynvml(*, fail_pcie: bool = False) -> Any:
    names = [b"NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB"]  # bytes in old bindings

    def pcie_gen(h: int) -> int:
        if fail_pcie:
            raise RuntimeError("Not Supported")
        return 5

    return SimpleNamespace(
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUUID=lambda h: UUIDS[h].encode(),
        nvmlDeviceGetName=lambda h: names[h],
        nvmlDeviceGetPciInfo=lambda h: SimpleNamespace(busId=f"00000000:{h + 1:02X}:00.0".encode()),
        nvmlDeviceGetMemoryInfo=lambda h: _Mem((h + 1) * 2**30, 2**29),
        nvmlDeviceGetCurrPcieLinkGeneration=pcie_gen,
        nvmlDeviceGetCurrPcieLinkWidth=lambda h: 16,
        nvmlSystemGetDriverVersion=lambda: b"550.54.15",
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=42),
        nvmlDeviceGetHandleByPciBusId=lambda bus: {"00000000:02:00.0": 1}[bus],
        nvmlDeviceGetIndex=lambda h: h,
        NVML_GPU_UTILIZATION_SAMPLES=1,
        nvmlDeviceGetSamples=lambda h, kind, since: (
            0,
            [
                SimpleNamespace(timeStamp=since + 10, sampleValue=SimpleNamespace(uiVal=99)),
                SimpleNamespace(timeStamp=since + 20, sampleValue=3),
            ],
        ),
    )


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> Any:
    fake = _fake_pynvml()
    monkeypatch.setitem(nvml._state, "ready", True)
    monkeypatch.setitem(nvml._state, "reason", None)
    monkeypatch.setitem(nvml._state, "module", fake)
    return fake


@pytest.mark.usefixtures("fake_nvml")
def test_visible_gpus_in_cuda_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    gpus = nvml.visible_gpus()
    assert [g.index for g in gpus] == [1, 0]
    assert gpus[0] == GpuInfo(
        index=1,
        name="NVIDIA A100-SXM4-40GB",
        uuid=UUIDS[1],
        pci_bus_id="00000000:02:00.0",
        memory_total_bytes=2 * 2**30,
        memory_free_bytes=2**29,
        pcie_generation=5,
        pcie_width=16,
    )
    assert gpus[1].name == "NVIDIA H100 80GB HBM3"  # bytes decoded
    assert nvml.unavailable_reason() is None


@pytest.mark.usefixtures("fake_nvml")
def test_visible_gpus_respects_hidden_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert nvml.visible_gpus() == []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-1e3d")
    assert [g.uuid for g in nvml.visible_gpus()] == [UUIDS[1]]


def test_unsupported_pcie_query_gives_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(nvml._state, "ready", True)
    monkeypatch.setitem(nvml._state, "module", _fake_pynvml(fail_pcie=True))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpus = nvml.visible_gpus()
    assert len(gpus) == 2
    assert all(g.pcie_generation is None and g.pcie_width == 16 for g in gpus)


def test_failing_query_gives_empty_list_and_reason(
    monkeypatch: pytest.MonkeyPatch, fake_nvml: Any
) -> None:
    def boom() -> int:
        raise RuntimeError("GPU is lost")

    monkeypatch.setattr(fake_nvml, "nvmlDeviceGetCount", boom, raising=False)
    monkeypatch.setitem(nvml._state, "reason", None)
    assert nvml.visible_gpus() == []
    assert nvml.unavailable_reason() == "NVML query failed: GPU is lost"


@pytest.mark.usefixtures("fake_nvml")
def test_other_queries_with_fake_nvml() -> None:
    assert nvml.driver_version() == "550.54.15"
    assert nvml.utilization_now(0) == 42
    assert nvml.utilization_samples(0, 1000) == [(1010, 99), (1020, 3)]
    assert nvml.index_for_bus_id("00000000:02:00.0") == 1
    assert nvml.index_for_bus_id("00000000:77:00.0") is None  # unknown bus: None, no raise


def test_only_samples_whose_period_lies_in_the_window_are_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sample is the busy percent since the one before it: the first after the window's
    start covers the idle time before it, and a window shorter than a period has no reading."""
    buffer = [(400_000, 0), (1_000_000, 0), (1_166_000, 90), (1_333_000, 95), (1_500_000, 97)]
    buffer.append((1_666_000, 10))
    asked: list[int] = []

    def samples(index: int, since_us: int) -> list[tuple[int, int]]:
        asked.append(since_us)
        return [s for s in reversed(buffer) if s[0] > since_us]  # in any order

    monkeypatch.setattr(nvml, "utilization_samples", samples)
    assert nvml.utilization_within(0, 1_100_000, 1_600_000) == [95, 97]
    assert asked == [100_000]  # read from a whole period before the start
    assert nvml.utilization_within(0, 1_000_000, 1_666_000) == [90, 95, 97, 10]
    assert nvml.utilization_within(0, 1_100_000, 1_250_000) == []  # not the idle start's 0%
    monkeypatch.setattr(nvml, "utilization_samples", lambda index, since_us: None)
    assert nvml.utilization_within(0, 1_100_000, 1_600_000) is None
