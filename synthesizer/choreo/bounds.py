"""Lower bounds on collective time, so every result can say how close to optimal it is.

Bandwidth (bytes that must cross some boundary / the bandwidth of that boundary):

* **cuts**: for a set A of nodes, the bytes that must enter A (and leave it) given which
  ranks are inside. A is every single NPU (per-NPU ingress/egress), every host (node names
  ``host/...``) and, for grid fabrics with ``dims``, every slice ``x_k = v`` and half-space
  ``x_k < v``. Cut bandwidth is physical: a switch's down-link into A counts fully.
* **volume**: every transfer lands on an NPU, and each chunk needs a minimum number of
  transfers (n-1 to spread or combine it over n ranks, 2(n-1) for all-reduce: the one-way
  gossip bound, which is Patarasuk-Yuan's 2(n-1)/n*S per NPU on a uniform fabric); the total
  divided by all live NPUs' ingress (egress) bandwidth. Helpers outside the tenant count.
  Where a switch reduces in the network (``Topology.reducing``) partial sums need not land
  on NPUs, so a combining collective only needs each destination to receive its result
  once: S per rank for all-reduce, S/n for reduce-scatter, S at the root for reduce.
* **host volume**: the same counting with every host (node-name prefix) as one super-node
  with free internal bandwidth: a chunk spread over (or combined from) m hosts enters hosts
  m-1 times (2(m-1) for all-reduce), over the hosts' total inter-host ingress.
* **max-flow** (rooted collectives on small fabrics): broadcast needs S through the minimum
  cut between the root and each NPU, reduce the reverse.

Latency: the alpha-diameter, the largest over required (origin, destination) pairs of the
cheapest sum of link alphas (combining collectives need every origin at every destination).
On large tenants the origins are sampled, which keeps the bound valid, only less tight.

With ``others`` every tenant's bytes are added up per cut and in volume: the bound is then
on the time until all tenants finish.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from choreo.collectives import Collective, Demand
from choreo.topology import Topology

C = Collective
MAXFLOW_BUDGET = 200_000  # nodes * links * destinations; above this max-flow is skipped
LATENCY_SOURCES = 64


@dataclass(frozen=True)
class Bound:
    bandwidth_s: float
    latency_s: float
    value_s: float
    reason: str


def lower_bound(fabric: Topology, demand: Demand, others: Sequence[Demand] = ()) -> Bound:
    """A time no schedule of ``demand`` (and ``others``, jointly) on ``fabric`` can beat."""
    demands = [demand, *others]
    for d in demands:
        fabric.check_connected(list(d.ranks), where=f"lower bound for {d.name or 'demand'}")
    best = (0.0, "no data must move")
    for cand in (_cuts(fabric, demands), _volume(fabric, demands),
                 _host_volume(fabric, demands), _maxflow(fabric, demands)):
        # cuts stay valid with in-switch reduction: a sum crossing a cut is still S bytes
        if cand[0] > best[0]:
            best = cand
    lat, lat_reason = _latency(fabric, demands)
    value = max(best[0], lat)
    reason = best[1] if best[0] >= lat else lat_reason
    return Bound(best[0], lat, value, reason)


# ---- bytes that must cross a cut -----------------------------------------------------------
def crossing_bytes(d: Demand, inside: int, root_inside: bool) -> tuple[float, float]:
    """(bytes in, bytes out) for a node set holding ``inside`` of the demand's ranks."""
    n, s, a = d.n, float(d.size), inside
    c = d.collective
    if a == 0 and not root_inside:
        return 0.0, 0.0
    if c is C.ALLGATHER:
        return (n - a) / n * s, a / n * s if a < n else 0.0
    if c is C.REDUCESCATTER:
        return (a / n * s if a < n else 0.0), (n - a) / n * s
    if c is C.ALLREDUCE:
        cross = s if 0 < a < n else 0.0
        return cross, cross
    if c is C.BROADCAST:
        return (s if not root_inside else 0.0), (s if root_inside and a < n else 0.0)
    if c is C.REDUCE:
        return (s if root_inside and a < n else 0.0), (s if not root_inside else 0.0)
    if c is C.GATHER:
        return ((n - a) / n * s if root_inside else 0.0), (a / n * s if not root_inside else 0.0)
    if c is C.SCATTER:
        return (a / n * s if not root_inside else 0.0), ((n - a) / n * s if root_inside else 0.0)
    cross = a * (n - a) / (n * n) * s  # alltoall: S/n^2 per ordered pair
    return cross, cross


def _hosts(fabric: Topology) -> dict[str, list[int]]:
    """Nodes grouped by the host prefix of their names (``node3/gpu5`` -> ``node3``)."""
    hosts: dict[str, list[int]] = {}
    for v, name in enumerate(fabric.names):
        if "/" in name:
            hosts.setdefault(name.split("/", 1)[0], []).append(v)
    return hosts


def _groups(fabric: Topology) -> list[tuple[str, np.ndarray]]:
    """Named node sets whose boundary is worth checking."""
    nn = fabric.num_nodes
    out: list[tuple[str, np.ndarray]] = []
    for v in fabric.npus:
        m = np.zeros(nn, dtype=bool)
        m[v] = True
        out.append((fabric.node_name(v), m))
    hosts = _hosts(fabric)
    if len(hosts) > 1:
        for h, members in hosts.items():
            m = np.zeros(nn, dtype=bool)
            m[members] = True
            out.append((f"host {h}", m))
    npus = fabric.all_npus
    if fabric.dims and int(np.prod(fabric.dims)) == len(npus):
        ids = np.asarray(npus)
        idx = np.arange(len(npus))
        for k, size in enumerate(fabric.dims):
            coord = idx % size
            idx = idx // size
            for v in range(size):
                for label, sel in ((f"x{k}={v}", coord == v), (f"x{k}<{v}", coord < v)):
                    if v == 0 and "<" in label:
                        continue
                    m = np.zeros(nn, dtype=bool)
                    m[ids[sel]] = True
                    out.append((f"slice {label}", m))
    return out


def _cuts(fabric: Topology, demands: list[Demand]) -> tuple[float, str]:
    usable = [i for i in range(len(fabric.links)) if fabric.usable(i)]
    src = np.array([fabric.links[i].src for i in usable], dtype=np.int64)
    dst = np.array([fabric.links[i].dst for i in usable], dtype=np.int64)
    bw = np.array([fabric.links[i].bandwidth for i in usable])
    best = (0.0, "")
    for name, m in _groups(fabric):
        need_in = need_out = 0.0
        for d in demands:
            a = int(m[list(d.ranks)].sum())
            bi, bo = crossing_bytes(d, a, bool(m[d.ranks[d.root]]))
            need_in += bi
            need_out += bo
        cut_in = float(bw[m[dst] & ~m[src]].sum())
        cut_out = float(bw[m[src] & ~m[dst]].sum())
        for need, cut, way in ((need_in, cut_in, "into"), (need_out, cut_out, "out of")):
            if need > 0 and cut > 0 and need / cut > best[0]:
                best = (need / cut, f"{need:.6g} B {way} {name} over {cut:.6g} B/s")
    return best


# ---- total volume --------------------------------------------------------------------------
def min_transfers_bytes(d: Demand, in_switch: bool = False) -> float:
    """Bytes that must land on NPUs in total (minimum transfers per chunk * chunk size).

    ``in_switch``: a switch can combine contributions, so each destination only has to
    receive its reduced result once."""
    n, s = d.n, float(d.size)
    c = d.collective
    if in_switch and c is C.ALLREDUCE:
        return n * s
    if in_switch and c in (C.REDUCESCATTER, C.REDUCE):
        return s
    if c is C.ALLREDUCE:
        return 2 * (n - 1) * s
    if c in (C.ALLGATHER, C.REDUCESCATTER, C.BROADCAST, C.REDUCE):
        return (n - 1) * s
    return (n - 1) / n * s  # gather, scatter, alltoall


def reducing_reach(fabric: Topology) -> list[set[int]]:
    """Per usable in-network-reducing switch, the live NPUs with a usable link to it."""
    out = []
    for sw in sorted(fabric.reducing):
        if sw in fabric.failed:
            continue
        npus = {fabric.links[i].src for i in fabric.in_links(sw)
                if fabric.usable(i) and fabric.is_npu(fabric.links[i].src)}
        if len(npus) > 1:
            out.append(npus)
    return out


def _volume(fabric: Topology, demands: list[Demand]) -> tuple[float, str]:
    in_switch = bool(reducing_reach(fabric))
    total = sum(min_transfers_bytes(d, in_switch) for d in demands)
    npus = fabric.npus
    ingress = sum(fabric.ingress_bandwidth(v) for v in npus)
    egress = sum(fabric.egress_bandwidth(v) for v in npus)
    cap = min(ingress, egress)
    if total <= 0 or cap <= 0:
        return 0.0, ""
    return total / cap, (
        f"{total:.6g} B must land on NPUs, {len(npus)} live NPUs take {cap:.6g} B/s"
    )


HOST_SPREAD = {C.ALLGATHER: 1, C.REDUCESCATTER: 1, C.BROADCAST: 1, C.REDUCE: 1, C.ALLREDUCE: 2}


def _host_volume(fabric: Topology, demands: list[Demand]) -> tuple[float, str]:
    hosts = _hosts(fabric)
    if len(hosts) < 2:
        return 0.0, ""
    host_of = {v: h for h, members in hosts.items() for v in members}
    # a switch that reduces for NPUs of several hosts combines across hosts: each host then
    # only has to receive its result once (all-reduce), like an NPU under the volume bound
    across = any(len({host_of.get(v) for v in reach}) > 1 for reach in reducing_reach(fabric))
    total = 0.0
    for d in demands:
        m = len({host_of.get(r) for r in d.ranks} - {None})
        if across and d.collective.combining:
            total += (m if d.collective is C.ALLREDUCE else 1) * float(d.size) if m > 1 else 0.0
            continue
        total += HOST_SPREAD.get(d.collective, 0) * (m - 1) * float(d.size)
    cap = 0.0
    for i, link in enumerate(fabric.links):
        crosses = host_of.get(link.src) != host_of.get(link.dst)
        if fabric.usable(i) and crosses and link.dst in host_of:
            cap += link.bandwidth
    if total <= 0 or cap <= 0:
        return 0.0, ""
    return total / cap, (f"{total:.6g} B must enter hosts, {len(hosts)} hosts take "
                         f"{cap:.6g} B/s from outside")


# ---- max-flow ------------------------------------------------------------------------------
def _maxflow(fabric: Topology, demands: list[Demand]) -> tuple[float, str]:
    rooted = [d for d in demands if d.collective in (C.BROADCAST, C.REDUCE)]
    if not rooted:
        return 0.0, ""
    cost = sum(d.n for d in rooted) * fabric.num_nodes * max(len(fabric.links), 1)
    if cost > MAXFLOW_BUDGET:
        return 0.0, ""
    import networkx as nx

    g = nx.DiGraph()
    for i in fabric.usable_links():
        lk = fabric.links[i]
        cap = g.get_edge_data(lk.src, lk.dst, {"capacity": 0.0})["capacity"]
        g.add_edge(lk.src, lk.dst, capacity=cap + lk.bandwidth)
    best = (0.0, "")
    for d in rooted:
        root = d.ranks[d.root]
        for v in d.ranks:
            if v == root:
                continue
            a, b = (root, v) if d.collective is C.BROADCAST else (v, root)
            flow = nx.maximum_flow_value(g, a, b)
            if flow > 0 and d.size / flow > best[0]:
                best = (
                    d.size / flow,
                    f"{d.size} B through the min cut {fabric.node_name(a)}->"
                    f"{fabric.node_name(b)} of {flow:.6g} B/s",
                )
    return best


# ---- latency -------------------------------------------------------------------------------
def _alpha_dist(fabric: Topology, src: int, reverse: bool) -> list[float]:
    dist = [float("inf")] * fabric.num_nodes
    dist[src] = 0.0
    heap = [(0.0, src)]
    while heap:
        dv, v = heapq.heappop(heap)
        if dv > dist[v]:
            continue
        for i in fabric.in_links(v) if reverse else fabric.out_links(v):
            if not fabric.usable(i):
                continue
            lk = fabric.links[i]
            w = lk.src if reverse else lk.dst
            nd = dv + lk.alpha
            if nd < dist[w]:
                dist[w] = nd
                heapq.heappush(heap, (nd, w))
    return dist


def _latency(fabric: Topology, demands: list[Demand]) -> tuple[float, str]:
    best = (0.0, "")
    for d in demands:
        ranks = list(d.ranks)
        root = ranks[d.root]
        c = d.collective
        if c in (C.BROADCAST, C.SCATTER):
            plans = [(root, False, ranks)]
        elif c in (C.REDUCE, C.GATHER):
            plans = [(root, True, ranks)]
        else:
            step = max(1, len(ranks) // LATENCY_SOURCES)
            plans = [(o, False, ranks) for o in ranks[::step]]
        for o, reverse, targets in plans:
            dist = _alpha_dist(fabric, o, reverse)
            far = max(targets, key=lambda v: dist[v])
            if dist[far] > best[0]:
                a, b = (far, o) if reverse else (o, far)
                best = (
                    dist[far],
                    f"alpha-diameter {fabric.node_name(a)}->{fabric.node_name(b)}: "
                    f"{dist[far]:.6g} s",
                )
    return best
