"""What an agent knows about its node: devices, links, fits and health, independent of backend.

Every backend (NVML, simulated) produces these types, and the reporting code turns them into
the ``NodeFabric`` spec, so the operator sees one shape whatever discovered the hardware.
Whatever can fail is named by the API's ``Device``, as its DeviceFailure will name it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from choreo_api import Device


@dataclass(frozen=True, slots=True, order=True)
class Peer:
    """The far end of a discovered link out of a GPU: exactly one of gpu, switch, nic."""

    gpu: int | None = None
    switch: str | None = None
    nic: str | None = None

    def __post_init__(self) -> None:
        if sum(x is not None for x in (self.gpu, self.switch, self.nic)) != 1:
            raise ValueError("a link peer is exactly one of gpu, switch, nic")

    @property
    def label(self) -> str:
        """Short text for logs and metric labels: ``gpu5``, ``sw-nvswitch``, ``nic:mlx5_0``."""
        if self.gpu is not None:
            return f"gpu{self.gpu}"
        if self.switch is not None:
            return self.switch
        return f"nic:{self.nic}"


def failure_name(node: str, device: Device) -> str:
    """Deterministic DeviceFailure name, e.g. ``node-a-gpu3`` or ``node-a-link-1-5``."""
    return dns_name(f"{node}-{device.label()}")


_DNS_BAD = re.compile(r"[^a-z0-9.-]+")


def dns_name(text: str, limit: int = 253) -> str:
    """A valid object name from free text: lowercase, '_' and friends become '-'."""
    name = _DNS_BAD.sub("-", text.lower()).strip("-.")
    if len(name) <= limit:
        return name
    import hashlib

    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return f"{name[: limit - 11].rstrip('-.')}-{digest}"


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int
    uuid: str = ""
    pci_bus_id: str = ""
    model: str = ""
    numa_node: int | None = None


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """A directed link out of a GPU as discovered, with its nominal (datasheet) cost.

    ``count`` parallel physical links share one entry; ``bandwidth`` is per physical link,
    so the pair's aggregate is ``count * bandwidth``.
    """

    src: int
    peer: Peer
    kind: str
    count: int = 1
    bandwidth: float = 0.0
    alpha: float = 0.0

    @property
    def device(self) -> Device:
        peer = self.peer
        return Device.link(self.src, gpu=peer.gpu, switch=peer.switch, nic=peer.nic)

    @property
    def label(self) -> str:
        return f"{self.src}->{self.peer.label}"


@dataclass(frozen=True, slots=True)
class Nic:
    name: str
    rail: int
    bandwidth: float
    nearest_gpu: int | None = None
    pci_bus_id: str = ""


@dataclass(frozen=True, slots=True)
class Inventory:
    """What discovery found on the node."""

    backend: str
    gpus: tuple[Gpu, ...]
    links: tuple[LinkSpec, ...]
    nics: tuple[Nic, ...] = ()
    nvswitch: bool = False

    def link(self, src: int, peer: Peer) -> LinkSpec | None:
        for link in self.links:
            if link.src == src and link.peer == peer:
                return link
        return None


@dataclass(frozen=True, slots=True)
class Fit:
    """A robust least-squares fit of t = alpha + beta * n over one link's samples."""

    alpha: float
    beta: float
    samples: int
    rejected: int
    residual_seconds: float
    relative_error: float
    alpha_stderr: float = 0.0

    @property
    def bandwidth(self) -> float:
        return 1.0 / self.beta if self.beta > 0 else 0.0


@dataclass(frozen=True, slots=True)
class Observation:
    """One health reading of one device: bad or not, and why."""

    bad: bool
    reason: str = ""


@dataclass(slots=True)
class HealthSample:
    """Everything a health poll saw: device observations plus raw counters for metrics."""

    observations: dict[Device, Observation] = field(default_factory=dict)
    degraded: set[Device] = field(default_factory=set)

    def mark(self, key: Device, bad: bool, reason: str = "") -> None:
        """Record a reading; a bad reading wins over a good one for the same device."""
        old = self.observations.get(key)
        if old is not None and old.bad and not bad:
            return
        if old is not None and old.bad and bad:
            reason = (
                f"{old.reason}; {reason}" if reason and reason not in old.reason else old.reason
            )
        self.observations[key] = Observation(bad, reason)
