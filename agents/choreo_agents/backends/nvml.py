"""The NVML backend: real GPUs through ``pynvml`` (the nvidia-ml-py package).

Discovery walks every GPU's NVLinks (state, version, remote PCI device: another GPU or an
NVSwitch), falls back to PCIe between GPUs that share no NVLink and no switch, and finds
NICs in sysfs. Health reads link state, the NVLink data-link error counters (CRC, replay,
recovery) and drains XID events; a GPU that answers ``GPU is lost`` is reported missing.
Timings come from nccl-tests when its binaries exist, otherwise from cupy peer copies.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from choreo_agents.backends import BackendError, RawHealth
from choreo_agents.backends.dcgm import DcgmSource
from choreo_agents.backends.sysfs import discover_nics, nic_up, normalize_bus_id
from choreo_agents.model import Gpu, Inventory, LinkSpec, Peer
from choreo_agents.probes import ProbeError, Samples, nccl
from choreo_agents.probes import cuda as cuda_probe
from choreo_api import Device

log = logging.getLogger(__name__)

GB = 1e9
NVLINK_BANDWIDTH = {1: 20 * GB, 2: 25 * GB, 3: 25 * GB, 4: 25 * GB, 5: 50 * GB}
"""Per-link, per-direction NVLink bandwidth by NVLink version (NVML reports 1..5)."""
PCIE_LANE = {1: 0.25 * GB, 2: 0.5 * GB, 3: 0.985 * GB, 4: 1.969 * GB, 5: 3.938 * GB, 6: 7.563 * GB}
NOMINAL_ALPHA = {"nvlink": 0.7e-6, "nvswitch": 0.7e-6, "pcie": 1.5e-6, "ib": 1.7e-6}
"""Nominal latencies until measured: the same class as the synthesizer's built-in profiles."""
SWITCH = "sw-nvswitch"
"""All NVSwitch chips of a node form one switching plane, reported as one switch."""

_COUNTER_IDS = (
    ("crc", "NVML_NVLINK_ERROR_DL_CRC_FLIT"),
    ("crc", "NVML_NVLINK_ERROR_DL_CRC_DATA"),
    ("replay", "NVML_NVLINK_ERROR_DL_REPLAY"),
    ("recovery", "NVML_NVLINK_ERROR_DL_RECOVERY"),
)
_LOST = ("NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_UNKNOWN", "NVML_ERROR_NOT_FOUND")


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def load_nvml() -> ModuleType:
    """Import pynvml and initialise it; ``BackendError`` says why when there is no driver."""
    try:
        nvml = importlib.import_module("pynvml")
    except ImportError as exc:
        raise BackendError("pynvml (nvidia-ml-py) is not installed") from exc
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise BackendError(f"NVML init failed: {exc}") from exc
    return nvml


def driver_present(root: Path = Path("/")) -> bool:
    """Whether an NVIDIA driver is loaded (cheap check used by ``--backend auto``)."""
    return (root / "proc" / "driver" / "nvidia" / "version").exists() or (
        root / "dev" / "nvidiactl"
    ).exists()


class NvmlBackend:
    name = "nvml"

    def __init__(
        self,
        nvml: ModuleType | None = None,
        *,
        sysfs_root: Path = Path("/sys"),
        dcgm: DcgmSource | None = None,
        nccl_dirs: Sequence[str] = (),
        cupy: Any = None,
    ) -> None:
        self._nvml = nvml
        self.sysfs_root = sysfs_root
        self.dcgm = dcgm
        self.nccl_dirs = tuple(nccl_dirs)
        self.cupy = cupy
        self._handles: dict[int, Any] = {}
        self._uuids: dict[int, str] = {}
        self._physical: dict[Device, list[tuple[int, int]]] = {}
        self._events: Any = None

    @property
    def nvml(self) -> Any:
        """pynvml, initialised on first use so a missing driver is retried, not fatal."""
        if self._nvml is None:
            self._nvml = load_nvml()
        return self._nvml

    # ---- discovery ---------------------------------------------------------------------------
    def discover(self) -> Inventory:
        nv = self.nvml
        try:
            count = nv.nvmlDeviceGetCount()
            gpus = [self._gpu(i) for i in range(count)]
        except nv.NVMLError as exc:
            raise BackendError(f"NVML discovery failed: {exc}") from exc
        if not gpus:
            raise BackendError("NVML reports no GPUs")
        by_bus = {normalize_bus_id(g.pci_bus_id): g.index for g in gpus}
        physical: dict[tuple[int, Peer], list[tuple[int, int]]] = {}
        versions: dict[tuple[int, Peer], int] = {}
        for g in gpus:
            for link_id, peer, version in self._nvlinks(g.index, by_bus):
                physical.setdefault((g.index, peer), []).append((g.index, link_id))
                versions[(g.index, peer)] = version
        links: list[LinkSpec] = []
        self._physical = {}
        for (src, peer), ids in sorted(physical.items()):
            kind = "nvswitch" if peer.switch else "nvlink"
            bw = NVLINK_BANDWIDTH.get(versions[(src, peer)], 25 * GB)
            link = LinkSpec(src, peer, kind, len(ids), bw, NOMINAL_ALPHA[kind])
            links.append(link)
            self._physical.setdefault(link.device, []).extend(ids)
        nvswitch = any(link.peer.switch for link in links)
        if not nvswitch:
            links.extend(self._pcie_links(gpus, {(ln.src, ln.peer.gpu) for ln in links}))
        nics = discover_nics(gpus, self.sysfs_root)
        links.extend(
            LinkSpec(n.nearest_gpu, Peer(nic=n.name), "ib", 1, n.bandwidth, NOMINAL_ALPHA["ib"])
            for n in nics
            if n.nearest_gpu is not None
        )
        self._register_xid_events()
        return Inventory("nvml", tuple(gpus), tuple(links), tuple(nics), nvswitch)

    def _gpu(self, index: int) -> Gpu:
        nv = self.nvml
        handle = nv.nvmlDeviceGetHandleByIndex(index)
        self._handles[index] = handle
        uuid = _text(nv.nvmlDeviceGetUUID(handle))
        self._uuids[index] = uuid
        numa: int | None
        try:
            numa = int(nv.nvmlDeviceGetNumaNodeId(handle))
        except (nv.NVMLError, AttributeError):
            numa = None
        return Gpu(
            index,
            uuid=uuid,
            pci_bus_id=_text(nv.nvmlDeviceGetPciInfo(handle).busId),
            model=_text(nv.nvmlDeviceGetName(handle)),
            numa_node=numa,
        )

    def _nvlinks(self, index: int, by_bus: dict[str, int]) -> list[tuple[int, Peer, int]]:
        """(link id, peer, version) of each NVLink of one GPU whose far end is known.

        Inactive links count too (their remote is still reported), so a link that is already
        down when the agent starts shows up as a failed link rather than not at all.
        """
        nv = self.nvml
        handle = self._handles[index]
        out: list[tuple[int, Peer, int]] = []
        for link_id in range(nv.NVML_NVLINK_MAX_LINKS):
            try:
                nv.nvmlDeviceGetNvLinkState(handle, link_id)
                remote = normalize_bus_id(
                    _text(nv.nvmlDeviceGetNvLinkRemotePciInfo(handle, link_id).busId)
                )
            except nv.NVMLError:
                continue  # no such link on this GPU, or NVLink not supported at all
            version = self._optional(nv.nvmlDeviceGetNvLinkVersion, handle, link_id) or 0
            remote_type = self._optional(nv.nvmlDeviceGetNvLinkRemoteDeviceType, handle, link_id)
            if remote in by_bus and remote_type != nv.NVML_NVLINK_DEVICE_TYPE_SWITCH:
                if by_bus[remote] == index:
                    continue
                out.append((link_id, Peer(gpu=by_bus[remote]), int(version)))
            elif remote_type in (None, nv.NVML_NVLINK_DEVICE_TYPE_SWITCH):
                out.append((link_id, Peer(switch=SWITCH), int(version)))
        return out

    def _optional(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self.nvml.NVMLError:
            return None

    def _pcie_links(
        self, gpus: Sequence[Gpu], nvlinked: set[tuple[int, int | None]]
    ) -> list[LinkSpec]:
        """PCIe between GPUs without NVLink; crossing the CPU interconnect halves it."""
        nv = self.nvml
        lanes: dict[int, float] = {}
        for g in gpus:
            h = self._handles[g.index]
            gen = self._optional(nv.nvmlDeviceGetCurrPcieLinkGeneration, h) or 3
            width = self._optional(nv.nvmlDeviceGetCurrPcieLinkWidth, h) or 16
            lanes[g.index] = PCIE_LANE.get(int(gen), PCIE_LANE[3]) * int(width)
        out: list[LinkSpec] = []
        for a in gpus:
            for b in gpus:
                if a.index == b.index or (a.index, b.index) in nvlinked:
                    continue
                ancestor = self._optional(
                    nv.nvmlDeviceGetTopologyCommonAncestor,
                    self._handles[a.index],
                    self._handles[b.index],
                )
                bw = min(lanes[a.index], lanes[b.index])
                if ancestor is not None and ancestor >= nv.NVML_TOPOLOGY_SYSTEM:
                    bw /= 2
                out.append(
                    LinkSpec(a.index, Peer(gpu=b.index), "pcie", 1, bw, NOMINAL_ALPHA["pcie"])
                )
        return out

    def _register_xid_events(self) -> None:
        nv = self.nvml
        if self._events is not None or self.dcgm is not None:
            return
        try:
            self._events = nv.nvmlEventSetCreate()
            for handle in self._handles.values():
                nv.nvmlDeviceRegisterEvents(handle, nv.nvmlEventTypeXidCriticalError, self._events)
        except nv.NVMLError as exc:
            log.warning("XID events unavailable (%s); relying on GPU-lost checks", exc)

    # ---- health ------------------------------------------------------------------------------
    def health(self, inventory: Inventory) -> RawHealth:
        nv = self.nvml
        raw = RawHealth()
        lost: set[int] = set()
        for gpu in inventory.gpus:
            present = self._present(gpu.index)
            raw.gpu_present[gpu.index] = present
            if not present:
                lost.add(gpu.index)
        for key, ids in self._physical.items():
            alive = [(g, lid) for g, lid in ids if g not in lost]
            if not alive:
                continue
            states = [self._optional(nv.nvmlDeviceGetNvLinkState, self._handles[g], lid)
                      for g, lid in alive]  # fmt: skip
            up = sum(1 for s in states if s == nv.NVML_FEATURE_ENABLED)
            raw.link_up[key] = up > 0
            if 0 < up < len(states):
                raw.link_partial[key] = f"{len(states) - up} of {len(states)} NVLinks inactive"
            if self.dcgm is None:
                raw.counters[key] = self._counters(alive)
        for nic in inventory.nics:
            raw.nic_up[nic.name] = nic_up(nic.name, self.sysfs_root)
        if self.dcgm is not None:
            self._from_dcgm(raw, inventory)
        else:
            raw.xids = self._drain_xids()
        return raw

    def _present(self, index: int) -> bool:
        nv = self.nvml
        try:
            return _text(nv.nvmlDeviceGetUUID(self._handles[index])) == self._uuids[index]
        except nv.NVMLError as exc:
            if any(getattr(exc, "value", None) == getattr(nv, name, -1) for name in _LOST):
                return False
            log.warning("gpu%d: health read failed (%s); treating as present", index, exc)
            return True

    def _counters(self, ids: Sequence[tuple[int, int]]) -> dict[str, float]:
        nv = self.nvml
        totals: dict[str, float] = {}
        for name, const in _COUNTER_IDS:
            for g, lid in ids:
                value = self._optional(
                    nv.nvmlDeviceGetNvLinkErrorCounter, self._handles[g], lid, getattr(nv, const)
                )
                if value is not None:
                    totals[name] = totals.get(name, 0.0) + float(value)
        return totals

    def _drain_xids(self) -> list[tuple[int, int]]:
        nv = self.nvml
        if self._events is None:
            return []
        by_uuid = {uuid: i for i, uuid in self._uuids.items()}
        events: list[tuple[int, int]] = []
        for _ in range(256):  # bounded: a storm of events is drained over several polls
            try:
                data = nv.nvmlEventSetWait_v2(self._events, 0)
            except nv.NVMLError:
                break  # NVML_ERROR_TIMEOUT: nothing pending
            try:
                gpu = by_uuid.get(_text(nv.nvmlDeviceGetUUID(data.device)), -1)
            except nv.NVMLError:
                gpu = -1
            events.append((gpu, int(data.eventData)))
        return events

    def _from_dcgm(self, raw: RawHealth, inventory: Inventory) -> None:
        assert self.dcgm is not None
        try:
            reading, xids = self.dcgm.read()
        except BackendError as exc:
            log.warning("%s; error counters and XIDs skipped this poll", exc)
            return
        raw.xids = xids
        for link in inventory.links:
            if link.kind in ("nvlink", "nvswitch") and link.src in reading.counters:
                raw.counters[link.device] = dict(reading.counters[link.src])

    # ---- measurement -------------------------------------------------------------------------
    def measure(self, links: Sequence[LinkSpec]) -> dict[LinkSpec, Samples | ProbeError]:
        """nccl-tests when found, else cupy peer copies; NIC links need a peer node (skipped)."""
        out: dict[LinkSpec, Samples | ProbeError] = {}
        sendrecv = nccl.find_tool("sendrecv_perf", self.nccl_dirs)
        alltoall = nccl.find_tool("alltoall_perf", self.nccl_dirs)
        pairs: dict[tuple[int, int], Samples | ProbeError] = {}
        switch_samples: Samples | ProbeError | None = None
        for link in links:
            if link.peer.gpu is not None:
                pair = (min(link.src, link.peer.gpu), max(link.src, link.peer.gpu))
                if sendrecv:
                    if pair not in pairs:
                        pairs[pair] = self._nccl(sendrecv, list(pair), 1.0)
                    out[link] = pairs[pair]
                elif self.cupy is not None:
                    out[link] = self._cupy(link.src, link.peer.gpu)
            elif link.peer.switch is not None and alltoall:
                if switch_samples is None:
                    n = len(self._handles)
                    switch_samples = self._nccl(alltoall, sorted(self._handles), (n - 1) / n)
                out[link] = switch_samples
        return out

    def _nccl(self, tool: str, gpus: list[int], scale: float) -> Samples | ProbeError:
        try:
            return nccl.run(tool, gpus).samples(scale)
        except ProbeError as exc:
            return exc

    def _cupy(self, src: int, dst: int) -> Samples | ProbeError:
        try:
            return cuda_probe.peer_copy(self.cupy, src, dst)
        except ProbeError as exc:
            return exc

    def close(self) -> None:
        nv = self._nvml
        if nv is None:
            return
        try:
            if self._events is not None:
                nv.nvmlEventSetFree(self._events)
            nv.nvmlShutdown()
        except nv.NVMLError as exc:
            log.debug("NVML shutdown: %s", exc)
