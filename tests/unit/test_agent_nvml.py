"""The NVML backend against a fake ``pynvml``: same function names, constants and errors."""

# The DCGM sample is exporter output verbatim, wide label sets included.
# ruff: noqa: E501

from __future__ import annotations

import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from choreo_agents.backends import BackendError
from choreo_agents.backends.dcgm import DcgmSource, parse_metrics
from choreo_agents.backends.nvml import SWITCH, NvmlBackend
from choreo_agents.backends.sysfs import discover_nics, normalize_bus_id
from choreo_agents.health import HealthMonitor
from choreo_agents.model import Gpu, Peer
from choreo_api import Device

CONSTANTS = {
    "NVML_FEATURE_DISABLED": 0,
    "NVML_FEATURE_ENABLED": 1,
    "NVML_NVLINK_MAX_LINKS": 36,
    "NVML_NVLINK_DEVICE_TYPE_GPU": 0,
    "NVML_NVLINK_DEVICE_TYPE_IBMNPU": 1,
    "NVML_NVLINK_DEVICE_TYPE_SWITCH": 2,
    "NVML_NVLINK_DEVICE_TYPE_UNKNOWN": 255,
    "NVML_NVLINK_ERROR_DL_REPLAY": 0,
    "NVML_NVLINK_ERROR_DL_RECOVERY": 1,
    "NVML_NVLINK_ERROR_DL_CRC_FLIT": 2,
    "NVML_NVLINK_ERROR_DL_CRC_DATA": 3,
    "NVML_TOPOLOGY_INTERNAL": 0,
    "NVML_TOPOLOGY_SINGLE": 10,
    "NVML_TOPOLOGY_MULTIPLE": 20,
    "NVML_TOPOLOGY_HOSTBRIDGE": 30,
    "NVML_TOPOLOGY_NODE": 40,
    "NVML_TOPOLOGY_SYSTEM": 50,
    "NVML_ERROR_UNINITIALIZED": 1,
    "NVML_ERROR_INVALID_ARGUMENT": 2,
    "NVML_ERROR_NOT_SUPPORTED": 3,
    "NVML_ERROR_NOT_FOUND": 6,
    "NVML_ERROR_DRIVER_NOT_LOADED": 9,
    "NVML_ERROR_TIMEOUT": 10,
    "NVML_ERROR_LIBRARY_NOT_FOUND": 12,
    "NVML_ERROR_GPU_IS_LOST": 15,
    "NVML_ERROR_UNKNOWN": 999,
    "nvmlEventTypeXidCriticalError": 8,
}


class NVMLError(Exception):
    """Like pynvml's: carries ``value``; subclasses are built per error code."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {15: "GPU is lost", 3: "Not Supported", 10: "Timeout"}.get(self.value, "Unknown")


class NVMLError_GpuIsLost(NVMLError):
    def __init__(self) -> None:
        super().__init__(15)


class NVMLError_LibraryNotFound(NVMLError):
    def __init__(self) -> None:
        super().__init__(12)


@dataclass
class PciInfo:
    busId: bytes


@dataclass
class EventData:
    device: Any
    eventType: int
    eventData: int


@dataclass
class FakeGpu:
    bus: str
    uuid: str
    links: dict[int, tuple[str, int]] = field(default_factory=dict)
    """link id -> (remote bus id, remote device type)"""
    down: set[int] = field(default_factory=set)
    errors: dict[tuple[int, int], int] = field(default_factory=dict)
    lost: bool = False
    version: int = 3
    numa: int = 0


class FakeNvml(types.ModuleType):
    """A module object with pynvml's API over an in-memory machine."""

    def __init__(self, gpus: list[FakeGpu], init_error: int | None = None) -> None:
        super().__init__("pynvml")
        for name, value in CONSTANTS.items():
            setattr(self, name, value)
        self.NVMLError = NVMLError
        self.NVMLError_GpuIsLost = NVMLError_GpuIsLost
        self.gpus = gpus
        self.init_error = init_error
        self.events: list[EventData] = []
        self.calls: list[str] = []

    def _gpu(self, handle: int) -> FakeGpu:
        gpu = self.gpus[handle]
        if gpu.lost:
            raise NVMLError_GpuIsLost()
        return gpu

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if not 0 <= index < len(self.gpus):
            raise NVMLError(2)
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return self._gpu(handle).uuid

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        self._gpu(handle)
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetPciInfo(self, handle: int) -> PciInfo:
        return PciInfo(self._gpu(handle).bus.encode())

    def nvmlDeviceGetNumaNodeId(self, handle: int) -> int:
        return self._gpu(handle).numa

    def _link(self, handle: int, link: int) -> tuple[str, int]:
        gpu = self._gpu(handle)
        if link not in gpu.links:
            raise NVMLError(3 if not gpu.links else 2)
        return gpu.links[link]

    def nvmlDeviceGetNvLinkState(self, handle: int, link: int) -> int:
        self._link(handle, link)
        return 0 if link in self._gpu(handle).down else 1

    def nvmlDeviceGetNvLinkVersion(self, handle: int, link: int) -> int:
        self._link(handle, link)
        return self._gpu(handle).version

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: int, link: int) -> PciInfo:
        return PciInfo(self._link(handle, link)[0].encode())

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: int, link: int) -> int:
        return self._link(handle, link)[1]

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: int, link: int, counter: int) -> int:
        self._link(handle, link)
        return self._gpu(handle).errors.get((link, counter), 0)

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:
        same_socket = self._gpu(a).numa == self._gpu(b).numa
        return 30 if same_socket else 50

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: int) -> int:
        self._gpu(handle)
        return 4

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: int) -> int:
        self._gpu(handle)
        return 16

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceRegisterEvents(self, handle: int, types_: int, event_set: str) -> None:
        self._gpu(handle)

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> EventData:
        if not self.events:
            raise NVMLError(10)
        return self.events.pop(0)

    def nvmlEventSetFree(self, event_set: str) -> None:
        self.calls.append("free")


def _bus(i: int) -> str:
    return f"00000000:{0x18 + 0x10 * i:02X}:00.0"


def cube_mesh() -> FakeNvml:
    """4 GPUs: 0-1 and 2-3 joined by two NVLinks, 0-2 by one, 1-3 only over PCIe."""
    gpus = [FakeGpu(_bus(i), f"GPU-{i:08d}", numa=i // 2) for i in range(4)]
    wires = [(0, 1), (0, 1), (2, 3), (2, 3), (0, 2)]
    next_link = [0, 0, 0, 0]
    for a, b in wires:
        gpus[a].links[next_link[a]] = (_bus(b), 0)
        gpus[b].links[next_link[b]] = (_bus(a), 0)
        next_link[a] += 1
        next_link[b] += 1
    return FakeNvml(gpus)


def hgx() -> FakeNvml:
    """8 GPUs with 18 NVLink4 links each to NVSwitch chips."""
    gpus = [FakeGpu(_bus(i), f"GPU-{i:08d}", version=4) for i in range(8)]
    for g in gpus:
        g.links = {lid: (f"00000000:{0xA0 + lid % 4:02X}:00.0", 2) for lid in range(18)}
    return FakeNvml(gpus)


def test_fake_matches_the_real_pynvml_constants() -> None:
    pynvml = pytest.importorskip("pynvml")
    for name, value in CONSTANTS.items():
        assert getattr(pynvml, name) == value, name
    for fn in [n for n in dir(FakeNvml) if n.startswith("nvml")]:
        assert hasattr(pynvml, fn), fn
    assert issubclass(pynvml.NVMLError_GpuIsLost, pynvml.NVMLError)


def test_discovery_of_a_cube_mesh_with_pcie_fallback() -> None:
    inv = NvmlBackend(cube_mesh(), sysfs_root=Path("/nonexistent")).discover()
    assert [g.uuid for g in inv.gpus] == [f"GPU-{i:08d}" for i in range(4)]
    assert inv.gpus[1].pci_bus_id == "00000000:28:00.0"
    assert inv.gpus[0].model == "NVIDIA H100 80GB HBM3"
    assert not inv.nvswitch
    nv = {(ln.src, ln.peer.gpu): ln for ln in inv.links if ln.kind == "nvlink"}
    assert nv[(0, 1)].count == 2 and nv[(1, 0)].count == 2 and nv[(0, 2)].count == 1
    assert nv[(0, 1)].bandwidth == 25e9
    pcie = {(ln.src, ln.peer.gpu): ln for ln in inv.links if ln.kind == "pcie"}
    assert set(pcie) == {(0, 3), (3, 0), (1, 2), (2, 1), (1, 3), (3, 1)}
    assert pcie[(1, 3)].bandwidth == pytest.approx(16 * 1.969e9 / 2)  # crosses sockets


def test_discovery_of_an_nvswitch_node() -> None:
    inv = NvmlBackend(hgx(), sysfs_root=Path("/nonexistent")).discover()
    assert inv.nvswitch
    assert len(inv.links) == 8
    assert all(ln.peer == Peer(switch=SWITCH) and ln.count == 18 for ln in inv.links)
    assert all(ln.kind == "nvswitch" and ln.bandwidth == 25e9 for ln in inv.links)


def test_missing_driver_is_a_backend_error_not_a_crash() -> None:
    backend = NvmlBackend(FakeNvml([], init_error=None))
    with pytest.raises(BackendError, match="no GPUs"):
        backend.discover()


def test_health_reports_down_partial_lost_counters_and_xids() -> None:
    nvml = cube_mesh()
    backend = NvmlBackend(nvml, sysfs_root=Path("/nonexistent"))
    inv = backend.discover()
    pair01 = Device.link(0, gpu=1)
    pair02 = Device.link(0, gpu=2)
    raw = backend.health(inv)
    assert all(raw.gpu_present.values()) and raw.link_up[pair01] and raw.link_up[pair02]
    assert raw.counters[pair01] == {"crc": 0.0, "replay": 0.0, "recovery": 0.0}

    nvml.gpus[0].down.add(0)  # one of the two 0-1 links
    nvml.gpus[1].down.add(0)
    nvml.gpus[0].down.add(2)  # the only 0-2 link
    nvml.gpus[2].down.add(2)
    nvml.gpus[0].errors[(1, 2)] = 40  # CRC flit errors on GPU 0's second 0-1 link
    nvml.gpus[1].errors[(1, 0)] = 7  # replays seen from GPU 1's end
    nvml.events.append(EventData(2, 8, 79))
    raw = backend.health(inv)
    assert raw.link_up[pair01] and "2 of 4 NVLinks inactive" in raw.link_partial[pair01]
    assert not raw.link_up[pair02]
    assert raw.counters[pair01]["crc"] == 40 and raw.counters[pair01]["replay"] == 7
    assert raw.xids == [(2, 79)]
    assert backend.health(inv).xids == []

    nvml.gpus[3].lost = True
    raw = backend.health(inv)
    assert raw.gpu_present[3] is False
    assert raw.counters[Device.link(2, gpu=3)] == {
        "crc": 0.0,
        "replay": 0.0,
        "recovery": 0.0,
    }  # read from GPU 2's end only


def test_a_link_already_down_at_discovery_is_still_known() -> None:
    nvml = cube_mesh()
    nvml.gpus[0].down.add(2)
    nvml.gpus[2].down.add(2)
    backend = NvmlBackend(nvml, sysfs_root=Path("/nonexistent"))
    inv = backend.discover()
    assert inv.link(0, Peer(gpu=2)) is not None
    assert backend.health(inv).link_up[Device.link(0, gpu=2)] is False


def test_lost_gpu_and_fatal_xid_become_bad_observations() -> None:
    nvml = cube_mesh()
    backend = NvmlBackend(nvml, sysfs_root=Path("/nonexistent"))
    inv = backend.discover()
    monitor = HealthMonitor()
    nvml.gpus[1].lost = True
    nvml.events.append(EventData(2, 8, 48))
    sample = monitor.observe(inv, backend.health(inv), now=1.0)
    assert sample.observations[Device.of_gpu(1)].bad
    assert "XID 48" in sample.observations[Device.of_gpu(2)].reason
    assert not sample.observations[Device.of_gpu(0)].bad


def test_a_gpu_that_vanishes_during_discovery_fails_discovery_cleanly() -> None:
    nvml = cube_mesh()
    nvml.gpus[2].lost = True
    with pytest.raises(BackendError, match="GPU is lost"):
        NvmlBackend(nvml).discover()


def test_measure_without_tools_or_cupy_measures_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    backend = NvmlBackend(cube_mesh(), sysfs_root=Path("/nonexistent"))
    inv = backend.discover()
    assert backend.measure(inv.links) == {}


def test_measure_with_nccl_tests_shares_one_run_per_gpu_pair(tmp_path: Path) -> None:
    from test_agent_nccl import SENDRECV

    (tmp_path / "out.txt").write_text(SENDRECV)
    tool = tmp_path / "sendrecv_perf"
    tool.write_text(f"#!/bin/sh\necho run >> {tmp_path}/runs\ncat {tmp_path}/out.txt\n")
    tool.chmod(0o755)
    backend = NvmlBackend(cube_mesh(), sysfs_root=Path("/nonexistent"), nccl_dirs=[str(tmp_path)])
    inv = backend.discover()
    gpu_links = [ln for ln in inv.links if ln.peer.gpu is not None]
    got = backend.measure(gpu_links)
    assert set(got) == set(gpu_links)
    assert len((tmp_path / "runs").read_text().splitlines()) == 6  # 4 GPUs: 6 pairs
    assert all(len(s) == 20 for s in got.values() if not isinstance(s, Exception))


def test_close_frees_events_and_shuts_down() -> None:
    nvml = cube_mesh()
    backend = NvmlBackend(nvml, sysfs_root=Path("/nonexistent"))
    backend.discover()
    backend.close()
    assert nvml.calls == ["free", "shutdown"]


# ---- NICs from sysfs ---------------------------------------------------------------------------
def _sysfs(tmp_path: Path) -> Path:
    """Two sockets; mlx5_0 under GPU 0's PCIe switch, mlx5_1 under GPU 1's."""
    root = tmp_path / "sys"
    devices = root / "devices"
    paths = {
        "0000:18:00.0": "pci0000:00/0000:00:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0",
        "0000:1a:00.0": "pci0000:00/0000:00:01.0/0000:16:00.0/0000:17:01.0/0000:1a:00.0",
        "0000:98:00.0": "pci0000:80/0000:80:01.0/0000:96:00.0/0000:97:00.0/0000:98:00.0",
        "0000:9a:00.0": "pci0000:80/0000:80:01.0/0000:96:00.0/0000:97:01.0/0000:9a:00.0",
    }
    bus = root / "bus" / "pci" / "devices"
    bus.mkdir(parents=True)
    for bus_id, rel in paths.items():
        (devices / rel).mkdir(parents=True)
        (bus / bus_id).symlink_to(devices / rel)
    for name, nic_bus, rate, state in (
        ("mlx5_0", "0000:1a:00.0", "400 Gb/sec (4X NDR)", "4: ACTIVE"),
        ("mlx5_1", "0000:9a:00.0", "200 Gb/sec (4X HDR)", "1: DOWN"),
    ):
        dev = root / "class" / "infiniband" / name
        (dev / "ports" / "1").mkdir(parents=True)
        (dev / "device").symlink_to(devices / paths[nic_bus])
        (dev / "ports" / "1" / "rate").write_text(rate + "\n")
        (dev / "ports" / "1" / "state").write_text(state + "\n")
    return root


def test_nics_get_rate_rail_and_nearest_gpu(tmp_path: Path) -> None:
    root = _sysfs(tmp_path)
    gpus = [Gpu(0, pci_bus_id="00000000:18:00.0"), Gpu(1, pci_bus_id="00000000:98:00.0")]
    nics = discover_nics(gpus, root)
    assert [(n.name, n.rail, n.nearest_gpu) for n in nics] == [("mlx5_0", 0, 0), ("mlx5_1", 1, 1)]
    assert nics[0].bandwidth == 50e9 and nics[1].bandwidth == 25e9
    assert normalize_bus_id("00000000:18:00.0") == "0000:18:00.0"


def test_nic_port_state_feeds_health(tmp_path: Path) -> None:
    root = _sysfs(tmp_path)
    nvml = cube_mesh()
    nvml.gpus[0].bus = "00000000:18:00.0"
    nvml.gpus[1].bus = "00000000:98:00.0"
    backend = NvmlBackend(nvml, sysfs_root=root)
    inv = backend.discover()
    assert {ln.peer.nic for ln in inv.links if ln.peer.nic} == {"mlx5_0", "mlx5_1"}
    raw = backend.health(inv)
    assert raw.nic_up == {"mlx5_0": True, "mlx5_1": False}


# ---- DCGM exporter ------------------------------------------------------------------------------
DCGM_TEXT = """\
# HELP DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL Total number of NVLink flow-control CRC errors.
# TYPE DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL counter
DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{gpu="0",UUID="GPU-00000000",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="hgx-3"} 12
DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{gpu="1",UUID="GPU-00000001",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="hgx-3"} 0
# HELP DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL Total number of NVLink data CRC errors.
# TYPE DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL counter
DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL{gpu="0",UUID="GPU-00000000",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="hgx-3"} 3
# HELP DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL Total number of NVLink retries.
# TYPE DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL counter
DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL{gpu="0",UUID="GPU-00000000",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="hgx-3"} 5
# HELP DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL Total number of NVLink recovery errors.
# TYPE DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL counter
DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL{gpu="0",UUID="GPU-00000000",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="hgx-3"} 1
# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.
# TYPE DCGM_FI_DEV_XID_ERRORS gauge
DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-00000000",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="hgx-3",err_code="0",err_msg="No Error"} 0
DCGM_FI_DEV_XID_ERRORS{gpu="1",UUID="GPU-00000001",device="nvidia1",modelName="NVIDIA H100 80GB HBM3",Hostname="hgx-3",err_code="0",err_msg="No Error"} 0
# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).
# TYPE DCGM_FI_DEV_GPU_TEMP gauge
DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-00000000",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",Hostname="hgx-3"} 41
"""


def test_dcgm_metrics_give_per_gpu_counters() -> None:
    reading = parse_metrics(DCGM_TEXT)
    assert reading.counters[0] == {"crc": 15.0, "replay": 5.0, "recovery": 1.0}
    assert reading.counters[1] == {"crc": 0.0}
    assert reading.last_xid == {0: 0, 1: 0}


def test_dcgm_xid_changes_become_events() -> None:
    source = DcgmSource("http://127.0.0.1:1/metrics")
    assert source.new_xids(parse_metrics(DCGM_TEXT)) == []
    changed = DCGM_TEXT.replace(
        'err_msg="No Error"} 0\nDCGM_FI_DEV_XID_ERRORS{gpu="1"',
        'err_msg="x"} 79\nDCGM_FI_DEV_XID_ERRORS{gpu="1"',
    )
    assert source.new_xids(parse_metrics(changed)) == [(0, 79)]
    assert source.new_xids(parse_metrics(changed)) == []


def test_unreachable_dcgm_exporter_is_a_backend_error() -> None:
    with pytest.raises(BackendError, match="DCGM exporter"):
        DcgmSource("http://127.0.0.1:9/metrics", timeout=0.5).read()


def test_dcgm_garbage_is_a_backend_error() -> None:
    with pytest.raises(BackendError, match="not Prometheus text"):
        parse_metrics('DCGM_FI_DEV_XID_ERRORS{gpu="0" 12 garbage {{{\n')
