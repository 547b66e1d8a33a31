"""Lower bounds on collective time, so every result can say how close to optimal it is.

Bandwidth (bytes that must cross some boundary / the bandwidth of that boundary):

* **cuts**: for a set A of nodes, the bytes that must enter A (and leave it) given which
  ranks are inside. A is every single NPU (per-NPU ingress/egress), every host (node names
  ``host/...``), every block under a spine (what stays connected without the switches that
  have no NPU of their own) and, for grid fabrics with ``dims``, every slice ``x_k = v`` and
  half-space ``x_k < v``. Cut bandwidth is physical: a switch's down-link into A counts
  fully.
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

Transfers (where alpha dominates): a transfer moves whole chunks and pays its link's alpha.
With ``c`` chunks per rank piece (``volume / (pieces * c)`` bytes each) every chunk a rank
needs lands on it by a transfer of that chunk, and every chunk holding a contribution only
the rank has leaves it by one: per rank and chunk of a piece, all-gather n-1 in and 1 out,
reduce-scatter 1 in and n-1 out, all-reduce n each way, all-to-all n-1 each way, rooted
collectives n-1 or 1 at the root and 1 elsewhere. An all-reduce chunk also needs 2(n-1)
landings on NPUs in all (one-way gossip; not with in-network reduction). A cable between
two NPUs serves one transfer at a time (circuits hold it whole; no engine slices a direct
cable into fractional shares), each lasting ``alpha + bytes / bandwidth``, so by time T it
lands at most ``floor(T / (alpha + bytes / bandwidth))`` chunks; a switch port carries
fractional shares side by side and gives only ``floor(T * bandwidth / bytes)``. The bound is
the least T whose capacity covers the need at the worst NPU (or in all), for the best chunk
count ``c >= 1`` (the portfolio and the LP re-chunk), and the worst tenant (not summed).
It assumes one chunk per transfer, which every engine keeps except the rail-hierarchical
all-reduce, so all-reduce tenants that span hosts are left out; a hand-written schedule that
moves chunk ranges is not held to it.

With ``others`` every tenant's bytes are added up per cut and in volume: the bound is then
on the time until all tenants finish.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import networkx as nx
import numpy as np

from choreo.arrays import concat_ranges, unique_sorted
from choreo.collectives import Collective, Demand
from choreo.topology import Topology

C = Collective
MAXFLOW_BUDGET = 200_000  # nodes * links * destinations; above this max-flow is skipped
LATENCY_SOURCES = 64
LATENCY_ROUNDS = 256  # rounds of all-source relaxation before Dijkstra takes over


@dataclass(frozen=True)
class Bound:
    bandwidth_s: float
    latency_s: float
    value_s: float
    reason: str
    transfers_s: float = 0.0  # per-transfer alphas where they add up most (docstring)


@dataclass(frozen=True)
class Capacity:
    """The bandwidth and latency parts of a lower bound, each with its reason: they depend on
    the fabric and each demand's collective, ranks and size, not on its chunks, so one
    serves every chunk count of those demands (``lower_bound(..., known=)``)."""

    demands: tuple[tuple[str, tuple[int, ...], int], ...]  # (collective, ranks, size) each
    bandwidth: tuple[float, str]
    latency: tuple[float, str]


def demand_key(demands: Sequence[Demand]) -> tuple[tuple[str, tuple[int, ...], int], ...]:
    """What of ``demands`` a ``Capacity`` (and NCCL's run) depends on: not their chunks."""
    return tuple((d.collective.value, tuple(d.ranks), d.size) for d in demands)


def capacity(fabric: Topology, demand: Demand, others: Sequence[Demand] = ()) -> Capacity:
    """``lower_bound``'s bandwidth and latency parts for ``demand`` (and ``others``)."""
    demands = [demand, *others]
    for d in demands:
        fabric.check_connected(list(d.ranks), where=f"lower bound for {d.name or 'demand'}")
    best = (0.0, "no data must move")
    for cand in (_cuts(fabric, demands), _volume(fabric, demands),
                 _host_volume(fabric, demands), _maxflow(fabric, demands)):
        # cuts stay valid with in-switch reduction: a sum crossing a cut is still S bytes
        if cand[0] > best[0]:
            best = cand
    return Capacity(demand_key(demands), best, _latency(fabric, demands))


def lower_bound(fabric: Topology, demand: Demand, others: Sequence[Demand] = (),
                whole_chunks: bool = True, known: Capacity | None = None) -> Bound:
    """A time no schedule of ``demand`` (and ``others``, jointly) on ``fabric`` can beat.
    ``whole_chunks=False`` is for a schedule whose transfers may move chunk ranges (a
    hand-written or rail-hierarchical one): the per-transfer bound does not hold there.
    ``known``: these demands' ``capacity``, found already (else it is found here)."""
    demands = [demand, *others]
    cap = known if known is not None and known.demands == demand_key(demands) else capacity(
        fabric, demand, others)
    (band, band_reason), (lat, lat_reason) = cap.bandwidth, cap.latency
    count, count_reason = _transfers(fabric, demands) if whole_chunks else (0.0, "")
    value, reason = max((band, band_reason), (lat, lat_reason), (count, count_reason),
                        key=lambda x: x[0])
    return Bound(band, lat, value, reason, count)


# ---- bytes that must cross a cut -----------------------------------------------------------
def crossing_bytes(d: Demand, inside: int, root_inside: bool) -> tuple[float, float]:
    """(bytes in, bytes out) for a node set holding ``inside`` of the demand's ranks."""
    n, s, a = d.n, d.volume, inside
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
    cross = a * (n - a) / (n * n) * s  # alltoall: its volume / n^2 per ordered pair
    return cross, cross


def _hosts(fabric: Topology) -> dict[str, list[int]]:
    """Nodes grouped by the host prefix of their names (``node3/gpu5`` -> ``node3``)."""
    hosts: dict[str, list[int]] = {}
    for v, name in enumerate(fabric.names):
        if "/" in name:
            hosts.setdefault(name.split("/", 1)[0], []).append(v)
    return hosts


def _slices(fabric: Topology) -> list[tuple[str, np.ndarray]]:
    """Grid fabrics: every slice ``x_k = v`` and half-space ``x_k < v`` as a node mask."""
    nn = fabric.num_nodes
    out: list[tuple[str, np.ndarray]] = []
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


def _blocks(fabric: Topology) -> tuple[np.ndarray, list[str]] | None:
    """The blocks under a spine: what stays connected once the links of every switch with no
    NPU of its own are cut (a leaf-spine fabric's blocks of nodes; tenants meeting there
    share the spine's uplinks). None when that leaves one block."""
    lonely = {s for s in fabric.switches
              if not any(fabric.is_npu(fabric.links[i].dst) for i in fabric.out_links(s))
              and not any(fabric.is_npu(fabric.links[i].src) for i in fabric.in_links(s))}
    if not lonely:
        return None
    graph = nx.Graph()
    graph.add_nodes_from(v for v in range(fabric.num_nodes) if v not in lonely)
    graph.add_edges_from((lk.src, lk.dst) for i, lk in enumerate(fabric.links)
                         if fabric.usable(i) and lk.src not in lonely and lk.dst not in lonely)
    label = np.full(fabric.num_nodes, -1, dtype=np.int64)
    names: list[str] = []
    for members in nx.connected_components(graph):
        npus = [v for v in members if fabric.is_npu(v)]
        if npus:  # the block's switches too: the cut is its links to the spine
            label[list(members)] = len(names)
            names.append(f"block of {fabric.node_name(min(npus))}")
    return (label, names) if len(names) > 1 else None


def _cuts(fabric: Topology, demands: list[Demand]) -> tuple[float, str]:
    """The best cut, checked in order: every live NPU, every host, every block under a
    spine, every grid slice; into before out of; the first of equal ones."""
    usable = [i for i in range(len(fabric.links)) if fabric.usable(i)]
    src = np.array([fabric.links[i].src for i in usable], dtype=np.int64)
    dst = np.array([fabric.links[i].dst for i in usable], dtype=np.int64)
    bw = np.array([fabric.links[i].bandwidth for i in usable])
    nn = fabric.num_nodes
    npus = fabric.npus
    label = np.full(nn, -1, dtype=np.int64)
    label[npus] = np.arange(len(npus))
    parts = [(label, [fabric.node_name(v) for v in npus])]
    hosts = _hosts(fabric)
    if len(hosts) > 1:
        label = np.full(nn, -1, dtype=np.int64)
        for g, members in enumerate(hosts.values()):
            label[members] = g
        parts.append((label, [f"host {h}" for h in hosts]))
    blocks = _blocks(fabric)
    if blocks is not None:
        parts.append(blocks)
    best = (0.0, "")
    for label, names in parts:
        cand = _partition_cuts(demands, label, names, src, dst, bw)
        if cand[0] > best[0]:
            best = cand
    ranks = [np.asarray(d.ranks, dtype=np.int64) for d in demands]
    for name, m in _slices(fabric):
        need_in = need_out = 0.0
        for d, r in zip(demands, ranks, strict=True):
            bi, bo = crossing_bytes(d, int(m[r].sum()), bool(m[d.ranks[d.root]]))
            need_in += bi
            need_out += bo
        cut_in = float(bw[m[dst] & ~m[src]].sum())
        cut_out = float(bw[m[src] & ~m[dst]].sum())
        for need, cut, way in ((need_in, cut_in, "into"), (need_out, cut_out, "out of")):
            if need > 0 and cut > 0 and need / cut > best[0]:
                best = (need / cut, f"{need:.6g} B {way} {name} over {cut:.6g} B/s")
    return best


def _partition_cuts(demands: list[Demand], label: np.ndarray, names: list[str],
                    src: np.ndarray, dst: np.ndarray, bw: np.ndarray) -> tuple[float, str]:
    """The cuts around disjoint node sets at once: node v is in set ``label[v]`` (-1: none)."""
    ng = len(names)
    need = np.zeros((ng, 2))
    for d in demands:
        lab = label[np.asarray(d.ranks, dtype=np.int64)]
        inside = np.bincount(lab[lab >= 0], minlength=ng)
        root = int(label[d.ranks[d.root]])
        need += [crossing_bytes(d, int(inside[g]), g == root) for g in range(ng)]
    crossing = label[src] != label[dst]
    into = crossing & (label[dst] >= 0)
    out = crossing & (label[src] >= 0)
    cut = np.stack([np.bincount(label[dst[into]], weights=bw[into], minlength=ng),
                    np.bincount(label[src[out]], weights=bw[out], minlength=ng)], axis=1)
    ok = (need > 0) & (cut > 0)
    ratio = np.where(ok, need / np.where(ok, cut, 1.0), 0.0).ravel()
    k = int(np.argmax(ratio)) if len(ratio) else 0
    if not len(ratio) or not ratio[k] > 0:
        return 0.0, ""
    g, way = divmod(k, 2)
    return float(ratio[k]), (f"{need[g, way]:.6g} B {('into', 'out of')[way]} {names[g]} "
                             f"over {cut[g, way]:.6g} B/s")


# ---- total volume --------------------------------------------------------------------------
def min_transfers_bytes(d: Demand, in_switch: bool = False) -> float:
    """Bytes that must land on NPUs in total (minimum transfers per chunk * chunk size).

    ``in_switch``: a switch can combine contributions, so each destination only has to
    receive its reduced result once."""
    n, s = d.n, d.volume
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
def _alpha_adjacency(fabric: Topology, reverse: bool) -> list[list[tuple[int, float]]]:
    """Per node its usable (neighbour, alpha) pairs, out-links (in-links if ``reverse``)."""
    adj: list[list[tuple[int, float]]] = []
    for v in range(fabric.num_nodes):
        row = []
        for i in fabric.in_links(v) if reverse else fabric.out_links(v):
            if fabric.usable(i):
                lk = fabric.links[i]
                row.append((lk.src if reverse else lk.dst, lk.alpha))
        adj.append(row)
    return adj


def _alpha_dist(adj: list[list[tuple[int, float]]], src: int) -> list[float]:
    dist = [float("inf")] * len(adj)
    dist[src] = 0.0
    heap = [(0.0, src)]
    while heap:
        dv, v = heapq.heappop(heap)
        if dv > dist[v]:
            continue
        for w, alpha in adj[v]:
            nd = dv + alpha
            if nd < dist[w]:
                dist[w] = nd
                heapq.heappush(heap, (nd, w))
    return dist


def _alpha_dists(fabric: Topology, sources: list[int], reverse: bool) -> np.ndarray:
    """Cheapest alpha sums from each source (to it if ``reverse``) to every node.

    Label-correcting rounds for all sources at once: each round relaxes the links out of the
    (source, node) pairs the previous round improved, so a pair settles after about as many
    rounds as its path has hops; fabrics with longer paths fall back to Dijkstra. Float sums
    are taken in path order either way, so both give the same distances."""
    nn, ns = fabric.num_nodes, len(sources)
    links = [fabric.links[i] for i in fabric.usable_links()]
    frm = np.array([lk.dst if reverse else lk.src for lk in links], dtype=np.int64)
    to = np.array([lk.src if reverse else lk.dst for lk in links], dtype=np.int64)
    alpha = np.array([lk.alpha for lk in links], dtype=float)
    order = np.argsort(frm, kind="stable")
    to, alpha = to[order], alpha[order]
    deg = np.bincount(frm, minlength=nn)
    ptr = np.r_[0, np.cumsum(deg)]
    dist = np.full(ns * nn, np.inf)
    front = np.arange(ns, dtype=np.int64) * nn + np.asarray(sources, dtype=np.int64)
    dist[front] = 0.0
    for _ in range(LATENCY_ROUNDS):
        if not len(front):
            return dist.reshape(ns, nn)
        node = front % nn
        cnt = deg[node]
        pair = np.repeat(front, cnt)
        edge = concat_ranges(ptr[node], cnt)
        key = pair - pair % nn + to[edge]
        val = dist[pair] + alpha[edge]
        better = val < dist[key]
        key, val = key[better], val[better]
        np.minimum.at(dist, key, val)
        front = unique_sorted(key)
    adj = _alpha_adjacency(fabric, reverse)
    return np.array([_alpha_dist(adj, s) for s in sources])


def _latency(fabric: Topology, demands: list[Demand]) -> tuple[float, str]:
    plans: list[tuple[int, bool, list[int]]] = []
    for d in demands:
        ranks = list(d.ranks)
        root = ranks[d.root]
        c = d.collective
        if c in (C.BROADCAST, C.SCATTER):
            plans.append((root, False, ranks))
        elif c in (C.REDUCE, C.GATHER):
            plans.append((root, True, ranks))
        else:
            step = max(1, len(ranks) // LATENCY_SOURCES)
            plans.extend((o, False, ranks) for o in ranks[::step])
    dists: dict[tuple[int, bool], np.ndarray] = {}
    for reverse in (False, True):
        sources = sorted({o for o, r, _ in plans if r is reverse})
        if sources:
            rows = _alpha_dists(fabric, sources, reverse)
            dists.update({(o, reverse): rows[k] for k, o in enumerate(sources)})
    best = (0.0, "")
    for o, reverse, targets in plans:
        dist = dists[(o, reverse)][targets]
        k = int(np.argmax(dist))  # the first farthest
        far, value = targets[k], float(dist[k])
        if value > best[0]:
            a, b = (far, o) if reverse else (o, far)
            best = (
                value,
                f"alpha-diameter {fabric.node_name(a)}->{fabric.node_name(b)}: {value:.6g} s",
            )
    return best


# ---- transfers: each needed chunk lands by its own transfer, each paying alpha ------------
EXACT_COUNTS = 16  # chunk counts solved exactly; larger ones get the (monotone) envelope
BISECTIONS = 60
COUNT_RTOL = 1e-9  # relative slack: the bound stays this far under the exact count


@dataclass(frozen=True)
class ChunkNeeds:
    """Chunk transfers a tenant needs per chunk of a rank piece: into and out of each rank
    (rank order), and landing on NPUs in all (0 where the per-rank needs say as much);
    chunk bytes are volume / (pieces * chunks)."""

    into: np.ndarray
    out: np.ndarray
    landings: float
    pieces: int


def chunk_needs(d: Demand, fabric: Topology) -> ChunkNeeds | None:
    """What every schedule that moves one chunk per transfer must move (module docstring);
    None where an engine moves ranges: all-reduce across hosts (the rail-hierarchical plan)."""
    n, r, c = d.n, d.root, d.collective
    inn, out = np.zeros(n), np.zeros(n)
    pieces, landings = n, 0.0
    if c is C.ALLGATHER:
        inn[:], out[:] = n - 1, 1
    elif c is C.REDUCESCATTER:
        inn[:], out[:] = 1, n - 1
    elif c is C.ALLREDUCE:
        host_of = {v: h for h, members in _hosts(fabric).items() for v in members}
        if len({host_of.get(v) for v in d.ranks}) > 1:
            return None
        inn[:], out[:] = n, n
        if not reducing_reach(fabric):  # one-way gossip: 2(n-1) landings per chunk
            landings = 2.0 * (n - 1) * n
    elif c is C.ALLTOALL:
        inn[:], out[:], pieces = n - 1, n - 1, n * n
    elif c is C.BROADCAST:
        inn[:], pieces = 1, 1
        inn[r], out[r] = 0, 1
    elif c is C.REDUCE:
        out[:], pieces = 1, 1
        inn[r], out[r] = 1, 0
    elif c is C.GATHER:
        out[:] = 1
        inn[r], out[r] = n - 1, 0
    else:  # scatter
        inn[:] = 1
        inn[r], out[r] = 0, n - 1
    return ChunkNeeds(inn, out, landings, pieces)


def _link_arrays(fabric: Topology) -> tuple[np.ndarray, ...]:
    """src, dst, alpha, bandwidth, usable, whether a link is a cable between two NPUs, and
    whether it lands on an NPU."""
    links = fabric.links
    m = len(links)
    src = np.fromiter((lk.src for lk in links), dtype=np.int64, count=m)
    dst = np.fromiter((lk.dst for lk in links), dtype=np.int64, count=m)
    alpha = np.fromiter((lk.alpha for lk in links), dtype=float, count=m)
    bw = np.fromiter((lk.bandwidth for lk in links), dtype=float, count=m)
    healthy = np.fromiter((lk.healthy for lk in links), dtype=bool, count=m)
    plain = np.fromiter((not lk.via for lk in links), dtype=bool, count=m)
    failed = np.zeros(fabric.num_nodes, dtype=bool)
    failed[list(fabric.failed)] = True
    npu = np.array([fabric.is_npu(v) for v in range(fabric.num_nodes)], dtype=bool)
    usable = healthy & ~failed[src] & ~failed[dst]
    return src, dst, alpha, bw, usable, npu[src] & npu[dst] & plain, npu[dst]


def _transfers(fabric: Topology, demands: list[Demand]) -> tuple[float, str]:
    """The worst tenant's per-transfer bound (see the module docstring)."""
    arrays: tuple[np.ndarray, ...] | None = None
    best = (0.0, "")
    for d in demands:
        needs = chunk_needs(d, fabric)
        if needs is None:
            continue
        if arrays is None:
            arrays = _link_arrays(fabric)
        cand = _tenant_transfers(fabric, d, needs, arrays)
        if cand[0] > best[0]:
            best = cand
    return best


def _tenant_transfers(fabric: Topology, d: Demand, needs: ChunkNeeds,
                      arrays: tuple[np.ndarray, ...]) -> tuple[float, str]:
    src, dst, alpha, bw, usable, direct, lands = arrays
    nn = fabric.num_nodes
    ranks = np.asarray(d.ranks, dtype=np.int64)
    # rows: node v (chunks into v), nn + v (out of v), 2 nn (landing on any NPU)
    need = np.zeros(2 * nn + 1)
    need[ranks] = needs.into
    need[nn + ranks] = needs.out
    need[2 * nn] = needs.landings
    every = np.arange(len(src))
    link = np.concatenate([every, every, every])
    row_key = np.concatenate([dst, nn + src, np.full(len(src), 2 * nn)])
    sel = usable[link] & (need[row_key] > 0) & ((row_key < 2 * nn) | lands[link])
    a_all = np.where(direct, alpha, 0.0)[link]
    # only rows with a cable that pays alpha can beat the cut and volume bounds
    paying = np.zeros(2 * nn + 1, dtype=bool)
    paying[row_key[sel & (a_all > 0)]] = True
    sel &= paying[row_key]
    if not sel.any():
        return 0.0, ""
    pieces = needs.pieces
    keys, row = np.unique(row_key[sel], return_inverse=True)
    a_link = a_all[sel]
    beta_link = 1.0 / bw[link[sel]]
    need_row = need[keys]
    nrows = len(keys)
    per_row = np.bincount(row, minlength=nrows)
    order = np.argsort(row, kind="stable")
    firsts = np.r_[0, np.cumsum(per_row)[:-1]]

    def duration(c: int) -> np.ndarray:
        return a_link + d.volume / (pieces * c) * beta_link

    def envelope(c: int) -> np.ndarray:
        """Per row the least T with sum T / t >= need (no floors, so at most the true T); it
        grows with c, since each t = alpha + size / (pieces * c * bandwidth) shrinks slower
        than 1 / c."""
        return need_row * c / np.bincount(row, weights=1.0 / duration(c), minlength=nrows)

    def exact(c: int) -> np.ndarray:
        """Per row (a hair under) the least T with sum floor(T / t) >= need."""
        t = duration(c)
        k = need_row * c
        lo = envelope(c)
        hi = np.ceil(k / per_row) * np.maximum.reduceat(t[order], firsts)
        for _ in range(BISECTIONS):
            mid = 0.5 * (lo + hi)
            got = np.bincount(row, weights=np.floor(mid[row] / t * (1 + COUNT_RTOL)),
                              minlength=nrows)
            ok = got >= k
            hi = np.where(ok, mid, hi)
            lo = np.where(ok, lo, mid)
        return lo

    best, best_c, best_row = float("inf"), 0, 0
    for c in range(1, EXACT_COUNTS + 2):
        env = envelope(c)
        if float(env.max()) >= best:
            break  # the envelope only grows with c: no larger count does better
        times = env if c > EXACT_COUNTS else exact(c)  # beyond: the envelope of all c' >= c
        worst = int(np.argmax(times))
        if times[worst] < best:
            best, best_c, best_row = float(times[worst]), c, worst
    best *= 1 - COUNT_RTOL  # float sums of equal durations may land a hair under the exact T
    key = int(keys[best_row])
    if key == 2 * nn:
        where = "onto NPUs (one-way gossip)"
    elif key < nn:
        where = f"into {fabric.node_name(key)}"
    else:
        where = f"out of {fabric.node_name(key - nn)}"
    k = int(need_row[best_row]) * best_c
    more = "+" if best_c > EXACT_COUNTS else ""
    return best, (
        f"{k}{more} chunk transfers {where}, each paying alpha on one of "
        f"{int(per_row[best_row])} links ({best_c}{more} chunk(s) per piece, "
        f"{d.volume / (pieces * best_c):.6g} B each)"
    )
