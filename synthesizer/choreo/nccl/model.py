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

NVLS AllReduce on one node also pays its kernel's pipeline fill and drain (``nvls_fill_s``),
which NCCL's cost model does not know about: it sets the time, not the choice.

Protocols pay their wire overhead on the links (LL sends a flag with every 8 bytes, LL128
with every 128).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

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

KIB = 1 << 10
NCCL_STEPS = 8  # src/include/device.h
DEFAULT_BUFFSIZE = 4 << 20  # buffSizes[NCCL_PROTO_SIMPLE] (NCCL_BUFFSIZE default, 4 MiB)
NVLS_CHUNKSIZE = 128 * KIB  # NCCL_NVLS_CHUNKSIZE default (src/transport/nvls.cc)
# scheduleCollTasksToPlan (src/enqueue.cc): channels get whole cells of MinTrafficPerChannel
# (16 KiB) of traffic; AllReduce traffic is 2 bytes per byte, so a cell holds 8 KiB
NVLS_CELL = 16 * KIB // 2
# RunWorkColl<AllReduce, NVLS, SIMPLE> on one node (src/device/all_reduce.h): every channel
# runs three warp groups one after another on each step: scatter (sendbuff into the heads'
# buffers), reduce (multimem.ld_reduce + multimem.st through the switch), gather (into
# recvbuff)
NVLS_STAGES = 3


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
    pipeline_s: float = 0.0  # pipeline fill and drain NCCL's model leaves out (NVLS)

    @property
    def choice(self) -> str:
        return f"{self.algorithm}/{self.protocol}"


def nccl_baseline(fabric: Topology, demand: Demand, *, algorithms: Sequence[str] | None = None,
                  protocols: Sequence[str] | None = None, arch: str | None = None,
                  pat: bool = True) -> NcclResult:
    """NCCL's choice and time for ``demand`` on ``fabric``. ``algorithms``/``protocols``
    restrict the choice like ``NCCL_ALGO``/``NCCL_PROTO``; ``arch`` (volta, ampere, hopper)
    overrides the GPU generation read from the fabric; ``pat=False`` is ``NCCL_PAT_ENABLE=0``."""
    return _timed(_plan(fabric, demand, algorithms, protocols, arch, pat))


def nccl_jointly(fabric: Topology, demands: Sequence[Demand]) -> list[NcclResult]:
    """Every tenant running NCCL at once on ``fabric``: each makes its own choice as if it
    were alone (NCCL knows nothing of the others), and every link carries all tenants'
    bytes at once, so a tenant's wire term is its busiest link under the total load."""
    runs = [_plan(fabric, d) for d in demands]
    wire = [run.loads.bytes / WIRE_EFFICIENCY[run.protocol] for run in runs]
    total = np.sum(wire, axis=0) if wire else np.zeros(0)
    return [_timed(run, total - own) for run, own in zip(runs, wire, strict=True)]


@dataclass
class _Run:
    """One collective's NCCL choice and the bytes its channels put on every link."""

    fab: NcclFabric
    ch: Channels
    demand: Demand
    pick: Estimate | None  # None: grouped send/recv
    sent: Sends
    loads: Loads

    @property
    def protocol(self) -> str:
        return self.pick.protocol if self.pick is not None else SIMPLE


def _plan(fabric: Topology, demand: Demand, algorithms: Sequence[str] | None = None,
          protocols: Sequence[str] | None = None, arch: str | None = None,
          pat: bool = True) -> _Run:
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
        sent = sends(fab, ch, demand, P2P)
        return _Run(fab, ch, demand, None, sent,
                    _loads(fab, sent, demand.volume / max(fab.n_ranks, 1) ** 2))
    options = estimates(fab, graphs, demand.collective, nbytes, ch.n_channels, pat)
    allowed = [e for e in options if (not algorithms or e.algorithm in algorithms)
               and (not protocols or e.protocol in protocols)]
    if not allowed:
        # NCCL falls back to a ring when the user's choice is not available
        allowed = [e for e in options if e.algorithm == RING] or options
    pick = choose(allowed, nbytes)
    sent = sends(fab, ch, demand, pick.algorithm)
    return _Run(fab, ch, demand, pick, sent, _loads(fab, sent, nbytes / max(ch.n_channels, 1)))


def _wire(run: _Run, others: np.ndarray | None) -> tuple[float, int]:
    """Seconds the busiest of the run's links needs for its bytes (at its protocol's wire
    efficiency) and, given, the other tenants' wire bytes on it; and that link."""
    own = run.loads.bytes / WIRE_EFFICIENCY[run.protocol]
    bw = np.array([lk.bandwidth for lk in run.loads.topo.links])
    busy = own / bw if others is None else np.where(own > 0, (own + others) / bw, 0.0)
    if not len(busy) or busy.max() <= 0:
        return 0.0, -1
    i = int(np.argmax(busy))
    return float(busy[i]), i


def _timed(run: _Run, others: np.ndarray | None = None) -> NcclResult:
    fab, ch, d, pick, sent, loads = run.fab, run.ch, run.demand, run.pick, run.sent, run.loads
    if pick is None:
        return _p2p(run, others)
    s = float(d.size)
    wire_s, link = _wire(run, others)
    model_s = s / (pick.bandwidth_gbs * 1e9)
    bandwidth_s = max(wire_s, model_s)
    alpha_s = _alpha_path(fab, sent, loads)
    latency_s = max(pick.latency_us * 1e-6, alpha_s)
    pipeline_s = 0.0
    if pick.algorithm == NVLS and d.collective is C.ALLREDUCE and fab.n_nodes == 1:
        pipeline_s = nvls_fill_s(s, ch.graphs[NVLS].n_channels, bandwidth_s)
    seconds = latency_s + bandwidth_s + pipeline_s
    channels = NVLS_CHANNELS if pick.algorithm in (NVLS, NVLS_TREE) else ch.n_channels
    limit = (f"the links (busiest {loads.describe(link)})" if wire_s >= model_s and link >= 0
             else "NCCL's own bandwidth model")
    fill = (f", pipeline fill and drain {pipeline_s * 1e6:.1f} us" if pipeline_s > 0 else "")
    why = (f"NCCL {fab.arch}: {fab.n_ranks} ranks on {fab.n_nodes} node(s), "
           f"{pick.algorithm}/{pick.protocol} on {channels} channels (its model: "
           f"{pick.latency_us:.1f} us + {s / 1e9 / pick.bandwidth_gbs * 1e3:.3f} ms); "
           f"time {seconds * 1e3:.3f} ms, bandwidth set by {limit}{fill}")
    return _result(d, seconds, pick.algorithm, pick.protocol, channels, latency_s, bandwidth_s,
                   wire_s, why, pipeline_s)


def nvls_chunk_size(channel_bytes: float, heads: int) -> int:
    """The chunk NCCL gives one NVLS channel of ``channel_bytes`` with ``heads`` NVLS heads
    (one per GPU on one node): ``calcCollChunking`` in ``src/enqueue.cc`` (2.23+, called per
    channel with ``nChannels=1``; 2.19-2.22 pass the whole size and all channels, the same
    ratio). It starts from ``min(buffSizes[SIMPLE] / NCCL_STEPS, nvlsChunkSize)`` and halves
    it for smaller sizes: 64 KiB below ``64 * heads * chunk`` bytes, 32 KiB below
    ``8 * heads * chunk``, 16 KiB below ``2 * heads * chunk``."""
    chunk = min(DEFAULT_BUFFSIZE // NCCL_STEPS, NVLS_CHUNKSIZE)
    ops = heads  # concurrentOps = nChannels * nvls.nHeads
    for factor, smaller in ((64, 64 * KIB), (8, 32 * KIB), (2, 16 * KIB)):
        if channel_bytes < factor * ops * chunk and chunk > smaller:
            chunk = smaller
    return chunk


def nvls_fill_s(nbytes: float, heads: int, bandwidth_s: float) -> float:
    """Pipeline fill and drain of NCCL's one-node NVLS AllReduce kernel
    (``RunWorkColl<ncclFuncAllReduce, T, RedOp, NCCL_ALGO_NVLS, NCCL_PROTO_SIMPLE>`` in
    ``src/device/all_reduce.h``, the ``work->oneNode`` path).

    Each of the ``NVLS_CHANNELS`` channels (``NCCL_NVLS_NCHANNELS``) takes its share of the
    buffer (``scheduleCollTasksToPlan``: whole 8 KiB cells) and loops over it in steps of
    ``nHeads * chunkSize`` (``loopCount``), the chunk from ``nvls_chunk_size``. Every step
    passes through ``NVLS_STAGES`` warp groups in order (scatter, then the head's multimem
    reduce and multicast, then gather), the next step following behind, so a channel needs
    ``steps + NVLS_STAGES - 1`` step times: the first step has to be scattered before the
    reduce starts, and the last one gathered after it ends. The stages are taken to run at the
    channel's rate, the pipeline's throughput (the kernel splits its warps between them to
    keep them even: 6 scatter, 5 reduce, 5 gather of 16); the steady state, ``bandwidth_s``
    for all bytes, is already counted, so this is the extra ``(NVLS_STAGES - 1)`` steps.

    No constant here is fitted: at 16 MiB on 8 GPUs each channel has 1 MiB in 4 steps of
    8 x 32 KiB, and 2 more step times are half as much again as its steady state; at 1 GiB
    each has 64 steps of 8 x 128 KiB and the fill is 3%."""
    channel = max(nbytes / NVLS_CHANNELS, min(nbytes, NVLS_CELL))
    if channel <= 0 or bandwidth_s <= 0:
        return 0.0
    step = min(heads * nvls_chunk_size(channel, heads), channel)
    return (NVLS_STAGES - 1) * step / channel * bandwidth_s


def _p2p(run: _Run, others: np.ndarray | None = None) -> NcclResult:
    """Gather, Scatter and AllToAll run as grouped send/recv (PXN across nodes): one round of
    concurrent sends, latency of one Simple step on the slowest transport."""
    fab, ch, d, sent, loads = run.fab, run.ch, run.demand, run.sent, run.loads
    wire_s, link = _wire(run, others)
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
            latency_s: float, bandwidth_s: float, wire_s: float, why: str,
            pipeline_s: float = 0.0) -> NcclResult:
    algbw = d.size / seconds if seconds > 0 else 0.0
    return NcclResult(seconds, algorithm, protocol, channels, algbw, algbw * d.bus_factor(),
                      latency_s, bandwidth_s, wire_s, why, pipeline_s)


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
