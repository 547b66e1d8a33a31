"""The switch-free graph a formulation runs on, and what one chunk costs on each of its links.

Schedules may only name NPU-to-NPU links, so switch fabrics are first turned into logical
links (``choreo.unwind``), each tenant's among its own NPUs as the greedy engine unwinds them
(``choreo.synth.logical_views``). The copy MILP uses the same circulant unwindings as the
greedy engine; the flow LP uses the full mesh of fractional shares, optionally split into
``parallel`` concurrent shares per NPU pair: a share is a static slice of its ports, so
several shares let several transfers' alphas overlap on one port (the verifier's resource
model), which matters when per-transfer latency is a visible fraction of a port's load.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from choreo.collectives import Demand
from choreo.synth import SynthOptions, logical_views
from choreo.topology import Link, Topology


@dataclass(frozen=True)
class Net:
    """Usable links of ``topology`` as arrays; ``time[j, e]`` is one chunk of tenant ``j``
    on usable link ``e`` (alpha + chunk_bytes / bandwidth), the link's exclusive busy time."""

    topology: Topology
    link: np.ndarray  # usable link ids into topology.links
    src: np.ndarray
    dst: np.ndarray
    alpha: np.ndarray
    time: np.ndarray

    @property
    def num_nodes(self) -> int:
        return self.topology.num_nodes

    @property
    def num_links(self) -> int:
        return len(self.link)

    def reversed(self) -> Net:
        """The same links pointing the other way (for combining collectives)."""
        return replace(self, src=self.dst, dst=self.src)


def make_net(topology: Topology, demands: tuple[Demand, ...]) -> Net:
    usable = np.array(topology.usable_links(), dtype=np.int64)
    links = [topology.links[i] for i in usable.tolist()]
    alpha = np.array([lk.alpha for lk in links])
    bw = np.array([lk.bandwidth for lk in links])
    cb = np.array([d.chunk_bytes for d in demands])
    return Net(topology, usable,
               np.array([lk.src for lk in links], dtype=np.int64),
               np.array([lk.dst for lk in links], dtype=np.int64),
               alpha, alpha[None, :] + cb[:, None] / bw[None, :])


def switch_ports(fabric: Topology) -> int:
    """The most NPUs on one switch (at least 2), which bounds useful unwinding degrees."""
    return max(2, *(sum(1 for i in fabric.out_links(s) if fabric.is_npu(fabric.links[i].dst))
                    for s in fabric.switches)) if fabric.switches else 2


def views(fabric: Topology, demands: tuple[Demand, ...], relay: bool,
          degrees: tuple[int, ...] | None = None) -> list[Topology]:
    """Switch-free views of ``fabric`` restricted to the tenants' relays: the greedy engine's
    own (the fabric itself, or one circulant unwinding per degree), so a tenant on part of a
    switch is unwound among its own NPUs, not among every port with the others cut away."""
    return logical_views(fabric, demands, SynthOptions(relay=relay, degrees=degrees))


def mesh_view(fabric: Topology, demands: tuple[Demand, ...], relay: bool,
              parallel: int = 1) -> Topology:
    """Full mesh of fractional shares on every switch, each pair's share split ``parallel``
    ways; direct links are kept whole (a physical cable is not sliced)."""
    topo = views(fabric, demands, relay, (switch_ports(fabric) - 1,))[0]
    if parallel > 1:
        links: list[Link] = []
        for lk in topo.links:
            through_switch = len(lk.via) > 1 or (
                len(lk.via) == 1 and not fabric.is_npu(fabric.links[lk.via[0]].dst))
            if through_switch:
                links.extend(replace(lk, bandwidth=lk.bandwidth / parallel)
                             for _ in range(parallel))
            else:
                links.append(lk)
        topo = replace(topo, links=tuple(links), name=f"{topo.name}/x{parallel}")
    return topo


def hop_epochs(net: Net, epochs: np.ndarray, reverse: bool = False) -> np.ndarray:
    """All-pairs fewest epochs (``epochs[e]`` per link) between nodes: Floyd-Warshall on a
    dense matrix, fine for the few hundred nodes these models can take."""
    n = net.num_nodes
    dist = np.full((n, n), np.inf)
    np.fill_diagonal(dist, 0.0)
    a, b = (net.dst, net.src) if reverse else (net.src, net.dst)
    np.minimum.at(dist, (a, b), epochs.astype(float))
    for k in range(n):
        dist = np.minimum(dist, dist[:, k : k + 1] + dist[k : k + 1, :])
    return dist
