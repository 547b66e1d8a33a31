"""AllGather, ReduceScatter and AllReduce composed along planes, on groups of NPUs joined by
direct links.

Some fabrics are a product: small *groups* of NPUs joined by their fastest links (an MI250's
two GCDs of a package, four xGMI links between them), and *planes* that join one NPU of
every group (the GCDs on one side of each package, a 3-cube of single links). There the
bound is each group's plane links: every other group's shards must cross into the group
once, on some plane. The packed trees reach it as a rate (tree packing, MI250: 3.1317 ms for
1 GiB, the bound to the last digit) but their list-scheduled layout loses 7% to pipeline fill
and per-send latency across trees four hops deep.

The plan here: every plane runs its own AllGather of its members' shards (the greedy engine,
on the plane's links alone, where it is exact on a 3-cube), and every NPU hands each chunk
that reaches it on its plane, and its own shard first, to its group mates, on whichever of
the parallel links between them frees first. The groups' links carry a group's shards once
into every mate, so they keep up wherever they are faster than the plane's links into an
NPU; only the hand-over of the last chunks is left when the planes end, and those are cut
one piece per link. ReduceScatter runs each plane's ReduceScatter, and the mates hand a
rank their share of each chunk before it sends the chunk on; the first ones in pieces.
AllReduce is that ReduceScatter, then that AllGather.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np

from choreo.collectives import Collective, Demand
from choreo.errors import InfeasibleError
from choreo.msccl.lower import lowerable
from choreo.rates import planned_costs
from choreo.schedule import Op, Schedule
from choreo.simulate import simulate
from choreo.topology import Topology

ENGINE = "plane-gather"
COLLECTIVES = (Collective.ALLGATHER, Collective.REDUCESCATTER, Collective.ALLREDUCE)
GROUP_GAP = 1.5  # how much wider a group's connections are than any plane's, at least
PLANE_CHUNKS = (6, 12, 24, 36, 48)  # chunks per shard tried; the fastest accepted is kept
MAX_SENDS = 1 << 17  # of one plan: its hand-overs are planned in Python (64 GPUs: 1.4-2 s)


class Ask(NamedTuple):
    """A hand-over between a rank and its mates, in the order the lanes take them: in an
    AllGather from when the rank holds the chunk, in a ReduceScatter by when it needs its
    mates' shares (it sends the chunk on then)."""

    when: float
    rank: int
    chunk: int


@dataclass(frozen=True)
class Planes:
    """A demand's groups (rank indices, in slot order) and, per pair of mates, the fabric
    links from one to the other (``lanes[(u, v)]``, NPU ids)."""

    groups: list[list[int]]
    lanes: dict[tuple[int, int], list[int]]

    @property
    def mates(self) -> int:
        return len(self.groups[0])


def plane_layout(fabric: Topology, demand: Demand) -> Planes | None:
    """The demand's groups and planes, or None where the plan does not apply: a switchless
    fabric whose ranks fall into groups of two or more, every pair of a group joined both
    ways by the ranks' widest connections (``_widest``), every other
    link of a rank leading to the same slot of another group, each slot's plane connected.
    Links to NPUs outside the demand are never used (relay off: only a tenant's own NPUs
    forward its data)."""
    if demand.collective not in COLLECTIVES or fabric.switches or demand.n < 4:
        return None
    index = {npu: i for i, npu in enumerate(demand.ranks)}
    pair: dict[tuple[int, int], list[int]] = defaultdict(list)
    for k in fabric.usable_links():
        lk = fabric.links[k]
        if lk.src in index and lk.dst in index:
            pair[(lk.src, lk.dst)].append(k)
    fat = _widest(pair, fabric)
    if fat is None:
        return None
    if any((v, u) not in fat for u, v in fat):
        return None
    groups = _components(list(demand.ranks), fat)
    size = len(groups[0])
    if size < 2 or size == demand.n or any(len(g) != size for g in groups):
        return None
    if any((u, v) not in fat for g in groups for u in g for v in g if u != v):
        return None  # a group's mates must be one hop apart
    slot = _slots(groups, [p for p in pair if p not in fat])
    if slot is None:
        return None
    ordered = [sorted(g, key=lambda u: slot[u]) for g in groups]
    if any([slot[u] for u in g] != list(range(size)) for g in ordered):
        return None
    for s in range(size):  # every plane connected on its own links
        members = [g[s] for g in ordered]
        if len(_components(members, {p for p in pair if p not in fat
                                     and p[0] in members and p[1] in members})) != 1:
            return None
    lanes = {(u, v): sorted(pair[(u, v)]) for g in ordered for u in g for v in g if u != v}
    return Planes([[index[u] for u in g] for g in ordered], lanes)


def _widest(pair: dict[tuple[int, int], list[int]], fabric: Topology
            ) -> set[tuple[int, int]] | None:
    """The pairs above the widest gap between the pairs' connections (their links' summed
    bandwidth, sorted), where the pairs above it are at least ``GROUP_GAP`` times wider:
    measured rates differ by a few percent, so near-equal widths are one class however the
    noise spreads them (an MI250's in-package pairs with 15% noise on every link: 189-218
    GB/s, its plane links 43-57 GB/s)."""
    if not pair:
        return None
    widths = sorted(((sum(fabric.links[k].bandwidth for k in ks), p) for p, ks in pair.items()),
                    reverse=True)
    ratio, cut = max(((widths[i][0] / widths[i + 1][0], i + 1) for i in range(len(widths) - 1)),
                     default=(1.0, len(widths)))
    return {p for _, p in widths[:cut]} if ratio >= GROUP_GAP else None


def _components(nodes: list[int], edges: set[tuple[int, int]]) -> list[list[int]]:
    parent = {u: u for u in nodes}

    def find(u: int) -> int:
        while parent[u] != u:
            parent[u] = parent[parent[u]]
            u = parent[u]
        return u

    for u, v in edges:
        parent[find(u)] = find(v)
    out: dict[int, list[int]] = defaultdict(list)
    for u in nodes:
        out[find(u)].append(u)
    return list(out.values())


def _slots(groups: list[list[int]], plane_edges: list[tuple[int, int]]) -> dict[int, int] | None:
    """Each NPU's slot, spread from the first group along the plane links; None where a
    plane link joins two NPUs of one group or two slots."""
    group_of = {u: i for i, g in enumerate(groups) for u in g}
    adjacent: dict[int, list[int]] = defaultdict(list)
    for u, v in plane_edges:
        if group_of[u] == group_of[v]:
            return None
        adjacent[u].append(v)
        adjacent[v].append(u)
    slot = {u: s for s, u in enumerate(groups[0])}
    todo = list(groups[0])
    while todo:
        u = todo.pop()
        for v in adjacent[u]:
            if v not in slot:
                slot[v] = slot[u]
                todo.append(v)
            elif slot[v] != slot[u]:
                return None
    return slot if len(slot) == sum(len(g) for g in groups) else None


def plane_gather(fabric: Topology, demands: Sequence[Demand],
                 accept: Callable[[Schedule], str] = lowerable) -> Schedule | None:
    """The fastest plane plan of the one demand over ``PLANE_CHUNKS`` that ``accept`` takes
    ("" where it may run; by default where the executor can run it: more chunks are more
    steps per threadblock), or None where the plan does not apply or none is taken."""
    if len(demands) != 1:
        return None
    found = plane_layout(fabric, demands[0])
    if found is None:
        return None
    groups, mates = len(found.groups), found.mates
    phases = 2 if demands[0].collective is Collective.ALLREDUCE else 1
    # every plane's sends and every hand-over, of every phase (MI250, 24 chunks: 5,760)
    fit = [c for c in PLANE_CHUNKS
           if phases * c * groups * mates * (groups - 1 + groups * (mates - 1)) <= MAX_SENDS]
    try:
        tried = sorted((_planned(fabric, demands[0], found, c) for c in fit),
                       key=lambda s: s.makespan)
    except InfeasibleError:  # a plane its own links cannot serve (one-way links)
        return None
    return next((s for s in tried if not accept(s)), None)


def _planned(fabric: Topology, demand: Demand, planes: Planes, c: int) -> Schedule:
    """The plan with ``c`` chunks per shard on the planes; an AllReduce is its ReduceScatter,
    then its AllGather, planned after it (each chunk's AllGather waits only for that chunk's
    reductions, as the simulator runs it)."""
    m = min(len(ks) for ks in planes.lanes.values())
    if demand.collective is Collective.ALLREDUCE:
        rows = _phase(fabric, demand, planes, c, m, reduced=True)
        after = max((r[0] + r[1] for r in rows), default=0.0)
        rows += [(t0 + after, *rest) for t0, *rest in _phase(fabric, demand, planes, c, m,
                                                              reduced=False)]
    else:
        rows = _phase(fabric, demand, planes, c, m,
                      reduced=demand.collective is Collective.REDUCESCATTER)
    raw = np.asarray(rows, dtype=np.float64)
    ranks = np.asarray(demand.ranks)
    src = ranks[raw[:, 2].astype(np.int64)]
    dst = ranks[raw[:, 3].astype(np.int64)]
    link = raw[:, 6].astype(np.int64)
    step = np.unique(raw[:, 0], return_inverse=True)[1].astype(np.int64)
    sched = Schedule(fabric, fabric, (replace(demand, chunks=c * m),),
                     np.zeros(len(raw), dtype=np.int64), raw[:, 4].astype(np.int64), src, dst,
                     link, step.astype(float), step + 0.5, raw[:, 7].astype(np.int64),
                     engine=ENGINE, meta={"engine": ENGINE, "plane_chunks": c,
                                          "steps": int(step.max()) + 1},
                     count=raw[:, 5].astype(np.int64))
    return simulate(sched).retimed(sched)


def _phase(fabric: Topology, demand: Demand, planes: Planes, c: int, m: int,
           reduced: bool) -> list[tuple[float, ...]]:
    """An AllGather's or (``reduced``) a ReduceScatter's sends as rows of (estimated start,
    seconds, src rank, dst rank, first chunk, chunk count, fabric link, op), ``c`` chunks per
    shard on the planes, each cut in ``m`` for the hand-overs. A hand-over takes whichever of
    the mates' parallel links frees first, but for the chunks that arrive as the planes end
    in an AllGather (on every plane link at once), or leave as they start in a
    ReduceScatter, it is cut in one piece per link: nothing overlaps those hand-overs.
    Cutting them all ends no sooner and takes as many more steps as there are links."""
    shard = demand.size / demand.n
    # Each lane at its rate as the planes' greedy plans rates (``rates.planned_costs``: measured
    # a little apart, the lanes are timed at the slowest of them; a lane timed fast would
    # hand over late to the plane send that waits for it)
    lane_ids = sorted({k for ks in planes.lanes.values() for k in ks})
    cost = dict(zip(lane_ids, zip(*(v.tolist() for v in planned_costs(fabric, lane_ids)),
                                  strict=True), strict=True))

    def took(k: int, cut: bool) -> float:
        alpha, bandwidth = cost[k]
        return alpha + shard / (c * m if cut else c) / bandwidth

    whole = max(took(k, False) for k in lane_ids)
    op = int(Op.REDUCE if reduced else Op.COPY)
    rows: list[tuple[float, ...]] = []
    asked: list[Ask] = []
    for s in range(planes.mates):
        sends, wanted = _plane(fabric, demand, [g[s] for g in planes.groups], c, reduced)
        rows.extend((t0, t1 - t0, u, v, gid * m, m, k, op) for t0, t1, u, v, gid, k in sends)
        asked.extend(wanted)
    end = max((r[0] + r[1] for r in rows), default=0.0)
    group_of = {r: g for g in planes.groups for r in g}
    ranks = demand.ranks
    free: dict[tuple[int, int], list[float]] = {
        pair: [0.0] * len(ks) for pair, ks in planes.lanes.items()}
    late = 0.0  # how much later a ReduceScatter's planes start for its hand-overs to make it
    hands: list[tuple[float, ...]] = []
    for when, r, gid in sorted(asked):
        cut = when < whole / 2 if reduced else when > end - whole / 2
        for w in group_of[r]:
            if w == r:
                continue
            pair = (ranks[w], ranks[r]) if reduced else (ranks[r], ranks[w])
            lanes = free[pair]
            order = sorted(range(len(lanes)), key=lanes.__getitem__)
            for i, lane in enumerate(order[:m] if cut else order[:1]):
                on = planes.lanes[pair][lane]
                start = lanes[lane] if reduced else max(when, lanes[lane])
                seconds = took(on, cut)
                lanes[lane] = start + seconds
                if reduced:
                    late = max(late, start + seconds - when)
                lo, count = (gid * m + i, 1) if cut else (gid * m, m)
                hands.append((start, seconds, w, r, lo, count, on, op) if reduced
                             else (start, seconds, r, w, lo, count, on, op))
    if reduced:
        rows = [(t0 + late, *rest) for t0, *rest in rows]
    return rows + hands


def _plane(fabric: Topology, demand: Demand, members: list[int], c: int, reduced: bool
           ) -> tuple[list[tuple[float, float, int, int, int, int]], list[Ask]]:
    """One plane's collective by the greedy engine on its links alone: its sends as (start,
    end, src rank, dst rank, chunk of ``c`` per shard, fabric link), and the hand-overs it
    asks for. In an AllGather a rank hands each chunk to its mates once it holds it (its own
    shard at once); in a ReduceScatter its mates hand it their share of each chunk of the
    plane by the time it sends the chunk on (the planes start later if the mates' links
    cannot)."""
    from choreo.synth import SynthOptions, synthesize

    ranks = demand.ranks
    sub = Demand(Collective.REDUCESCATTER if reduced else Collective.ALLGATHER,
                 tuple(ranks[r] for r in members),
                 demand.size * len(members) // demand.n, c)
    plane = synthesize(fabric, [sub], SynthOptions(relay=False, rail_gather=False,
                                                    tree_packing=False, plane_gather=False))
    rank_of = {ranks[r]: r for r in members}
    # the tenant's view of a switchless fabric keeps its link indices; a send on one that
    # does not join its ends in the fabric takes the pair's first link
    first = {(lk.src, lk.dst): k for k, lk in reversed(list(enumerate(fabric.links)))
             if fabric.usable(k)}

    def fabric_link(k: int, u: int, v: int) -> int:
        if k < len(fabric.links) and fabric.usable(k) and \
                (fabric.links[k].src, fabric.links[k].dst) == (u, v):
            return k
        return first[(u, v)]

    sends = []
    when: dict[tuple[int, int], float] = {}  # (rank, chunk): it arrives, or is sent on
    for ch, u, v, t0, t1, k in zip(plane.chunk.tolist(), plane.src.tolist(),
                                   plane.dst.tolist(), plane.start.tolist(),
                                   plane.end.tolist(), plane.link.tolist(), strict=True):
        origin, j = divmod(ch, c)
        gid = members[origin] * c + j
        on = fabric_link(k, u, v)
        u, v = rank_of[u], rank_of[v]
        sends.append((t0, t1, u, v, gid, on))
        if reduced:  # a rank sends each chunk on once, towards its owner
            when[(u, gid)] = t0
        else:  # and receives each once
            when[(v, gid)] = t1
    if not reduced:
        when.update(((r, r * c + j), 0.0) for r in members for j in range(c))
        return sends, [Ask(t, r, gid) for (r, gid), t in when.items()]
    end = float(plane.end.max()) if len(plane) else 0.0
    return sends, [Ask(when.get((r, gid), end), r, gid)
                   for r in members for gid in (o * c + j for o in members for j in range(c))]
