"""InfiniBand/RoCE NICs from ``/sys/class/infiniband`` and their PCIe distance to GPUs.

The nearest GPU of a NIC is the one whose PCI device path shares the longest prefix with
the NIC's (same PCIe switch beats same root complex beats same socket): the GPU whose
traffic reaches that NIC without crossing the CPU interconnect.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path

from choreo_agents.model import Gpu, Nic

log = logging.getLogger(__name__)

_RATE = re.compile(r"^\s*([0-9.]+)\s*Gb/sec")


def normalize_bus_id(bus_id: str) -> str:
    """NVML writes ``00000000:17:00.0``, sysfs ``0000:17:00.0``: compare in sysfs form."""
    text = bus_id.strip().lower()
    domain, sep, rest = text.partition(":")
    if not sep:
        return text
    return f"{int(domain, 16):04x}:{rest}" if domain else rest


def pci_path(root: Path, bus_id: str) -> tuple[str, ...]:
    """The chain of PCI devices from the root complex down to ``bus_id``."""
    link = root / "bus" / "pci" / "devices" / normalize_bus_id(bus_id)
    try:
        resolved = os.path.realpath(link)
    except OSError:
        return ()
    return tuple(p for p in Path(resolved).parts if re.match(r"^(pci)?[0-9a-f]{4}:", p))


def _common(a: Sequence[str], b: Sequence[str]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def discover_nics(gpus: Sequence[Gpu], root: Path = Path("/sys")) -> list[Nic]:
    """NICs with port-1 rate (bytes/s) and the GPU closest on PCIe; empty if none."""
    ib = root / "class" / "infiniband"
    if not ib.is_dir():
        return []
    gpu_paths = {g.index: pci_path(root, g.pci_bus_id) for g in gpus if g.pci_bus_id}
    nics: list[Nic] = []
    for rail, dev in enumerate(sorted(ib.iterdir(), key=lambda p: p.name)):
        try:
            device = os.path.realpath(dev / "device")
            rate_text = (dev / "ports" / "1" / "rate").read_text()
        except OSError as exc:
            log.warning("skipping NIC %s: %s", dev.name, exc)
            continue
        m = _RATE.match(rate_text)
        bandwidth = float(m.group(1)) * 1e9 / 8 if m else 0.0
        if bandwidth <= 0:
            log.warning("skipping NIC %s: unreadable rate %r", dev.name, rate_text.strip())
            continue
        nic_path = tuple(p for p in Path(device).parts if re.match(r"^(pci)?[0-9a-f]{4}:", p))
        nearest = max(gpu_paths, key=lambda g: (_common(gpu_paths[g], nic_path), -g), default=None)
        if nearest is not None and _common(gpu_paths[nearest], nic_path) == 0:
            nearest = None
        nics.append(Nic(dev.name, rail, bandwidth, nearest, nic_path[-1] if nic_path else ""))
    return nics


def nic_up(name: str, root: Path = Path("/sys")) -> bool:
    """Port 1 of the NIC reports ACTIVE."""
    try:
        state = (root / "class" / "infiniband" / name / "ports" / "1" / "state").read_text()
    except OSError:
        return False
    return "ACTIVE" in state.upper()
