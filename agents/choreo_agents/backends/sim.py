"""The simulated backend: one node cut out of a synthesizer fabric, with noise and faults.

The fabric is any ``--topology`` the synthesizer accepts (a built-in name such as
``dgx-h100-8`` or a topology file), so tests, the demo and the synthesizer agree on the
hardware. Node names like ``node3/gpu5`` group NPUs into machines; the agent takes one
group (by prefix or by position). Links between two of its GPUs, or to a switch with the
same prefix (``node3/sw-nvswitch``), are intra-node; a link to anything else (a rail
switch, another node's GPU) leaves through a NIC.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from choreo.topology import NodeKind, Topology
from choreo_agents.backends import BackendError, RawHealth
from choreo_agents.backends.script import Script, ScriptError, load_script
from choreo_agents.model import Gpu, Inventory, LinkSpec, Nic, Peer
from choreo_agents.probes import DEFAULT_REPEATS, DEFAULT_SIZES, ProbeError, Samples

log = logging.getLogger(__name__)

OUTLIER_PROBABILITY = 0.02
"""Share of simulated transfers slowed 2-6x, as a preempted or contended copy would be."""


@dataclass(frozen=True, slots=True)
class NodeSlice:
    """One machine's part of a fabric: its NPUs (global ids in local order) and prefix."""

    prefix: str
    npus: tuple[int, ...]


def machines(topo: Topology) -> list[NodeSlice]:
    """The fabric's machines in order of first appearance; unprefixed fabrics are one."""
    groups: dict[str, list[int]] = {}
    for v in topo.all_npus:
        name = topo.names[v] if topo.names else ""
        prefix = name.rsplit("/", 1)[0] if "/" in name else ""
        groups.setdefault(prefix, []).append(v)
    if "" in groups and len(groups) > 1:
        groups = {"": [v for members in groups.values() for v in members]}
    return [NodeSlice(p, tuple(v)) for p, v in groups.items()]


def select_machine(topo: Topology, node: str | int) -> NodeSlice:
    """A machine by prefix (``node3``) or position (``3``); a one-machine fabric fits any name."""
    slices = machines(topo)
    if isinstance(node, int) or (isinstance(node, str) and node.isdigit()):
        k = int(node)
        if not 0 <= k < len(slices):
            raise BackendError(
                f"fabric {topo.name} has {len(slices)} node(s); position {k} is out of range"
            )
        return slices[k]
    for s in slices:
        if s.prefix == node:
            return s
    if len(slices) == 1:
        return slices[0]
    shown = ", ".join(s.prefix for s in slices[:6]) + (", ..." if len(slices) > 6 else "")
    raise BackendError(
        f"fabric {topo.name} has no node {node!r} (nodes: {shown}); "
        "pass --fabric-node with a prefix or position"
    )


def slice_inventory(topo: Topology, machine: NodeSlice) -> Inventory:
    """Turn one machine of the fabric into what discovery would report for it."""
    local = {v: i for i, v in enumerate(machine.npus)}
    if len(local) > 64:
        raise BackendError(f"node {machine.prefix or topo.name} has {len(local)} GPUs; at most 64")
    nic_of: dict[int, str] = {}
    nics: list[Nic] = []
    groups: dict[tuple[int, Peer, str, float, float], int] = {}
    for link in topo.links:
        if link.src not in local:
            continue
        peer = _peer(topo, machine, local, link.dst)
        if peer is None:
            key = link.dst
            if key not in nic_of:
                name = f"mlx5_{len(nics)}"
                nic_of[key] = name
                nics.append(
                    Nic(name, _rail(topo, link.dst, len(nics)), link.bandwidth, local[link.src])
                )
            peer = Peer(nic=nic_of[key])
        gkey = (local[link.src], peer, link.kind, link.bandwidth, link.alpha)
        groups[gkey] = groups.get(gkey, 0) + 1
    links = tuple(
        LinkSpec(src, peer, kind, count, bandwidth, alpha)
        for (src, peer, kind, bandwidth, alpha), count in groups.items()
    )
    gpus = tuple(
        Gpu(i, uuid=_uuid(topo, v), pci_bus_id=f"00000000:{0x18 + 16 * i:02X}:00.0", model="sim")
        for i, v in enumerate(machine.npus)
    )
    nvswitch = any(link.peer.switch is not None for link in links)
    return Inventory("sim", gpus, links, tuple(nics), nvswitch)


def _peer(topo: Topology, machine: NodeSlice, local: dict[int, int], dst: int) -> Peer | None:
    if dst in local:
        return Peer(gpu=local[dst])
    if topo.kinds[dst] is NodeKind.SWITCH:
        name = topo.node_name(dst)
        if not machine.prefix:
            return Peer(switch=name)
        if name.startswith(machine.prefix + "/"):
            return Peer(switch=name[len(machine.prefix) + 1 :])
    return None


def _rail(topo: Topology, dst: int, fallback: int) -> int:
    m = re.search(r"(\d+)$", topo.node_name(dst))
    return int(m.group(1)) if m and topo.kinds[dst] is NodeKind.SWITCH else fallback - 1


def _uuid(topo: Topology, v: int) -> str:
    digest = hashlib.sha256(f"{topo.name}/{topo.node_name(v)}".encode()).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


class SimBackend:
    """Discovery, health and timings of a simulated node; the script drives its faults."""

    name = "sim"

    def __init__(
        self,
        topo: Topology,
        node: str | int,
        *,
        noise: float = 0.05,
        script: Script | None = None,
        seed: int = 0,
        sizes: Sequence[float] = DEFAULT_SIZES,
        repeats: int = DEFAULT_REPEATS,
        clock: Callable[[], float] | None = None,
        script_path: str | Path | None = None,
    ) -> None:
        if noise < 0:
            raise BackendError(f"noise must be >= 0, got {noise}")
        self.machine = select_machine(topo, node)
        self.inventory = slice_inventory(topo, self.machine)
        self.noise = noise
        self.script = script or Script()
        _check_script(self.script, self.inventory)
        self.sizes = np.asarray(sizes, dtype=float)
        self.repeats = repeats
        start = time.monotonic()
        self._clock = clock or (lambda: time.monotonic() - start)
        self._last_poll = -1.0
        name_seed = int.from_bytes(hashlib.sha256(str(node).encode()).digest()[:4], "big")
        self._rng = np.random.default_rng([seed, name_seed])
        self._script_path = script_path
        self._script_stamp = self._stamp()

    def _stamp(self) -> tuple[int, int] | None:
        if self._script_path is None:
            return None
        try:
            st = os.stat(self._script_path)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def _reload(self) -> None:
        """Pick up an edited script file, so faults can be injected into a running agent.

        The new script replays from the agent's start, so events whose time has passed apply
        at once. A script that no longer parses is logged and the previous one kept: a typo
        must not kill the node's agent.
        """
        stamp = self._stamp()
        if stamp is None or stamp == self._script_stamp:
            return
        self._script_stamp = stamp
        assert self._script_path is not None
        try:
            script = load_script(self._script_path)
            _check_script(script, self.inventory)
        except (ScriptError, BackendError) as exc:
            log.warning("fault script not reloaded, keeping the previous one: %s", exc)
            return
        self.script = script
        log.info("fault script reloaded: %d event(s)", len(script.events))

    def discover(self) -> Inventory:
        return self.inventory

    def health(self, inventory: Inventory) -> RawHealth:
        self._reload()
        now = self._clock()
        state = self.script.state_at(now)
        raw = RawHealth()
        for gpu in inventory.gpus:
            raw.gpu_present[gpu.index] = gpu.index not in state.lost_gpus
        for link in inventory.links:
            key = link.device
            if link.peer.nic is not None:
                continue
            raw.link_up[key] = key not in state.down_links
            if key in state.counters:
                raw.counters[key] = dict(state.counters[key])
            factor = state.degraded.get(key)
            if factor is not None:
                raw.link_partial[key] = f"running at {factor:.0%} of nominal bandwidth"
        for nic in inventory.nics:
            raw.nic_up[nic.name] = nic.name not in state.down_nics
        raw.xids = self.script.xids_between(self._last_poll, now)
        self._last_poll = now
        return raw

    def measure(self, links: Sequence[LinkSpec]) -> dict[LinkSpec, Samples | ProbeError]:
        state = self.script.state_at(self._clock())
        out: dict[LinkSpec, Samples | ProbeError] = {}
        sizes = np.repeat(self.sizes, self.repeats)
        for link in links:
            key = link.device
            lost = [g for g in (link.src, link.peer.gpu) if g is not None and g in state.lost_gpus]
            if lost:
                out[link] = ProbeError(f"gpu{lost[0]} is lost")
                continue
            if key in state.down_links or (link.peer.nic and link.peer.nic in state.down_nics):
                out[link] = ProbeError(f"link {link.label} is down")
                continue
            bandwidth = link.bandwidth * link.count * state.degraded.get(key, 1.0)
            truth = link.alpha + sizes / bandwidth
            jitter = np.clip(1.0 + self.noise * self._rng.standard_normal(len(sizes)), 0.05, None)
            slow = self._rng.random(len(sizes)) < OUTLIER_PROBABILITY
            jitter[slow] *= self._rng.uniform(2.0, 6.0, int(slow.sum()))
            out[link] = Samples(sizes.copy(), truth * jitter)
        return out

    def close(self) -> None:
        return None


def _check_script(script: Script, inventory: Inventory) -> None:
    """Every device a script names must exist on this node, or the test it drives is wrong."""
    links = {link.device for link in inventory.links}
    nics = {nic.name for nic in inventory.nics}
    for i, ev in enumerate(script.events):
        where = f"script event {i} ({ev.action} at {ev.at:g} s)"
        if ev.gpu is not None and not 0 <= ev.gpu < len(inventory.gpus):
            raise BackendError(f"{where}: gpu {ev.gpu} is not on this node")
        if ev.link is not None and ev.link not in links:
            raise BackendError(f"{where}: link {ev.link.label()[5:]} is not on this node")
        if ev.nic is not None and ev.nic not in nics:
            raise BackendError(f"{where}: NIC {ev.nic} is not on this node")
