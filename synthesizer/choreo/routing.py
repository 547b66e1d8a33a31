"""Shortest-path routing of rank-to-rank sends for algorithms that ignore the topology, and
their timing by the congestion simulator (``timed_plan``).

Fixed algorithms (Ring, Direct, trees, ...) name a peer, not a link. A send between NPUs that
share a cable uses that link; any other send becomes a *circuit*: a logical link whose ``via``
is the shortest physical path (through switches and, where needed, other NPUs), held for the
whole transfer. Relaying through an NPU as store-and-forward would need the relay to keep a
second copy of the chunk, which the schedule model does not have (one state per NPU and chunk),
so a relay that is itself a member of a reduction would lose its own contribution.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

import numpy as np

from choreo.collectives import Demand
from choreo.errors import InputError
from choreo.schedule import Schedule
from choreo.simulate import simulate
from choreo.topology import Link, Topology


class Router:
    """Cheapest paths on the fabric's usable links for a given chunk size (Dijkstra; ties go
    to the first link found, so routes are reproducible)."""

    def __init__(self, fabric: Topology, nbytes: float, transit: bool = True) -> None:
        """``transit=False``: no path passes through an NPU other than its ends (a fixed
        algorithm's rank-to-rank send goes through switches, never through another GPU).
        Each NPU then gets a sink copy at ``num_nodes + v`` that its in-links lead to."""
        self.fabric = fabric
        cost = [lk.alpha + nbytes / lk.bandwidth for lk in fabric.links]
        n = fabric.num_nodes
        self.sink = [v + n if not transit and fabric.is_npu(v) else v for v in range(n)]
        # Per node its usable out-links as (link, head, cost), in link order: one search per
        # source NPU, so the inner loop should touch nothing else.
        self.adj = [[(i, self.sink[fabric.links[i].dst], cost[i]) for i in fabric.out_links(v)
                     if fabric.usable(i)] for v in range(n)]
        self.adj += [[] for _ in range(n if not transit else 0)]
        self._arrays: tuple[np.ndarray, ...] | None = None

    def search(self, src: int, targets: set[int]) -> tuple[list[int], list[int]]:
        """Predecessor links from ``src`` and the nodes in the order they were settled
        (``src`` first); stops once every target is settled."""
        adj = self.adj
        dist = [float("inf")] * len(adj)
        pred = [-1] * len(adj)
        done = [False] * len(adj)
        settled: list[int] = []
        dist[src] = 0.0
        heap = [(0.0, src)]
        left = {self.sink[t] for t in targets} - {src}
        while heap and (left or not settled):
            d, v = heapq.heappop(heap)
            if done[v]:
                continue
            done[v] = True
            settled.append(v)
            left.discard(v)
            for i, w, c in adj[v]:
                nd = d + c
                if nd < dist[w]:
                    dist[w] = nd
                    pred[w] = i
                    heapq.heappush(heap, (nd, w))
        return pred, settled

    def paths(self, a: int, targets: Iterable[int]) -> dict[int, tuple[int, ...]]:
        """Fabric link ids from NPU ``a`` to each target NPU."""
        return {b: path for (_, b), path in self.paths_from({a: list(targets)}).items()}

    def paths_from(self, targets: dict[int, list[int]]) -> dict[tuple[int, int], tuple[int, ...]]:
        """Fabric link ids of every (source, target) pair: the same search as ``search``, in
        the compiled engine (one search per source; thousands at 16K GPUs)."""
        import choreo_engine

        sources = list(targets)
        lists = [list(dict.fromkeys(targets[a])) for a in sources]
        ptr = np.zeros(len(sources) + 1, dtype=np.int64)
        ptr[1:] = np.cumsum([len(bs) for bs in lists])
        flat = np.fromiter((self.sink[b] for bs in lists for b in bs), dtype=np.int64,
                           count=int(ptr[-1]))
        try:
            path_ptr, path_links = choreo_engine.shortest_paths(
                *self._csr(), np.asarray(sources, dtype=np.int64), ptr, flat)
        except ValueError:
            self._explain_unreachable(targets)
            raise
        hops = path_links.tolist()
        bounds = path_ptr.tolist()
        pairs = ((a, b) for a, bs in zip(sources, lists, strict=True) for b in bs)
        return {pair: tuple(hops[bounds[k]:bounds[k + 1]]) for k, pair in enumerate(pairs)}

    def _csr(self) -> tuple[np.ndarray, ...]:
        if self._arrays is None:
            counts = [len(out) for out in self.adj]
            ptr = np.zeros(len(self.adj) + 1, dtype=np.int64)
            ptr[1:] = np.cumsum(counts)
            rows = [e for out in self.adj for e in out]
            link = np.array([e[0] for e in rows], dtype=np.int64)
            head = np.array([e[1] for e in rows], dtype=np.int64)
            cost = np.array([e[2] for e in rows], dtype=np.float64)
            src = np.array([lk.src for lk in self.fabric.links], dtype=np.int64)
            self._arrays = (ptr, link, head, cost, src)
        return self._arrays

    def _explain_unreachable(self, targets: dict[int, list[int]]) -> None:
        """Raise the InputError naming the first pair without a usable path."""
        for a, bs in targets.items():
            pred, _ = self.search(a, set(bs))
            for b in bs:
                v = self.sink[b]
                while v != a:
                    i = pred[v]
                    if i < 0:
                        raise InputError(
                            f"{self.fabric.name}: no usable path from "
                            f"{self.fabric.node_name(a)} to {self.fabric.node_name(b)}")
                    v = self.fabric.links[i].src


def route(
    fabric: Topology, pairs: Iterable[tuple[int, int]], nbytes: float, transit: bool = True
) -> tuple[Topology, dict[tuple[int, int], int]]:
    """A routing topology (the fabric's links at their own indices, then one circuit per
    multi-hop pair) and the link each (src NPU, dst NPU) pair uses; ``transit`` as in
    ``Router``."""
    router = Router(fabric, nbytes, transit)
    targets: dict[int, list[int]] = {}
    for a, b in sorted(set(pairs)):
        targets.setdefault(a, []).append(b)
    paths = router.paths_from(targets)
    links = list(fabric.links)
    chosen: dict[tuple[int, int], int] = {}
    for (a, b), path in sorted(paths.items()):
        if len(path) == 1:
            chosen[(a, b)] = path[0]
            continue
        hops = [fabric.links[i] for i in path]
        slowest = min(range(len(hops)), key=lambda j: (hops[j].bandwidth, j))
        links.append(
            Link(a, b, sum(h.alpha for h in hops), hops[slowest].bandwidth,
                 hops[slowest].kind, True, path)
        )
        chosen[(a, b)] = len(links) - 1
    topo = Topology(
        name=f"{fabric.name}/routed",
        kinds=fabric.kinds,
        links=tuple(links),
        failed=fabric.failed,
        names=fabric.names,
        dims=fabric.dims,
        reducing=fabric.reducing,
    )
    return topo, chosen


def pair_links(
    chosen: dict[tuple[int, int], int], src: np.ndarray, dst: np.ndarray
) -> np.ndarray:
    """Vectorized lookup of the routed link for arrays of (src, dst) NPUs."""
    if not len(src):
        return np.zeros(0, dtype=np.int64)
    keys = np.array(sorted(chosen), dtype=np.int64).reshape(-1, 2)
    span = int(max(keys.max(), src.max(), dst.max())) + 1
    flat = keys[:, 0] * span + keys[:, 1]
    vals = np.array([chosen[(int(a), int(b))] for a, b in keys], dtype=np.int64)
    order = np.argsort(flat)
    idx = np.searchsorted(flat[order], src.astype(np.int64) * span + dst)
    return vals[order][idx]


def timed_plan(fabric: Topology, view: Topology, demands: tuple[Demand, ...], nbytes: float,
               tenant: np.ndarray, step: np.ndarray, src: np.ndarray, dst: np.ndarray,
               chunk: np.ndarray, op: np.ndarray, count: np.ndarray | None = None, *,
               engine: str, meta: dict[str, object], transit: bool = True) -> Schedule:
    """A fixed algorithm's sends (NPU to NPU, tagged with their step) routed on ``view`` (the
    fabric or a tenant's restriction of it; ``transit`` as in ``Router``) and timed by the
    congestion simulator: step ``k`` is planned at ``[k, k + 0.5)`` and the schedule carries
    what the simulator says runs."""
    topo, chosen = route(view, set(zip(src.tolist(), dst.tolist(), strict=True)), nbytes,
                         transit)
    planned = Schedule(
        fabric, topo, demands, tenant, chunk, src, dst, pair_links(chosen, src, dst),
        step.astype(float), step + 0.5, op, engine=engine,
        meta={**meta, "steps": int(step.max()) + 1 if len(step) else 0},
        count=np.ones(len(step)) if count is None else count)
    return simulate(planned).retimed(planned)
