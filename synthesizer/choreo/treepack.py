"""Packed broadcast trees for AllGather and ReduceScatter on direct links (ForestColl's method).

An AllGather is every rank broadcasting its shard, and a broadcast can split its shard over
several spanning out-trees. ForestColl shows that the best split over all trees reaches the
throughput bound on any topology. Here the split is a linear program over trees, solved by
column generation:

    minimise T  subject to  sum over trees t using link p of x_t * busy(t, p) <= T
                            sum over trees t rooted at r of x_t = 1      for every rank r

where ``busy(t, p)`` is how long tree ``t``'s copy of a shard holds link ``p``. Each round
prices every link by the program's duals and asks, for each root, for its cheapest spanning
arborescence (Chu-Liu/Edmonds, compiled: ``choreo_engine.min_arborescences``). Any tree
cheaper than its root's dual enters. The same prices give a lower bound (the sum of those
trees' prices), so the loop stops within ``GAP`` of the best of all tree packings, certified.

Each rank's shard is then cut into chunks and handed to its trees in proportion to their
shares (largest remainder, interleaved). The sends are list-scheduled: a free link takes the
ready send whose chunk comes first, less the hops still below it (the deepest paths go
first, so the pipeline drains evenly). The congestion simulator replays the plan as is.
ReduceScatter packs in-trees (the arborescences of the reversed links) and runs the same
plan backwards in time, each send reducing into its parent.

Fabrics with switches are left to the other engines: a send through a switch holds two
ports at once, which this list scheduler does not model.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import highspy
import numpy as np

from choreo.bounds import lower_bound
from choreo.collectives import Collective, Demand
from choreo.msccl.lower import lowerable
from choreo.rates import planned_costs
from choreo.schedule import Op, Schedule
from choreo.simulate import simulate
from choreo.teccl.highs import solver
from choreo.topology import Topology

ENGINE = "tree-packing"
COLLECTIVES = (Collective.ALLGATHER, Collective.REDUCESCATTER)
GAP = 0.005  # stop pricing when the packing is within this of the best tree packing
MAX_RANKS = 64  # the program and its pricing grow with ranks times links
MAX_ROUNDS = 60
CHUNKS_PER_RANK = (32, 64, 128)  # shard cuts tried; the simulator keeps the fastest
EPS = 1e-15  # seconds: a link free this close to now is free
MAX_SENDS = 1 << 18  # sends of one layout: the list scheduler runs in Python
LAYOUT_LOSS = 0.03  # the least a layout has lost to its packing's optimum (MI250: 7%)
ALPHAS = 10  # a chunk's transfer time, in link latencies, below which no cut is tried


@dataclass(frozen=True)
class Bundles:
    """The edges trees are made of: parallel links of one rank pair with the same costs form
    one edge (a send takes whichever is free), which keeps the program free of the many
    equal trees that only swap parallel links. ``tail``/``head`` are rank indices in the
    trees' direction (reversed for ReduceScatter); ``members`` the fabric links of each."""

    tail: np.ndarray
    head: np.ndarray
    members: list[list[int]]


@dataclass(frozen=True)
class Packing:
    """Per rank, its trees (arrays of bundle indices) and their shares of its shard.

    ``time`` is the program's optimum (bandwidth only) and ``bound`` the certified lower
    bound on every tree packing; both in seconds for the whole collective."""

    bundles: Bundles
    trees: list[list[tuple[np.ndarray, float]]]
    time: float
    bound: float
    rounds: int


def applies(fabric: Topology, demands: tuple[Demand, ...]) -> bool:
    """One AllGather or ReduceScatter tenant of at most ``MAX_RANKS`` ranks, on direct links
    (a fabric without switches)."""
    return (len(demands) == 1 and demands[0].collective in COLLECTIVES
            and 2 < demands[0].n <= MAX_RANKS and not fabric.switches)


def worth_cutting(fabric: Topology, demand: Demand) -> list[int]:
    """The shard cuts of ``CHUNKS_PER_RANK`` whose chunks take at least ``ALPHAS`` link
    latencies on the fastest link (below that the trees' many hops cost more than their
    balance gains: small buffers are the greedy engine's) and whose sends stay within
    ``MAX_SENDS``."""
    live = [lk for i, lk in enumerate(fabric.links) if fabric.usable(i)]
    if not live:
        return []
    fastest = max(lk.bandwidth for lk in live)
    latency = max(lk.alpha for lk in live)
    shard = demand.volume / demand.n
    sends = demand.n * (demand.n - 1)
    return [c for c in CHUNKS_PER_RANK
            if shard / c / fastest >= ALPHAS * latency and sends * c <= MAX_SENDS]


def bundles(fabric: Topology, ranks: tuple[int, ...], reverse: bool) -> Bundles:
    """The usable links between ranks, parallel ones of equal cost bundled; measured costs
    that lie close together count as equal (``rates.equalized``): MI250's four twin links
    measured with 0.5% noise, each its own edge, left the packing 45% slower."""
    index = {v: i for i, v in enumerate(ranks)}
    usable = [i for i, lk in enumerate(fabric.links)
              if lk.src in index and lk.dst in index and lk.src != lk.dst and fabric.usable(i)]
    alpha, bandwidth = planned_costs(fabric, usable)
    groups: dict[tuple[int, int, float, float], list[int]] = {}
    for i, a, bw in zip(usable, alpha.tolist(), bandwidth.tolist(), strict=True):
        lk = fabric.links[i]
        groups.setdefault((index[lk.src], index[lk.dst], a, bw), []).append(i)
    ends = np.array([key[:2] for key in groups], dtype=np.int64).reshape(-1, 2)
    tail, head = (ends[:, 1], ends[:, 0]) if reverse else (ends[:, 0], ends[:, 1])
    return Bundles(tail, head, list(groups.values()))


def pack(fabric: Topology, demand: Demand, deadline_s: float = 10.0) -> Packing | None:
    """The column-generation packing of ``demand``'s trees on the fabric's links (each its
    own resource); None where some rank cannot reach (AllGather) or be reached by
    (ReduceScatter) every other."""
    import choreo_engine

    started = time.monotonic()
    b = bundles(fabric, demand.ranks, demand.collective is Collective.REDUCESCATTER)
    if not len(b.members):
        return None
    shard = demand.volume / demand.n
    # The links a bundle's send may hold, and for how long per shard on average.
    links = sorted({i for members in b.members for i in members})
    row = {i: k for k, i in enumerate(links)}
    uses_ptr = np.cumsum([0] + [len(members) for members in b.members])
    uses = np.array([row[i] for members in b.members for i in members], dtype=np.int64)
    held = np.array([shard / fabric.links[i].bandwidth / len(members)
                     for members in b.members for i in members])
    n, np_ = demand.n, len(links)

    with solver(1) as lp:  # one thread, as the exact engines use
        inf = highspy.kHighsInf
        lp.addVar(0.0, inf)
        lp.changeColCost(0, 1.0)
        for _ in links:
            lp.addRow(-inf, 0.0, 1, np.array([0], np.int32), np.array([-1.0]))
        for _ in range(n):
            lp.addRow(1.0, 1.0, 0, np.array([], np.int32), np.array([]))
        columns: list[tuple[int, np.ndarray]] = []

        def add(root: int, edges: np.ndarray) -> None:
            load = np.zeros(np_)
            for e in edges:
                span = slice(uses_ptr[e], uses_ptr[e + 1])
                np.add.at(load, uses[span], held[span])
            rows = np.flatnonzero(load)
            lp.addCol(0.0, 0.0, inf, len(rows) + 1, np.append(rows, np_ + root).astype(np.int32),
                      np.append(load[rows], 1.0))
            columns.append((root, edges))

        roots = np.arange(n, dtype=np.uint32)
        src32, dst32 = b.tail.astype(np.uint32), b.head.astype(np.uint32)
        # Start from the trees of fewest hops (all links priced alike).
        trees = choreo_engine.min_arborescences(n, src32, dst32, np.ones(len(b.members)), roots)
        if (trees < 0).any():
            return None
        for r in range(n):
            add(r, trees[r])
        rounds, lower = 0, 0.0
        while True:
            lp.run()
            rounds += 1
            solution = lp.getSolution()
            value = lp.getInfo().objective_function_value
            price = np.maximum(-np.asarray(solution.row_dual[:np_]), 0.0)
            dual_root = np.asarray(solution.row_dual[np_:])
            cost = np.add.reduceat(price[uses] * held, uses_ptr[:-1])
            trees = choreo_engine.min_arborescences(n, src32, dst32, cost, roots)
            tree_cost = cost[trees].sum(axis=1)
            lower = max(lower, float(tree_cost.sum()) / max(float(price.sum()), 1e-300))
            if (value <= lower * (1 + GAP) or rounds >= MAX_ROUNDS
                    or time.monotonic() - started > deadline_s):
                break
            entering = np.flatnonzero(tree_cost < dual_root * (1 - 1e-9))
            if not len(entering):
                break
            for k in entering:
                add(int(k), trees[k])
    x = np.asarray(solution.col_value[1:])  # the loop ends before adding columns
    per_root: list[list[tuple[np.ndarray, float]]] = [[] for _ in range(n)]
    for (root, edges), share in zip(columns, x, strict=True):
        if share > 1e-9:
            per_root[root].append((edges, float(share)))
    return Packing(b, per_root, float(value), lower, rounds)


def _apportion(shares: list[float], chunks: int) -> list[int]:
    """The tree of each of ``chunks`` consecutive chunks: counts by largest remainder,
    interleaved so every tree's chunks spread over the whole shard."""
    total = sum(shares)
    quota = [s / total * chunks for s in shares]
    count = [int(q) for q in quota]
    for k in sorted(range(len(shares)), key=lambda k: count[k] - quota[k])[:chunks - sum(count)]:
        count[k] += 1
    order, given = [], [0] * len(shares)
    for j in range(chunks):
        k = max((k for k in range(len(shares)) if given[k] < count[k]),
                key=lambda k: (count[k] * (j + 1) / chunks - given[k], -k))
        order.append(k)
        given[k] += 1
    return order


def _hops_below(tail: np.ndarray, head: np.ndarray, edges: np.ndarray,
                root: int) -> dict[int, int]:
    """Per tree edge (index into the bundles), root's edges first, the most hops a chunk
    still takes below its head."""
    into = {int(head[e]): int(e) for e in edges}
    depth: dict[int, int] = {}

    def of(e: int) -> int:
        if e not in depth:
            up = int(tail[e])
            depth[e] = 1 if up == root else of(into[up]) + 1
        return depth[e]

    order = sorted((int(e) for e in edges), key=of)
    below = dict.fromkeys(order, 0)
    for e in reversed(order):
        up = into.get(int(tail[e]))
        if up is not None:
            below[up] = max(below[up], below[e] + 1)
    return below


def lay_out(fabric: Topology, demand: Demand, packing: Packing, chunks: int) -> Schedule:
    """The packing's sends with ``chunks`` chunks per shard, list-scheduled: whenever a link
    of a bundle is free it takes the ready send of the first chunk, less the hops still
    below that send. The simulator replays the plan as is."""
    reverse = demand.collective is Collective.REDUCESCATTER
    b = packing.bundles
    chunk_bytes = demand.volume / demand.n / chunks
    bundle_of: list[int] = []
    chunk_of: list[int] = []
    step_of: list[int] = []
    children: list[list[int]] = []
    ready: list[int] = []
    for r, trees in enumerate(packing.trees):
        belows = [_hops_below(b.tail, b.head, edges, r) for edges, _ in trees]
        for j, k in enumerate(_apportion([s for _, s in trees], chunks)):
            below = belows[k]
            first = len(bundle_of)
            arriving = {int(b.head[e]): first + i for i, e in enumerate(below)}
            for e in below:
                bundle_of.append(e)
                chunk_of.append(r * chunks + j)
                step_of.append(j - below[e])
                children.append([])
                if int(b.tail[e]) == r:
                    ready.append(len(bundle_of) - 1)
                else:
                    children[arriving[int(b.tail[e])]].append(len(bundle_of) - 1)
    m = len(bundle_of)
    start, end, link = np.zeros(m), np.zeros(m), np.zeros(m, dtype=np.int64)
    queues: list[list[tuple[int, int]]] = [[] for _ in b.members]
    free = [[0.0] * len(members) for members in b.members]
    events: list[tuple[float, int, int]] = []  # (time, 0 = a send ends / 1 = a bundle frees, id)
    for i in ready:
        heapq.heappush(queues[bundle_of[i]], (step_of[i], i))
    for e in set(bundle_of[i] for i in ready):
        heapq.heappush(events, (0.0, 1, e))
    while events:
        now, kind, ident = heapq.heappop(events)
        if kind == 0:
            for c in children[ident]:
                heapq.heappush(queues[bundle_of[c]], (step_of[c], c))
                heapq.heappush(events, (now, 1, bundle_of[c]))
            continue
        queue, slots = queues[ident], free[ident]
        while queue:
            slot = min(range(len(slots)), key=slots.__getitem__)
            if slots[slot] > now + EPS:
                break
            _, i = heapq.heappop(queue)
            lk = b.members[ident][slot]
            duration = fabric.links[lk].cost(chunk_bytes)
            start[i], end[i], link[i] = now, now + duration, lk
            slots[slot] = end[i]
            heapq.heappush(events, (end[i], 0, i))
            heapq.heappush(events, (end[i], 1, ident))
    if reverse:
        span = end.max()
        start, end = span - end, span - start
    ends = np.array([(fabric.links[i].src, fabric.links[i].dst) for i in link], dtype=np.int64)
    op = np.full(m, int(Op.REDUCE if reverse else Op.COPY))
    schedule = Schedule(fabric, fabric, (replace(demand, chunks=chunks),), np.zeros(m),
                        np.array(chunk_of), ends[:, 0], ends[:, 1], link, start, end, op,
                        engine=ENGINE,
                        meta={"engine": ENGINE, "chunks_per_rank": chunks,
                              "packing_s": packing.time, "packing_bound_s": packing.bound,
                              "rounds": packing.rounds})
    return simulate(schedule).retimed(schedule)


def tree_packing(fabric: Topology, demands: tuple[Demand, ...], deadline_s: float = 2.0,
                 beat: float = float("inf"),
                 accept: Callable[[Schedule], str] = lowerable) -> Schedule | None:
    """The fastest laid-out packing over a few shard cuts that ``accept`` takes ("" where
    it may run; by default where the executor can run it); None where it does not apply,
    none is taken, or no packing would beat ``beat`` seconds (another engine's time) by
    ``LAYOUT_LOSS``: first against the cut bound (cheap; for any cut of the shards, as the
    layout cuts them finer than asked), then against the packing's own optimum before
    laying it out."""
    if not applies(fabric, demands):
        return None
    cuts = worth_cutting(fabric, demands[0])
    bound = lower_bound(fabric, demands[0], whole_chunks=False).value_s
    if not cuts or bound * (1 + LAYOUT_LOSS) >= beat:
        return None
    found = pack(fabric, demands[0], deadline_s)
    if found is None or found.time * (1 + LAYOUT_LOSS) >= beat:
        return None
    laid = sorted((lay_out(fabric, demands[0], found, c) for c in cuts),
                  key=lambda s: s.makespan)
    return next((s for s in laid if not accept(s)), None)
