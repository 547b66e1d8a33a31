"""Discovery backends: where an agent learns its node's GPUs, links, NICs and raw health.

A backend reports *raw* signals (link up or down, cumulative error counters, XID events);
``choreo_agents.health`` turns them into verdicts and debounces them, the same way for
every backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from choreo_agents.model import Inventory, LinkSpec
from choreo_agents.probes import ProbeError, Samples
from choreo_api import Device

COUNTERS = ("crc", "replay", "recovery")
"""NVLink data-link error counters the agent watches (NVML DL_CRC_*, DL_REPLAY, DL_RECOVERY)."""


class BackendError(RuntimeError):
    """Discovery or a health read failed as a whole (driver missing, library failing)."""


@dataclass(slots=True)
class RawHealth:
    """One poll of the hardware's own signals, before any interpretation."""

    gpu_present: dict[int, bool] = field(default_factory=dict)
    link_up: dict[Device, bool] = field(default_factory=dict)
    link_partial: dict[Device, str] = field(default_factory=dict)
    counters: dict[Device, dict[str, float]] = field(default_factory=dict)
    nic_up: dict[str, bool] = field(default_factory=dict)
    xids: list[tuple[int, int]] = field(default_factory=list)
    """(gpu, XID code) events seen since the previous poll."""


class Backend(Protocol):
    name: str

    def discover(self) -> Inventory:
        """The node's devices and links with nominal costs; raises ``BackendError``."""
        ...

    def health(self, inventory: Inventory) -> RawHealth:
        """Read the raw health signals once; raises ``BackendError``."""
        ...

    def measure(self, links: Sequence[LinkSpec]) -> dict[LinkSpec, Samples | ProbeError]:
        """Timed transfers per link; a link that cannot be timed maps to its error."""
        ...

    def close(self) -> None: ...
