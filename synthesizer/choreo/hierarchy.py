"""Rail-aligned hierarchical AllReduce for tenants too large for chunk-by-chunk matching.

A tenant of hundreds of GPUs has ``n`` pieces that each of its ``n`` ranks must receive, so a
chunk-level schedule has ``n**2`` transfers and its MSCCL program outgrows the runtime's step
and node limits. Multi-GPU hosts with one NIC per GPU (rails) give the structure to avoid
that (as NCCL's and TACCL's hierarchical AllReduce do):

1. inside each host, reduce-scatter the buffer into one *part* per GPU slot: the GPU at slot
   ``s`` collects part ``s`` from its host mates (a slot that lost its GPU or NIC on some host
   owns no part anywhere: see ``owners_of``);
2. across hosts, the owners of part ``s`` run recursive halving/doubling on it (its rail),
   so each owner sends ``O(log hosts)`` ranges; extra hosts beyond a power of two fold in;
3. inside each host, the owners all-gather their reduced parts.

Every send moves a contiguous chunk range (``Schedule.count``), so the schedule has
``O(n log n)`` transfers. The sends are routed on the fabric and timed by the congestion
simulator, like the fixed baselines, and the result is checked by the verifier as usual.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

import numpy as np

from choreo.collectives import Collective, Demand
from choreo.errors import InputError
from choreo.msccl.layout import MAX_CNT, RUNTIMES, own_apart
from choreo.routing import route, timed_plan
from choreo.schedule import Op, Schedule
from choreo.topology import Topology
from choreo.transforms import restrict

ENGINE = "rail-hierarchical"
T = TypeVar("T")
LARGE_TENANT = 256  # ranks; larger AllReduce tenants on multi-GPU hosts use this plan
# MSCCL steps of one host's ranks: a node's file takes about 125 bytes per step, so 7500
# keep it under one ConfigMap (1 MiB) with room to spare.
MAX_HOST_STEPS = 7500
MAX_SLICES = 8
# Threadblocks of one rank (``Shape.threadblocks``): the executor runtime stores a
# dependency's threadblock in an int8 (``layout.Runtime.max_depid``).
MAX_RANK_THREADBLOCKS = RUNTIMES["executor"].max_depid
RAMPS = (2, 3)  # slice growth ratios tried at both ends of the pipeline
CAPS = (1, 2, 3, 4, 8, 9)  # largest slice weights tried (1: equal slices)


def busiest_host_steps(schedule: Schedule) -> int:
    """MSCCL steps of the busiest host's ranks, at most: a send and its receive are a step
    each per ``MAX_CNT`` chunks of the range, and per buffer the range spans (``own_apart``;
    the budget ``MAX_HOST_STEPS`` keeps a node's file within one ConfigMap). Hosts are the
    ``host/`` prefixes of the NPU names."""
    if not len(schedule):
        return 0
    names = schedule.fabric.names
    host_ids: dict[str, int] = {}
    host = np.array([host_ids.setdefault(names[v].split("/", 1)[0], len(host_ids))
                     for v in range(len(names))])
    per_host = np.zeros(len(host_ids))
    for t, demand in enumerate(schedule.demands):
        mine, _ = own_apart(schedule.select(schedule.tenant == t), demand)
        steps = np.ceil(mine.count / MAX_CNT)
        np.add.at(per_host, host[mine.src], steps)
        np.add.at(per_host, host[mine.dst], steps)
    return int(per_host.max())


def hosts_of(fabric: Topology, ranks: Sequence[int]) -> list[list[tuple[int, int]]] | None:
    """Per host (in order of first rank), its ranks as (slot, rank index) sorted by slot; the
    slot is the GPU's position among all of its host's NPUs (``host/...`` names), failed ones
    included, so slot ``s`` is the same rail on every host. None without host names."""
    if not fabric.names or not all("/" in fabric.names[v] for v in ranks):
        return None
    members: dict[str, list[int]] = {}
    for v in fabric.all_npus:
        name = fabric.names[v]
        if "/" in name:
            members.setdefault(name.split("/", 1)[0], []).append(v)
    slot = {v: i for vs in members.values() for i, v in enumerate(vs)}
    groups: dict[str, list[tuple[int, int]]] = {}
    for i, v in enumerate(ranks):
        groups.setdefault(fabric.names[v].split("/", 1)[0], []).append((slot[v], i))
    return [sorted(g) for g in groups.values()]


def applies(fabric: Topology, demand: Demand, large: int = LARGE_TENANT) -> bool:
    """Whether ``demand`` gets the hierarchical plan: a large AllReduce over several hosts."""
    if demand.collective is not Collective.ALLREDUCE or demand.n <= large:
        return False
    hosts = hosts_of(fabric, demand.ranks)
    return hosts is not None and len(hosts) > 1


@dataclass(frozen=True)
class Hop:
    """Estimated cost of one send: ``alpha + bytes * beta`` seconds."""

    alpha: float
    beta: float

    def time(self, nbytes: float) -> float:
        return self.alpha + nbytes * self.beta


@dataclass(frozen=True)
class Shape:
    """The plan's structure: ``parts`` slots per host, ``hosts`` owners per part of which
    ``extra`` beyond a power of two fold in, at most ``gpus`` GPUs per host (default
    ``parts``; more where a slot owns no part)."""

    parts: int
    hosts: int
    gpus: int = 0
    levels: tuple[int, ...] = ()  # the rail phase's radices; default ``radices(hosts)``
    owned: int = 1  # the most parts one rank owns (more than one where a host hands parts)

    @property
    def host_steps(self) -> int:
        """Rounds of a host phase: every GPU sends to or receives from each mate once."""
        return max(self.gpus, self.parts) - 1

    @property
    def radices(self) -> tuple[int, ...]:
        """The rail phase's levels: their product is its core hosts, all but ``extra``."""
        return self.levels or radices(self.hosts)

    @property
    def extra(self) -> int:
        return self.hosts - math.prod(self.radices)

    def rail_fractions(self) -> list[float]:
        """The share of a part each rail send carries, in step order: per level of radix r,
        r - 1 sends of the level's sub-range; all-gather mirrors the reduce-scatter."""
        scatter, share = [], 1.0
        for r in self.radices:
            share /= r
            scatter += [share] * (r - 1)
        fold = [1.0] if self.extra else []
        return fold + scatter + scatter[::-1] + fold

    def rail_chunks(self, chunks: float) -> list[int]:
        """``rail_fractions`` for a part of ``chunks`` whole chunks: the largest sub-range
        each send carries, since cutting a range of ``x`` chunks ``r`` ways leaves pieces of up
        to ``ceil(x / r)``."""
        whole = math.ceil(chunks - 1e-9)
        scatter, held = [], whole
        for r in self.radices:
            held = -(-held // r)
            scatter += [held] * (r - 1)
        fold = [whole] if self.extra else []
        return fold + scatter + scatter[::-1] + fold

    @property
    def peers(self) -> int:
        """Ranks one rank sends to or receives from: its host mates and its rail groups."""
        rail = sum(r - 1 for r in self.radices) + (1 if self.extra else 0)
        return self.host_steps + self.owned * rail

    def threadblocks(self, weights: Sequence[int], ranks: int, chunks: int) -> int:
        """A rank's threadblocks in the lowered program, from above. The lowering cuts the
        program into epochs, each a channel in which every peer and direction gets a
        threadblock (2 per peer at most, and one for the rank's own copies), and adds epochs
        until no threadblock holds more than 0.8 of the runtime's steps (``msccl.lower``).
        The busiest one serves a host mate: per slice it sends the slice's part twice (the
        reduce-scatter to the part's owner, the all-gather of its own) and receives it twice,
        and its all-gather waits for every rail arrival of the part, one ``nop`` each.
        Measured with the lowering (threadblocks, this estimate): dgx-h100-128 (14 peers)
        41, 57 with 2 epochs; dgx-h100-33 (19 peers) 60, 77; dgx-h100-34 less a GPU
        (24 peers, radix 17) 78, 97, and for five slices there 117, 145 (3 epochs), over
        the budget. A rank that owns several parts (its host lost slots) serves more per
        threadblock than this counts, and takes the earlier measure instead."""
        if self.owned > 1:  # measured on 33-128 hosts: up to 1.5 per peer and slice
            return math.ceil(1.5 * len(weights) * self.peers)
        total = sum(weights)
        rail = (self.peers - self.host_steps) * len(weights)
        busiest = rail + 4 * sum(math.ceil(ranks * chunks * w / total / self.parts / MAX_CNT)
                                 for w in weights)
        limit = RUNTIMES["executor"].max_steps
        epochs = max(1, math.ceil(busiest / (0.8 * limit)))
        return epochs * 2 * self.peers + 1

    def steps_per_host(self, weights: Sequence[int], ranks: int, chunks: int) -> int:
        """MSCCL steps of one host's ranks for these slices, at most: each send and its
        receive is a step per ``MAX_CNT`` chunks of its range, plus one (exact on
        dgx-h100-128; the lowering fuses some where hosts are few)."""
        steps = 0
        for w in weights:
            part = ranks * chunks * w / sum(weights) / self.parts
            host_sends = 2 * self.host_steps  # reduce-scatter and all-gather
            steps += host_sends * (math.ceil(part / MAX_CNT) + 1)
            steps += sum(math.ceil(part * f / MAX_CNT) + 1 for f in self.rail_fractions())
        return 2 * self.parts * steps


@dataclass
class Timeline:
    """Estimated start of every slice's phases, the estimated end of the whole plan, and per
    slice the seconds of one host send and of each rail round in order."""

    host_rs: list[float]
    rail: list[float]
    host_ag: list[float]
    end: float
    host_send: list[float]
    rail_sends: list[list[float]]


def timeline(shape: Shape, weights: Sequence[int], part_bytes: float, host: Hop,
             rail: Hop, part_chunks: float | None = None) -> Timeline:
    """Two-machine flow shop per GPU: its host port runs each slice's reduce-scatter and
    all-gather, its rail port the slice's rail steps in slice order; the host port serves a
    finished rail slice's all-gather first, else the next reduce-scatter. With
    ``part_chunks`` (chunks in a part of the whole buffer) every send carries its largest
    piece in whole chunks, so too few chunks to cut evenly show as a longer plan."""
    total = sum(weights)
    if part_chunks is None:
        bytes_of = [part_bytes * w / total for w in weights]
        host_bytes = bytes_of
        rail_bytes = [[b * f for f in shape.rail_fractions()] for b in bytes_of]
    else:
        unit = part_bytes / part_chunks
        held = [part_chunks * w / total for w in weights]
        host_bytes = [math.ceil(x - 1e-9) * unit for x in held]
        rail_bytes = [[c * unit for c in shape.rail_chunks(x)] for x in held]
    host_send = [host.time(b) for b in host_bytes]
    rail_sends = [[rail.time(b) for b in sends] for sends in rail_bytes]
    host_phase = [shape.host_steps * t for t in host_send]
    rail_phase = [sum(sends) for sends in rail_sends]
    k = len(weights)
    rs: list[float] = []
    ag: list[float] = []
    rail_start: list[float] = []
    rail_end: list[float] = []
    t = 0.0
    while len(ag) < k:
        ready = rail_end[len(ag)] if len(ag) < len(rail_end) else float("inf")
        if len(rs) < k and ready > t:
            j = len(rs)
            rs.append(t)
            t += host_phase[j]
            start = max(t, rail_end[-1] if rail_end else 0.0)
            rail_start.append(start)
            rail_end.append(start + rail_phase[j])
        else:
            ag.append(max(t, ready))
            t = ag[-1] + host_phase[len(ag) - 1]
    return Timeline(rs, rail_start, ag, t, host_send, rail_sends)


@dataclass(frozen=True)
class Slices:
    """The buffer's cut into pipelined slices: their relative sizes, and the chunks per
    piece that cut it (``ranks * chunks`` divisible by the weights' total)."""

    weights: tuple[int, ...]
    chunks: int


def slicing(shape: Shape, part_bytes: float, host: Hop, rail: Hop, ranks: int,
            chunks: int = 1, max_steps: int | None = None) -> Slices:
    """Slices with the earliest estimated end: one to ``MAX_SLICES`` slices (within
    ``max_steps`` MSCCL steps per host, default ``MAX_HOST_STEPS``, and
    ``MAX_RANK_THREADBLOCKS`` threadblocks per rank), equal or growing by a
    ramp ratio from both ends up to a cap, so the first reduce-scatter and the last
    all-gather, which nothing overlaps, stay short. ``chunks``: the chunks per piece asked
    for; each slicing takes the count from there up to the first multiple of its weights'
    total whose whole-chunk estimate ends first (fewer chunks are fewer MSCCL steps, so
    more slices fit a ConfigMap). The estimate is the simulator's own time where hosts
    are alike and pieces even (``timeline``)."""
    budget = MAX_HOST_STEPS if max_steps is None else max_steps
    best: tuple[float, Slices] = (float("inf"), Slices((1,), chunks))
    shapes = {tuple(min(ramp ** i, ramp ** (k - 1 - i), cap) for i in range(k))
              for k in range(1, MAX_SLICES + 1) for ramp in RAMPS for cap in CAPS}
    for w in sorted(shapes, key=lambda w: (len(w), w)):  # ties go to fewer slices, chunks
        total = sum(w)
        for c in range(chunks, total * -(-chunks // total) + 1):
            if ranks * c % total:
                continue  # slices would not be whole chunks
            if len(w) > 1 and (shape.steps_per_host(w, ranks, c) > budget
                               or shape.threadblocks(w, ranks, c) > MAX_RANK_THREADBLOCKS):
                break  # more chunks only add steps and threadblocks
            end = timeline(shape, w, part_bytes, host, rail, ranks * c / shape.parts).end
            if end < best[0] * (1 - 1e-9):
                best = (end, Slices(w, c))
    return best[1]


def best_shape(shape: Shape, part_bytes: float, host: Hop, rail: Hop, ranks: int,
               chunks: int = 1) -> tuple[Shape, Slices]:
    """The rail levels (the factors up to ``MAX_RADIX``; hosts beyond a count made of them
    fold in) and the slices with the earliest estimated end. Wider levels (a prime host count
    above 19 as one level) would save the fold but give each rank more threadblocks than the
    lowering can hold (measured: 187 for radix 31 with two slices, over the runtime's 127)."""
    levels = replace(shape, levels=radices(shape.hosts))
    return levels, slicing(levels, part_bytes, host, rail, ranks, chunks)


class _Sends:
    """Rank-to-rank sends of chunk ranges, each tagged with its estimated start, in the
    order they were added: one at a time or a round of them as arrays."""

    def __init__(self) -> None:
        self._rows: list[tuple[float, int, int, int, int, int]] = []
        self._blocks: list[np.ndarray] = []

    def add(self, at: float, src: int, dst: int, lo: int, hi: int, op: Op) -> None:
        if hi > lo:
            self._rows.append((at, src, dst, lo, hi - lo, int(op)))

    def add_many(self, at: np.ndarray | float, src: np.ndarray, dst: np.ndarray,
                 lo: np.ndarray | int, hi: np.ndarray | int, op: Op) -> None:
        """Sends given as equal-length arrays (``at``, ``lo`` and ``hi`` may broadcast)."""
        at, src, dst, lo, hi = np.broadcast_arrays(at, src, dst, lo, hi)
        keep = hi > lo
        self._flush()
        block = np.empty((int(keep.sum()), 6))
        block[:, 0], block[:, 1], block[:, 2] = at[keep], src[keep], dst[keep]
        block[:, 3], block[:, 4], block[:, 5] = lo[keep], (hi - lo)[keep], int(op)
        self._blocks.append(block)

    def _flush(self) -> None:
        if self._rows:
            self._blocks.append(np.asarray(self._rows, dtype=np.float64).reshape(-1, 6))
            self._rows = []

    def table(self) -> np.ndarray:
        """Every send as a row of (start, src, dst, first chunk, chunks, op)."""
        self._flush()
        return np.concatenate(self._blocks) if self._blocks else np.empty((0, 6))


def owners_of(hosts: list[list[tuple[int, int]]],
              railed: set[int] | None = None) -> tuple[list[int], list[list[int]]]:
    """The slots that own a part, and per host the rank index holding each part.

    A part travels on one rail, so its slot must have a GPU with a working NIC (``railed``:
    the rank indices that have one; None: all) on every host: a host that lost a GPU or a
    NIC takes its slot out of the parts everywhere, and the buffer is cut into one part per
    remaining rail, each rail's NICs loaded evenly. Handing the lost slot's part to a mate
    instead doubles that mate's NIC load and slows the whole rail phase twofold, so hosts do
    that only where fewer than half the slots would be left (a rank owning two parts has
    twice the peers, and its program can outgrow the runtime's threadblock limits)."""
    usable = [{s for s, r in host if railed is None or r in railed} for host in hosts]
    every = set.intersection(*usable)
    anywhere = {s for host in hosts for s, _ in host}
    slots = sorted(every if 2 * len(every) >= len(anywhere) else anywhere)
    owners = []
    for host in hosts:
        by_slot = dict(host)
        local = [r for _, r in host]
        owners.append([by_slot.get(s, local[k % len(local)]) for k, s in enumerate(slots)])
    return slots, owners


def plan(demand: Demand, hosts: list[list[tuple[int, int]]], weights: Sequence[int],
         host: Hop, rail: Hop, railed: set[int] | None = None,
         levels: tuple[int, ...] = ()) -> _Sends:
    """The three phases in rank space (see the module docstring) on consecutive slices of
    the buffer (``weights``: their relative sizes), each send tagged with its start in the
    flow-shop estimate, so the simulator serves every port in a realistic order."""
    slots, owners = owners_of(hosts, railed)
    parts = len(slots)
    shape = Shape(parts, len(hosts), max(len(m) for m in hosts), levels)
    rounds = _HostRounds(hosts, owners)
    part_bytes = demand.size / parts
    est = timeline(shape, weights, part_bytes, host, rail, demand.num_chunks / parts)
    out = _Sends()
    total, before = demand.num_chunks, np.cumsum([0, *weights])
    edges = [int(total * b // before[-1]) for b in before]
    for j in range(len(weights)):
        lo, hi = edges[j], edges[j + 1]
        bounds = [lo + k * (hi - lo) // parts for k in range(parts + 1)]
        rounds.add(out, bounds, est.host_rs[j], est.host_send[j], gather=False)  # 1
        rail_at = [est.rail[j]]
        for seconds in est.rail_sends[j]:
            rail_at.append(rail_at[-1] + seconds)
        for k in range(parts):  # 2: mixed-radix reduce-scatter and all-gather across hosts
            _multiply(out, rail_at, _near_first([o[k] for o in owners], shape.radices),
                      bounds[k], bounds[k + 1], shape.radices)
        rounds.add(out, bounds, est.host_ag[j], est.host_send[j], gather=True)  # 3
    return out


class _HostRounds:
    """The host phases of ``plan``: every member of every host sends each part it does not
    own to the part's owner (reduce-scatter), or receives it from the owner (all-gather).
    Senders rotate by their owner's place in the host, so no owner takes two sends in one
    round and every round of a host phase ends before the rail phase starts. Every host at
    once as arrays (host, member, part), padded to the widest host: a 1,024-GPU plan has
    37,000 of these sends."""

    def __init__(self, hosts: list[list[tuple[int, int]]], owners: list[list[int]]) -> None:
        width = max(len(m) for m in hosts)
        self.size = np.array([len(m) for m in hosts])[:, None, None]
        self.rank = np.full((len(hosts), width), -1)
        place: list[dict[int, int]] = []
        for h, members in enumerate(hosts):
            self.rank[h, :len(members)] = [r for _, r in members]
            place.append({r: pos for pos, (_, r) in enumerate(members)})
        self.owner = np.array(owners)  # (host, part)
        self.owner_pos = np.array([[place[h][o] for o in row] for h, row in enumerate(owners)])
        self.pos = np.arange(width)[None, :, None]
        member = self.rank[:, :, None]
        self.keep = (self.pos < self.size) & (member != self.owner[:, None, :])
        self.member = np.broadcast_to(member, self.keep.shape)[self.keep]
        self.owner_of = np.broadcast_to(self.owner[:, None, :], self.keep.shape)[self.keep]
        self.part = np.broadcast_to(np.arange(self.owner.shape[1]), self.keep.shape)[self.keep]

    def add(self, out: _Sends, bounds: Sequence[int], first: float, step: float,
            gather: bool) -> None:
        """One slice's phase (chunks ``bounds[k]..bounds[k + 1]`` per part ``k``), its
        rounds ``step`` apart from ``first``, in the order host, member, part."""
        owner_pos = self.owner_pos[:, None, :]
        turn = ((self.pos - owner_pos - 1) if gather else (owner_pos - self.pos - 1)) % self.size
        at = first + step * np.broadcast_to(turn, self.keep.shape)[self.keep]
        edges = np.asarray(bounds)
        lo, hi = edges[self.part], edges[self.part + 1]
        if gather:
            out.add_many(at, self.owner_of, self.member, lo, hi, Op.COPY)
        else:
            out.add_many(at, self.member, self.owner_of, lo, hi, Op.REDUCE)


MAX_RADIX = 19  # a level of radix r costs every member r - 1 sends and peers


def radices(hosts: int, largest: int = MAX_RADIX) -> tuple[int, ...]:
    """Levels of the rail phase: the prime factors of the largest number of hosts up to
    ``hosts`` whose factors are all at most ``largest``, largest first; the hosts beyond it
    fold in. Any host count then reduce-scatters in as many rounds as it has prime factors,
    each moving exactly the member's share, where recursive halving alone folds in every
    host beyond a power of two with a whole part (1.5x the rail phase at 125 hosts)."""
    for core in range(hosts, 0, -1):
        factors, left = [], core
        for f in range(2, largest + 1):
            while left % f == 0:
                factors.append(f)
                left //= f
        if left == 1:
            return tuple(sorted(factors, reverse=True))
    return ()


def _multiply(out: _Sends, at: list[float], members: list[int], lo: int, hi: int,
              levels: Sequence[int]) -> None:
    """AllReduce of chunks ``lo..hi-1`` among ``members`` by mixed-radix reduce-scatter and
    all-gather over ``levels`` (recursive halving and doubling when every radix is 2), the
    members beyond their product folding in; ``at[i]``: send round i's start. Member i ends
    the reduce-scatter owning block i of the core's blocks."""
    core = math.prod(levels)
    extra = len(members) - core
    rounds = iter(at)
    ranks = np.asarray(members, dtype=np.int64)
    i = np.arange(core, dtype=np.int64)[:, None]  # a member per row, its turns across

    def cut(b: np.ndarray) -> np.ndarray:
        return lo + b * (hi - lo) // core

    if extra:
        out.add_many(next(rounds), ranks[core:], ranks[:extra], lo, hi, Op.REDUCE)
    weights = [math.prod(levels[k + 1:]) for k in range(len(levels))]  # blocks per digit
    for k, r in enumerate(levels):  # reduce-scatter: keep sub-range d, send the others
        w = weights[k]
        times = np.array([next(rounds) for _ in range(r - 1)])
        d = i // w % r
        base = i - d * w  # the group's first member
        u = (d + np.arange(1, r)) % r
        first = i // (w * r) * (w * r) + u * w  # the block of digit u at level k
        out.add_many(times, ranks[i], ranks[base + u * w], cut(first), cut(first + w),
                     Op.REDUCE)
    for k in reversed(range(len(levels))):  # all-gather: send what is held to the group
        r, w = levels[k], weights[k]
        times = np.array([next(rounds) for _ in range(r - 1)])
        d = i // w % r
        base = i - d * w
        u = (d + np.arange(1, r)) % r
        first = i // (w * r) * (w * r) + d * w  # the block it holds
        out.add_many(times, ranks[i], ranks[base + u * w], cut(first), cut(first + w),
                     Op.COPY)
    if extra:
        out.add_many(next(rounds), ranks[:extra], ranks[core:], lo, hi, Op.COPY)


def _near_first(members: list[int], levels: Sequence[int]) -> list[int]:
    """``members`` (in host order) placed so the first level, which moves the most, groups
    neighbouring hosts and the last, which moves the least, groups distant ones. Hosts in
    order are usually under one leaf switch in runs (a block, a rack), so on a fabric whose
    leaves meet through an oversubscribed spine only the smallest ranges cross it; where
    every host meets every other through one switch the order changes nothing."""
    core = math.prod(levels)
    strides = [math.prod(levels[:k]) for k in range(len(levels))]  # host index per digit
    weights = [math.prod(levels[k + 1:]) for k in range(len(levels))]  # position per digit
    placed = []
    for p in range(core):
        digits = [p // w % r for w, r in zip(weights, levels, strict=True)]
        placed.append(members[sum(d * s for d, s in zip(digits, strides, strict=True))])
    return placed + members[core:]


def railed_ranks(fabric: Topology, ranks: Sequence[int]) -> set[int]:
    """Indices of the ranks with a working link to a switch outside their host (a NIC on a
    rail or leaf switch; the host's own switches are named ``host/...``)."""
    out = set()
    for i, v in enumerate(ranks):
        prefix = fabric.names[v].split("/", 1)[0] + "/"
        if any(fabric.usable(k) and not fabric.is_npu(fabric.links[k].dst)
               and not fabric.names[fabric.links[k].dst].startswith(prefix)
               for k in fabric.out_links(v)):
            out.add(i)
    return out


def hop_costs(view: Topology, hosts: list[list[tuple[int, int]]], owners: list[list[int]],
              ranks: Sequence[int], nbytes: float) -> tuple[Hop, Hop]:
    """The routed cost of a send inside a host and of one along a rail, from the first host
    with two GPUs and part 0's owners (``owners_of``) on the first two hosts."""
    inside = next(h for h in hosts if len(h) > 1)
    pairs = [(ranks[inside[0][1]], ranks[inside[1][1]]),
             (ranks[owners[0][0]], ranks[owners[1][0]])]
    topo, chosen = _direct(lambda transit: route(view, set(pairs), nbytes, transit))
    costs = []
    for pair in pairs:
        link = topo.links[chosen[pair]]
        costs.append(Hop(link.alpha, 1.0 / link.bandwidth))
    return costs[0], costs[1]


@dataclass(frozen=True)
class Planned:
    """One demand's hierarchical plan before it is laid out: its hosts, rails, port costs,
    levels and slices, and its estimated time alone (``timeline``'s end)."""

    demand: Demand
    hosts: list[list[tuple[int, int]]]
    railed: set[int]
    host: Hop
    rail: Hop
    shape: Shape
    slices: Slices
    estimate: float


def shaped(fabric: Topology, demands: Sequence[Demand], relay: bool = False) -> list[Planned]:
    """Every demand's levels and slices (``best_shape``) and estimate: what ``hierarchical``
    lays out, and what other plans for the same demands are weighed against."""
    view = restrict(fabric, {r for d in demands for r in d.ranks}, relay)
    out = []
    for t, d in enumerate(demands):
        hosts = hosts_of(fabric, d.ranks)
        if hosts is None or d.collective is not Collective.ALLREDUCE or len(hosts) < 2:
            raise InputError(f"tenants[{t}]: the hierarchical plan needs an AllReduce over "
                             "several hosts with host/ names")
        railed = railed_ranks(fabric, d.ranks)
        slots, owners = owners_of(hosts, railed)
        parts = len(slots)
        owned = max(row.count(r) for row in owners for r in row)
        host, rail = hop_costs(view, hosts, owners, d.ranks, d.size / parts)
        shape, slices = best_shape(
            Shape(parts, len(hosts), max(len(m) for m in hosts), owned=owned),
            d.size / parts, host, rail, d.n, d.chunks)
        end = timeline(shape, slices.weights, d.size / parts, host, rail,
                       d.n * slices.chunks / parts).end
        out.append(Planned(replace(d, chunks=slices.chunks), hosts, railed, host, rail, shape,
                           slices, end))
    return out


def hierarchical(fabric: Topology, demands: Sequence[Demand], relay: bool = False,
                 planned: Sequence[Planned] | None = None) -> Schedule:
    """Every demand's hierarchical AllReduce, routed on ``fabric`` and simulated jointly
    (tenants that share links delay each other exactly as the simulator says). Each demand is
    cut into the slices ``slicing`` picks, with the chunks per piece it picks (at least those
    asked for, and every slice whole chunks). ``planned``: ``shaped``'s, found already."""
    view = restrict(fabric, {r for d in demands for r in d.ranks}, relay)
    if planned is None:
        planned = shaped(fabric, demands, relay)
    cols: list[np.ndarray] = []
    for t, p in enumerate(planned):
        d = p.demand
        sends = plan(d, p.hosts, p.slices.weights, p.host, p.rail, p.railed, p.shape.radices)
        rows = sends.table()
        ranks = np.asarray(d.ranks, dtype=np.int64)
        ints = rows[:, 1:].astype(np.int64)
        ints[:, 0], ints[:, 1] = ranks[ints[:, 0]], ranks[ints[:, 1]]
        cols.append(np.column_stack([np.full(len(rows), t), rows[:, 0], ints]))
    table = np.concatenate(cols)
    at = table[:, 1]
    # Steps in order of estimated start (one tenant's estimate cannot order another's).
    step = np.unique(at, return_inverse=True)[1].astype(np.int64)
    tenant, src, dst, chunk, count, op = table[:, [0, 2, 3, 4, 5, 6]].T.astype(np.int64)
    part_bytes = max(p.demand.size for p in planned) / 8  # routes are chosen for a part's range
    meta: dict[str, object] = {"engine": ENGINE,
                               "slices": [list(p.slices.weights) for p in planned],
                               "radices": [list(p.shape.radices) for p in planned]}
    return _direct(lambda transit: timed_plan(
        fabric, view, tuple(p.demand for p in planned), part_bytes, tenant, step, src, dst,
        chunk, op, count, engine=ENGINE, meta=meta, transit=transit))


def _direct(routed: Callable[[bool], T]) -> T:
    """``routed`` with every send kept off other GPUs (a rank's MSCCL send goes through
    switches): where a link is slow the cheapest path is otherwise a detour through other
    GPUs and rails, on links the plan counts as free (1.46x the noise-free time at 15% link
    noise on dgx-h100-33). Fabrics whose GPUs only meet through each other keep that path."""
    try:
        return routed(False)
    except InputError:
        return routed(True)
