"""NCCL's own cost model (``src/graph/tuning.cc``, 2.23-2.26) and its choice of algorithm and
protocol: the argmin of ``latency + bytes / bandwidth`` over what is enabled.

NCCL picks with this model, right or wrong for the fabric at hand, so the choice here is made
the same way. Latencies are in microseconds and bandwidths in GB/s, as in the source; the
per-channel bandwidths come from the graph search (``channels.search``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from choreo.collectives import Collective
from choreo.nccl.fabric import NcclFabric

C = Collective
RING, TREE, NVLS, NVLS_TREE, PAT, P2P = "ring", "tree", "nvls", "nvls_tree", "pat", "p2p"
ALGORITHMS = (TREE, RING, NVLS, NVLS_TREE, PAT)
LL, LL128, SIMPLE = "ll", "ll128", "simple"
PROTOCOLS = (LL, LL128, SIMPLE)
NVL, PCI, NET = 0, 1, 2

# baseLat[algo][proto] (us); NVLS and NVLS_TREE have none
BASE_LAT = {TREE: (6.8, 14.0, 8.4), RING: (6.6, 14.0, 8.4), NVLS: (0, 0, 0), NVLS_TREE: (0, 0, 0),
            PAT: (0, 0, 0)}
# hwLat[NVLINK|PCI|NET][algo][proto] (us)
HW_LAT = {
    NVL: {TREE: (.6, 1.25, 4.0), RING: (.6, 1.9, 3.4), NVLS: (0, 0, 25), NVLS_TREE: (0, 0, 25),
          PAT: (0, 0, 0)},
    PCI: {TREE: (1.0, 1.9, 4.0), RING: (1.0, 2.5, 5.7), NVLS: (0, 0, 0), NVLS_TREE: (0, 0, 0),
          PAT: (0, 0, 0)},
    NET: {TREE: (5.0, 8.5, 14), RING: (2.7, 4.0, 14.0), NVLS: (0, 0, 18), NVLS_TREE: (0, 0, 14),
          PAT: (0, 0, 0)},
}
ARCH_INDEX = {"volta": 0, "ampere": 1, "hopper": 2}
# [arch][N1, N2, N4+]; LL limits are indexed by CPU vendor off a single node (Intel here)
LL_MAX_BWS = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (141.0, 45.0, 35.0))
PER_CH_MAX_RING_LL128 = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 36.7))
PER_CH_MAX_TREE_LL128 = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 29.0))
PER_CH_MAX_TREE = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0))
# powers of two from 64 B to 256 MiB, per protocol
TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0,
     1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9,
     1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
)
NET_OVERHEAD_US = 1.0  # x86 Intel host; tripled for Simple
PLATEAU = {0: 1.9, 1: 1.4, 2: 1.4}  # ring Simple AllReduce latency factor off a single node


@dataclass(frozen=True)
class Graph:
    """What NCCL's topology search settled on for one algorithm: channels and per-channel
    bandwidth inside a node and across nodes (GB/s), and whether the intra path is NVLink."""

    n_channels: int
    bw_intra: float
    bw_inter: float
    nvlink: bool


@dataclass(frozen=True)
class Estimate:
    algorithm: str
    protocol: str
    latency_us: float
    bandwidth_gbs: float  # algorithm bandwidth NCCL's model predicts

    def time_us(self, nbytes: float) -> float:
        return self.latency_us + nbytes / (1000 * self.bandwidth_gbs)


def log2i(n: int) -> int:
    return max(n, 1).bit_length() - 1


def estimates(fab: NcclFabric, graphs: dict[str, Graph], coll: Collective, nbytes: float,
              runtime_channels: int, pat_enabled: bool = True) -> list[Estimate]:
    """Every enabled (algorithm, protocol) with NCCL's predicted latency and bandwidth for
    ``nbytes``, after the size-dependent corrections of ``ncclTopoGetAlgoTime``."""
    n_nodes, n_ranks = fab.n_nodes, fab.n_ranks
    ppn = n_ranks / n_nodes
    arch = ARCH_INDEX[fab.arch]
    idx2 = n_nodes - 1 if n_nodes <= 2 else 2
    ll_max = LL_MAX_BWS[arch if n_nodes == 1 else 0][idx2]
    tree_max, ring_ll128, tree_ll128 = (PER_CH_MAX_TREE[arch][idx2],
                                        PER_CH_MAX_RING_LL128[arch][idx2],
                                        PER_CH_MAX_TREE_LL128[arch][idx2])
    if coll is C.ALLREDUCE:
        nsteps = 2 * (n_ranks - 1)
    elif coll in (C.ALLGATHER, C.REDUCESCATTER):
        nsteps = n_ranks - 1
    else:
        nsteps = n_ranks
    out: list[Estimate] = []
    for a in ALGORITHMS:
        if not _enabled(fab, coll, a, pat_enabled):
            continue
        g = graphs.get(a)
        if g is None or g.n_channels == 0:
            continue
        intra_hw = NVL if g.nvlink else PCI
        for p_i, p in enumerate(PROTOCOLS):
            if a in (NVLS, NVLS_TREE, PAT) and p != SIMPLE:
                continue
            if p == LL128 and not _ll128(fab, g):
                continue
            bw = g.bw_intra if n_nodes <= 2 else g.bw_inter
            if a == NVLS:
                if coll is C.ALLREDUCE:
                    bw = min(g.bw_intra, g.bw_inter)
                else:
                    bw = min(g.bw_intra * (ppn - 1) / ppn, g.bw_inter * 0.9)
            if a == NVLS_TREE:
                bw = min(g.bw_intra, g.bw_inter if n_nodes <= 2 else g.bw_inter / 2)
            bus = g.n_channels * bw
            if a == RING and p == LL:
                bus = min(ll_max, bus * .5)
            if a == RING and p == LL128:
                bus = min(bus * 0.92, g.n_channels * ring_ll128)
            if a == TREE and coll is C.ALLREDUCE:
                bus = min(bus * .92, g.n_channels * tree_max)
            if a == TREE and p == LL:
                bus = min(bus / 3.8, ll_max)
            if a == TREE and p == LL128:
                bus = min(bus * (7.0 / 9.0 if n_nodes == 1 else 120.0 / 128.0),
                          g.n_channels * tree_ll128)
            if a == PAT:
                bus *= .75
            if not (a != RING and coll in (C.ALLGATHER, C.REDUCESCATTER)):
                if a == RING:
                    bus *= n_ranks / nsteps
                elif a in (NVLS, NVLS_TREE):
                    bus *= 5.0 / 6.0
                else:
                    bus *= .5
            lat = _latency(fab, g, coll, a, p_i, nsteps, intra_hw, ppn)
            out.append(_corrected(fab, coll, a, p, p_i, lat, bus, nbytes, runtime_channels))
    return out


def _enabled(fab: NcclFabric, coll: Collective, a: str, pat_enabled: bool) -> bool:
    if coll in (C.BROADCAST, C.REDUCE):
        return a == RING
    if coll in (C.ALLGATHER, C.REDUCESCATTER):
        if a == PAT:  # one GPU per node only
            return pat_enabled and fab.n_nodes == fab.n_ranks
        return a == RING or (a == NVLS and fab.nvls and fab.n_nodes == 1)
    if coll is C.ALLREDUCE:
        if a == PAT:
            return False
        if a == NVLS:  # multi-node NVLS needs CollNet (IB SHARP), which is not modelled
            return fab.nvls and fab.n_nodes == 1
        if a == NVLS_TREE:
            return fab.nvls and fab.n_nodes > 1
        return True
    return False


def _ll128(fab: NcclFabric, g: Graph) -> bool:
    """LL128 is on by default only over NVLink inside and NICs close to the GPUs across."""
    inter_ok = fab.n_nodes == 1 or fab.has_nics
    return g.nvlink and inter_ok


def _latency(fab: NcclFabric, g: Graph, coll: Collective, a: str, p: int, nsteps: int,
             intra_hw: int, ppn: float) -> float:
    n_nodes, n_ranks = fab.n_nodes, fab.n_ranks
    lat = BASE_LAT[a][p]
    intra = HW_LAT[intra_hw][a][p]
    inter = HW_LAT[NET][TREE if ppn == 1 else a][p]
    if a == RING:
        hw = intra_hw if n_nodes == 1 else NET
        if coll in (C.REDUCE, C.BROADCAST):
            step = HW_LAT[hw][TREE if p == 2 else RING][p]
            return lat + nsteps * step
        overhead = NET_OVERHEAD_US * (3 if p == 2 else 1) if n_nodes > 1 else 0.0
        intra = max(intra, overhead)
        inter_steps = 0 if n_nodes == 1 else (2 * (n_nodes - 1) if coll is C.ALLREDUCE
                                              else n_nodes - 1)
        return lat + (nsteps - inter_steps) * intra + inter_steps * inter
    if a == TREE:
        return lat + 2 * ((n_ranks // n_nodes - 1) * intra + log2i(n_nodes) * inter)
    if a == NVLS:
        return intra + (inter if n_nodes > 1 else 0.0)
    if a == NVLS_TREE:
        return lat + intra + 2 * log2i(n_nodes) * inter
    # PAT
    return 8 + log2i(n_nodes) * (inter / 3.5) + n_ranks * 2.8


def _corrected(fab: NcclFabric, coll: Collective, a: str, p: str, p_i: int, lat: float,
               bw: float, nbytes: float, runtime_channels: int) -> Estimate:
    log_size = log2i(int(nbytes) >> 6) if int(nbytes) >> 6 else -1
    if a == TREE and coll is C.ALLREDUCE and 0 <= log_size < 23:
        bw *= TREE_CORRECTION[p_i][log_size]
    if (a == RING and p == SIMPLE and fab.n_nodes > 1 and coll is C.ALLREDUCE
            and nbytes / (max(runtime_channels, 1) * fab.n_ranks) >= 64):
        lat *= PLATEAU[ARCH_INDEX[fab.arch]]
    return Estimate(a, p, lat, bw)


def choose(options: list[Estimate], nbytes: float) -> Estimate:
    """NCCL's pick: the smallest predicted time (first in algorithm, protocol order on ties)."""
    best = min(options, key=lambda e: e.time_us(nbytes))
    if not math.isfinite(best.time_us(nbytes)):
        raise ValueError("no finite estimate")
    return best
