"""``nccl_baseline``: what NCCL 2.2x would do for a collective on a fabric, and how long it
takes there.

NCCL chooses the algorithm and protocol with its own cost model (``tuning``), right or wrong
for this fabric. The time of that choice then comes from the fabric: its channels' sends
are routed over the real links and every link carries what all channels put on it at once
(``loads``), and the busiest link sets the bandwidth term. Two things can only make it
slower, never faster:

* NCCL's own bandwidth for the choice (its per-channel kernel limits, e.g. ``perChMaxTreeBw``,
  the NVLS and tree factors): the kernels cannot beat it even on ideal wires, so the
  bandwidth term is the larger of the two;
* the latency is NCCL's modelled latency for the choice, or the sum of the link alphas along
  its critical path of steps where that is larger.

Protocols pay their wire overhead on the links (LL sends a flag with every 8 bytes, LL128
with every 128).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from choreo.collectives import Collective, Demand
from choreo.errors import InputError
from choreo.nccl.channels import NVLS_CHANNELS, Channels, build, search
from choreo.nccl.fabric import NcclFabric, describe
from choreo.nccl.loads import Loads, route_loads
from choreo.nccl.traffic import Sends, sends
from choreo.nccl.tuning import (
    ALGORITHMS,
    BASE_LAT,
    HW_LAT,
    LL,
    LL128,
    NET,
    NVL,
    NVLS,
    NVLS_TREE,
    P2P,
    PCI,
    PROTOCOLS,
    RING,
    SIMPLE,
    Estimate,
    choose,
    estimates,
)
from choreo.topology import Topology

C = Collective
WIRE_EFFICIENCY = {LL: 0.5, LL128: 120.0 / 128.0, SIMPLE: 1.0}
P2P_COLLECTIVES = (C.ALLTOALL, C.GATHER, C.SCATTER)


@dataclass(frozen=True)
class NcclResult:
    """NCCL's run of one collective: its choice, the predicted time and bandwidths."""

    seconds: float
    algorithm: str
    protocol: str
    channels: int
    algbw: float  # B/s
    busbw: float  # B/s
    latency_s: float
    bandwidth_s: float  # the larger of wire_s and NCCL's own bandwidth term
    wire_s: float  # what the busiest link needs for all channels' bytes
    explanation: str

    @property
    def choice(self) -> str:
        return f"{self.algorithm}/{self.protocol}"


def nccl_baseline(fabric: Topology, demand: Demand, *, algorithms: Sequence[str] | None = None,
                  protocols: Sequence[str] | None = None, arch: str | None = None,
                  pat: bool = True) -> NcclResult:
    """NCCL's choice and time for ``demand`` on ``fabric``. ``algorithms``/``protocols``
    restrict the choice like ``NCCL_ALGO``/``NCCL_PROTO``; ``arch`` (volta, ampere, hopper)
    overrides the GPU generation read from the fabric; ``pat=False`` is ``NCCL_PAT_ENABLE=0``."""
    for name, given, known in (("algorithms", algorithms, (*ALGORITHMS,)),
                               ("protocols", protocols, PROTOCOLS)):
        for x in given or ():
            if x not in known:
                raise InputError(f"{name}: unknown {x!r} (known: {', '.join(known)})")
    ranks = list(demand.ranks)
    fabric.check_connected(ranks, where="nccl model")
    fab = describe(fabric, ranks, arch)
    graphs = search(fab)
    ch = build(fab, graphs)
    nbytes = float(demand.size)
    if demand.collective in P2P_COLLECTIVES:
        return _p2p(fab, ch, demand)
    options = estimates(fab, graphs, demand.collective, nbytes, ch.n_channels, pat)
    allowed = [e for e in options if (not algorithms or e.algorithm in algorithms)
               and (not protocols or e.protocol in protocols)]
    if not allowed:
        # NCCL falls back to a ring when the user's choice is not available
        allowed = [e for e in options if e.algorithm == RING] or options
    pick = choose(allowed, nbytes)
    return _timed(fab, ch, demand, pick)


def _timed(fab: NcclFabric, ch: Channels, d: Demand, pick: Estimate) -> NcclResult:
    s = float(d.size)
    sent = sends(fab, ch, d, pick.algorithm)
    loads = _loads(fab, sent, s / max(ch.n_channels, 1))
    wire_s, link = loads.bottleneck()
    wire_s /= WIRE_EFFICIENCY[pick.protocol]
    model_s = s / (pick.bandwidth_gbs * 1e9)
    bandwidth_s = max(wire_s, model_s)
    alpha_s = _alpha_path(fab, sent, loads)
    latency_s = max(pick.latency_us * 1e-6, alpha_s)
    seconds = latency_s + bandwidth_s
    channels = NVLS_CHANNELS if pick.algorithm in (NVLS, NVLS_TREE) else ch.n_channels
    limit = (f"the links (busiest {loads.describe(link)})" if wire_s >= model_s and link >= 0
             else "NCCL's own bandwidth model")
    why = (f"NCCL {fab.arch}: {fab.n_ranks} ranks on {fab.n_nodes} node(s), "
           f"{pick.algorithm}/{pick.protocol} on {channels} channels (its model: "
           f"{pick.latency_us:.1f} us + {s / 1e9 / pick.bandwidth_gbs * 1e3:.3f} ms); "
           f"time {seconds * 1e3:.3f} ms, bandwidth set by {limit}")
    return _result(d, seconds, pick.algorithm, pick.protocol, channels, latency_s, bandwidth_s,
                   wire_s, why)


def _p2p(fab: NcclFabric, ch: Channels, d: Demand) -> NcclResult:
    """Gather, Scatter and AllToAll run as grouped send/recv (PXN across nodes): one round of
    concurrent sends, latency of one Simple step on the slowest transport."""
    s = float(d.size)
    sent = sends(fab, ch, d, P2P)
    loads = _loads(fab, sent, s / max(fab.n_ranks, 1) ** 2)
    wire_s, link = loads.bottleneck()
    hw = NET if fab.n_nodes > 1 else (NVL if fab.nvlink else PCI)
    lat = (BASE_LAT[RING][2] + HW_LAT[hw][RING][2]) * 1e-6
    latency_s = max(lat, _alpha_path(fab, sent, loads))
    seconds = latency_s + wire_s
    where = f"busiest {loads.describe(link)}" if link >= 0 else "no link"
    why = (f"NCCL {fab.arch}: {d.collective.value} as send/recv"
           f"{' with PXN' if fab.has_nics else ''} over {fab.n_ranks} ranks on {fab.n_nodes} "
           f"node(s); time {seconds * 1e3:.3f} ms, {where}")
    return _result(d, seconds, P2P, SIMPLE, ch.n_channels, latency_s, wire_s, wire_s, why)


def _result(d: Demand, seconds: float, algorithm: str, protocol: str, channels: int,
            latency_s: float, bandwidth_s: float, wire_s: float, why: str) -> NcclResult:
    algbw = d.size / seconds if seconds > 0 else 0.0
    return NcclResult(seconds, algorithm, protocol, channels, algbw, algbw * d.bus_factor(),
                      latency_s, bandwidth_s, wire_s, why)


def _loads(fab: NcclFabric, sent: Sends, router_bytes: float) -> Loads:
    src, dst, nbytes = sent.columns()
    loads = route_loads(fab.topo, src, dst, nbytes, router_bytes)
    for i, b in sent.direct.items():
        loads.bytes[i] += b
    return loads


def _alpha_path(fab: NcclFabric, sent: Sends, loads: Loads) -> float:
    """Sum of the alphas along the algorithm's critical steps (each step one hop)."""
    total = 0.0
    for step in sent.steps:
        worst = 0.0
        for a, b in step:
            if (a, b) in loads.alpha:
                worst = max(worst, loads.alpha[(a, b)])
            else:  # a direct port (NVLS): its link alpha
                links = [fab.topo.links[i].alpha for i in fab.topo.out_links(a)
                         if fab.topo.links[i].dst == b]
                worst = max(worst, max(links, default=0.0))
        total += worst
    return total
