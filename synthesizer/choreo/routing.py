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
import itertools
from collections.abc import Iterable
from dataclasses import replace
from functools import cached_property

import numpy as np

from choreo.arrays import concat_ranges, unique_inverse
from choreo.collectives import Demand
from choreo.collector import collector_paused
from choreo.errors import InputError
from choreo.schedule import Schedule
from choreo.simulate import simulate
from choreo.topology import Link, LinkColumns, NodeKind, Topology, ViaColumns


class Router:
    """Cheapest paths on the fabric's usable links for a given chunk size (Dijkstra; ties go
    to the first link found, so routes are reproducible)."""

    def __init__(self, fabric: Topology, nbytes: float, transit: bool = True) -> None:
        """``transit=False``: no path passes through an NPU other than its ends (a fixed
        algorithm's rank-to-rank send goes through switches, never through another GPU).
        Each NPU then gets a sink copy at ``num_nodes + v`` that its in-links lead to."""
        self.fabric = fabric
        cols = fabric.columns
        n = fabric.num_nodes
        npu = np.array([k is NodeKind.NPU for k in fabric.kinds], dtype=bool)
        sink = np.arange(n, dtype=np.int64) + (n * npu if not transit else 0)
        self.sink = sink.tolist()
        # Per node its usable out-links (link, head, cost), in link order, as CSR: one
        # search per source NPU, so the inner loop should touch nothing else.
        link = np.flatnonzero(cols.usable)
        link = link[np.argsort(cols.src[link], kind="stable")]
        ptr = np.zeros(n + (n if not transit else 0) + 1, dtype=np.int64)
        ptr[1:n + 1] = np.cumsum(np.bincount(cols.src[link], minlength=n))
        ptr[n + 1:] = ptr[n]
        cost = cols.alpha[link] + nbytes / cols.bandwidth[link]
        self._arrays = (ptr, link, sink[cols.dst[link]], cost, cols.src)

    @cached_property
    def adj(self) -> list[list[tuple[int, int, float]]]:
        """Per node its usable out-links as (link, head, cost): ``search``'s graph."""
        ptr, link, head, cost, _ = self._arrays
        rows = list(zip(link.tolist(), head.tolist(), cost.tolist(), strict=True))
        bounds = ptr.tolist()
        return [rows[a:b] for a, b in itertools.pairwise(bounds)]

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
        sources = list(targets)
        lists = [list(dict.fromkeys(targets[a])) for a in sources]
        ptr = np.zeros(len(sources) + 1, dtype=np.int64)
        ptr[1:] = np.cumsum([len(bs) for bs in lists])
        flat = np.fromiter((b for bs in lists for b in bs), dtype=np.int64, count=int(ptr[-1]))
        path_ptr, path_links = self.path_columns(np.asarray(sources, dtype=np.int64), ptr, flat)
        hops = path_links.tolist()
        bounds = path_ptr.tolist()
        pairs = ((a, b) for a, bs in zip(sources, lists, strict=True) for b in bs)
        return {pair: tuple(hops[bounds[k]:bounds[k + 1]]) for k, pair in enumerate(pairs)}

    def path_columns(self, sources: np.ndarray, ptr: np.ndarray, targets: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray]:
        """The paths from ``sources[i]`` to each of ``targets[ptr[i]:ptr[i + 1]]`` (NPUs), in
        that order, as CSR of fabric link ids; InputError naming the first pair without
        one."""
        import choreo_engine

        sink = np.asarray(self.sink, dtype=np.int64)
        try:
            return choreo_engine.shortest_paths(*self._arrays, sources, ptr, sink[targets])
        except ValueError:
            self._explain_unreachable({int(a): targets[ptr[i]:ptr[i + 1]].tolist()
                                       for i, a in enumerate(sources.tolist())})
            raise

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
    keys = np.array(sorted(set(pairs)), dtype=np.int64).reshape(-1, 2)
    topo, link = circuits(fabric, keys[:, 0], keys[:, 1], nbytes, transit)
    return topo, {(x, y): k for (x, y), k in zip(keys.tolist(), link.tolist(), strict=True)}


def circuits(fabric: Topology, a: np.ndarray, b: np.ndarray, nbytes: float,
             transit: bool = True) -> tuple[Topology, np.ndarray]:
    """``route`` for distinct pairs ``(a[i], b[i])`` sorted by source then target, as
    columns: the routing topology and each pair's link. A circuit's alpha is its hops'
    alphas summed in path order, its bandwidth and kind its slowest hop's (the first, on a
    tie)."""
    if not len(a):
        return replace(fabric, name=f"{fabric.name}/routed"), np.zeros(0, dtype=np.int64)
    sources, first = np.unique(a, return_index=True)
    ptr = np.append(first, len(a)).astype(np.int64)
    path_ptr, path_links = Router(fabric, nbytes, transit).path_columns(
        sources.astype(np.int64), ptr, b.astype(np.int64))
    starts = path_ptr[:-1]
    hops = np.diff(path_ptr)
    chosen = path_links[starts].astype(np.int64)  # single hops: the link itself
    multi = np.flatnonzero(hops > 1)
    links = list(fabric.links)
    if len(multi):
        alpha = np.array([lk.alpha for lk in links], dtype=np.float64)
        bandwidth = np.array([lk.bandwidth for lk in links], dtype=np.float64)
        on_path = path_links.astype(np.int64)
        # short paths: add.reduceat sums each one left to right, as the hops come
        alphas = np.add.reduceat(alpha[on_path], starts)
        slowest_bw = np.minimum.reduceat(bandwidth[on_path], starts)
        segment = np.repeat(np.arange(len(a)), hops)
        at_min = np.flatnonzero(bandwidth[on_path] == slowest_bw[segment])
        _, first_min = np.unique(segment[at_min], return_index=True)
        slowest = on_path[at_min[first_min]]
        bounds = path_ptr.tolist()
        hop_list = on_path.tolist()
        base = len(links)
        with collector_paused():  # 295 K circuits at 16,384 GPUs: 0.4 s of collections
            links.extend(
                Link(x, y, al, bw, links[k].kind, True, tuple(hop_list[bounds[i]:bounds[i + 1]]))
                for i, x, y, al, bw, k in zip(
                    multi.tolist(), a[multi].tolist(), b[multi].tolist(),
                    alphas[multi].tolist(), slowest_bw[multi].tolist(), slowest[multi].tolist(),
                    strict=True))
        chosen[multi] = base + np.arange(len(multi))
    topo = Topology(
        name=f"{fabric.name}/routed",
        kinds=fabric.kinds,
        links=tuple(links),
        failed=fabric.failed,
        names=fabric.names,
        dims=fabric.dims,
        reducing=fabric.reducing,
    )
    if len(multi):  # the fabric's columns and the circuits', without a pass over the links
        fab = fabric.columns
        x, y = a[multi].astype(np.int64), b[multi].astype(np.int64)
        dead = np.zeros(fabric.num_nodes, dtype=bool)
        dead[list(fabric.failed)] = True
        topo.__dict__["columns"] = LinkColumns(
            np.concatenate([fab.src, x]), np.concatenate([fab.dst, y]),
            np.concatenate([fab.alpha, alphas[multi]]),
            np.concatenate([fab.bandwidth, slowest_bw[multi]]),
            np.concatenate([fab.usable, ~dead[x] & ~dead[y]]))
        vias = fabric.vias
        topo.__dict__["vias"] = ViaColumns(
            np.concatenate([vias.ptr, vias.ptr[-1] + np.cumsum(hops[multi])]),
            np.concatenate([vias.links, on_path[concat_ranges(starts[multi], hops[multi])]]))
    return topo, chosen


def timed_plan(fabric: Topology, view: Topology, demands: tuple[Demand, ...], nbytes: float,
               tenant: np.ndarray, step: np.ndarray, src: np.ndarray, dst: np.ndarray,
               chunk: np.ndarray, op: np.ndarray, count: np.ndarray | None = None, *,
               engine: str, meta: dict[str, object], transit: bool = True) -> Schedule:
    """A fixed algorithm's sends (NPU to NPU, tagged with their step) routed on ``view`` (the
    fabric or a tenant's restriction of it; ``transit`` as in ``Router``) and timed by the
    congestion simulator: step ``k`` is planned at ``[k, k + 0.5)`` and the schedule carries
    what the simulator says runs."""
    span = int(max(src.max(), dst.max())) + 1 if len(src) else 1
    keys, pair = unique_inverse(src.astype(np.int64) * span + dst)
    topo, link = circuits(view, keys // span, keys % span, nbytes, transit)
    planned = Schedule(
        fabric, topo, demands, tenant, chunk, src, dst, link[pair],
        step.astype(float), step + 0.5, op, engine=engine,
        meta={**meta, "steps": int(step.max()) + 1 if len(step) else 0},
        count=np.ones(len(step)) if count is None else count)
    return simulate(planned).retimed(planned)
