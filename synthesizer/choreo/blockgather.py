"""Block-doubling AllGather and ReduceScatter for rail fabrics of many hosts.

The rail plan (``choreo.railgather``) sends every shard along its rail to every other host:
about ``ranks x hosts`` transfers, and at thousands of hosts a rank's shards from a rail are
scattered through the buffer, a transfer and an MSCCL step each (16,384 GPUs: 268 M
transfers). Here hosts double what they hold instead, as recursive doubling does, with
every transfer a contiguous range of the buffer:

* level 0: each rank sends its shard to its host mates, so every rank holds its host's
  block (the host's ranks are consecutive, so the block is contiguous);
* level k (radix ``r``): hosts form groups of ``g`` consecutive hosts, ``r`` groups to a
  super-group. Every rank holds its group's range of ``g`` blocks; rank ``(h, u)`` sends
  a piece of it (one of ``mates`` equal, contiguous parts: piece ``u`` at the first
  level, then ``piece_orders``) on its rail to ``(h', u)`` in each other group of the
  super-group, the host at the same place there, and forwards each piece it receives to
  its mates, first to the one that sends it on at the next level (``forward_orders``),
  whose rail send then waits for one forward, not for all of them. Then every rank holds
  its super-group's range.

Every NIC carries its host's inbound bytes once and evenly (the NIC bound), every byte
crosses each NVSwitch port once (the port bound), a rank talks to ``mates - 1 + sum(r - 1)``
peers, and the plan has about ``ranks x mates x levels`` transfers: 1.6 M at 16,384 GPUs.
Large pieces go in sub-pieces, so the forwards of one overlap the rail send of the next.
ReduceScatter is the same plan on reversed links, inverted in time; an AllReduce is its
ReduceScatter, then its AllGather, in one program. Sends are tagged with their start in a
per-level estimate, routed on the fabric and timed by the congestion simulator, like the
other fixed plans.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from choreo.collectives import Collective, Demand
from choreo.errors import InputError
from choreo.hierarchy import MAX_HOST_STEPS, Hop, radices
from choreo.msccl.layout import MAX_CNT
from choreo.railgather import (
    LAGS,
    hops,
    in_sequence,
    lay_out,
    paced_cuts,
    phase,
    rail_layout,
)
from choreo.schedule import Schedule
from choreo.topology import Topology

ENGINE = "block-gather"
COLLECTIVES = (Collective.ALLGATHER, Collective.REDUCESCATTER, Collective.ALLREDUCE)
# Sub-pieces a rank's rail sends of one level are cut into, at most: each costs a rail
# alpha and saves forwarding time at the level's end.
MAX_SUB_PIECES = 16
# Transfers of one phase of a demand's plan, at most, as long as every level has one piece:
# what the simulator and the verifier go through in a few seconds (about 3-5 us each).
MAX_TRANSFERS = 2_000_000


def block_layout(fabric: Topology, demand: Demand) -> list[list[int]] | None:
    """Per host, its rank indices in slot order, where the plan applies: ``rail_layout``'s
    rail fabric of one block, each host's ranks consecutive in the demand and in slot order
    (so its block of the buffer is contiguous, and piece ``u`` of it is slot ``u``'s
    shard), and a host
    count whose prime factors all make levels (``radices``). It costs 0.2 s at 16,384
    GPUs, so planning finds it once and hands it on (``hosts``, ``layouts``)."""
    if demand.collective not in COLLECTIVES:
        return None
    found = rail_layout(fabric, demand)
    if found is None or found[1] > 1:  # its levels' estimates know no spine
        return None
    hosts = found[0]
    mates = len(hosts[0])
    for h, members in enumerate(hosts):
        if members != list(range(h * mates, (h + 1) * mates)):
            return None
    if math.prod(radices(len(hosts))) != len(hosts):
        return None
    return hosts


@dataclass(frozen=True)
class Level:
    """One doubling level: its radix, the hosts per group before it, and how many
    sub-pieces each piece goes in; ``tail``: the last rail sends of its last turns instead,
    paced by both ports (``railgather.paced_cuts``, the last first)."""

    radix: int
    group: int
    subs: int
    tail: tuple[int, ...] = ()

    def turns(self, chunks: int) -> list[list[tuple[int, int]]]:
        """Each turn's rail sends of the piece, in order: (first chunk, chunks). The turns
        the tail reaches end in its pieces, and what it leaves of a turn goes in sub-pieces
        in proportion."""
        piece = self.group * chunks
        turns = [_cuts(0, piece, self.subs) for _ in range(self.radix - 1)]
        k, at = self.radix - 2, piece
        ends: list[tuple[int, int]] = []
        for size in self.tail:
            if k < 0:
                break
            first = max(0, at - size)
            ends.append((first, at - first))
            if first == 0:
                turns[k] = ends[::-1]
                ends, k, at = [], k - 1, piece
            else:
                at = first
        if k >= 0 and ends:
            turns[k] = _cuts(0, at, max(1, round(self.subs * at / piece))) + ends[::-1]
        return turns


def levels(hosts: int, mates: int, chunks: int, shard: float, host: Hop, rail: Hop,
           ranks: int, nested: bool = False, max_steps: int = MAX_HOST_STEPS) -> list[Level]:
    """The levels, smallest radix first, each with its sub-pieces: one more where it saves
    the most estimated time (a rail alpha per partner more, against the forwarding the
    plan waits for after the level's last arrival, on the NVSwitch port: at the top level
    ``mates - 1`` sends of a sub-piece; below it only the ``r`` to the next level's
    senders, which go first and let their rail sends go on) while the plan stays within
    ``MAX_TRANSFERS`` and a node's file within ``max_steps``.

    ``nested``: sub-pieces of whole shards, with every range size of the plan dividing the
    next larger one (the next finer such cut where it saves the most a transfer), so any
    two ranges a rank sends are nested or apart. A ReduceScatter (the plan inverted) needs
    that: a rank reduces into a range only once all of it, or none of it, was reduced into
    before, or its partial sums would lie in two places (its input and its scratch), which
    one MSCCL step cannot read."""
    shape: list[tuple[int, int]] = []  # (radix, hosts per group before the level)
    group = 1
    for r in sorted(radices(hosts)):
        shape.append((r, group))
        group *= r
    subs = [1] * len(shape)

    def cost(k: int, s: int) -> float:
        r, g = shape[k]
        # the forwards of a level's last arrival the plan waits for: at the top level all
        # of them; below, only those to the next level's senders, sent first (a sender
        # needs ``r`` of the level's pieces), before their rail sends go on
        waits = mates - 1 if k == len(shape) - 1 else r
        return s * (r - 1) * rail.alpha + waits * g * shard / s * host.beta

    def transfers() -> int:
        return plan_transfers([Level(r, g, n) for (r, g), n in zip(shape, subs, strict=True)],
                              mates, chunks, ranks)

    def steps() -> int:
        return host_steps([Level(r, g, n) for (r, g), n in zip(shape, subs, strict=True)],
                          mates, chunks)

    def nests(k: int, n: int) -> bool:
        """Level ``k`` cut in ``n`` sub-pieces of whole shards, with every range size of the
        plan (a shard, each level's piece and sub-piece) dividing the next larger one, so
        that any two ranges a rank sends are nested or apart."""
        size, rest = divmod(shape[k][1] * chunks, n)
        rest += size % chunks
        sizes = {chunks, size} | {g * chunks for _, g in shape}
        sizes |= {g * chunks // m for i, ((_, g), m) in enumerate(zip(shape, subs, strict=True))
                  if i != k}
        return not rest and all(b % a == 0 for a, b in itertools.pairwise(sorted(sizes)))

    while nested:  # the next finer cut that nests, where it saves the most a transfer
        moves = []
        for k, s in enumerate(subs):
            n = next((n for n in range(s + 1, MAX_SUB_PIECES + 1) if nests(k, n)), None)
            if n is not None:
                moves.append(((cost(k, s) - cost(k, n)) / (n - s), k, n))
        applied = False
        for gain, k, n in sorted(moves, reverse=True):
            if gain <= 0:
                break
            was, subs[k] = subs[k], n
            if transfers() <= MAX_TRANSFERS and steps() <= max_steps:
                applied = True
                break
            subs[k] = was
        if not applied:
            break
    while not nested:
        gains = [(cost(k, s) - cost(k, s + 1), k) for k, s in enumerate(subs)
                 if s < min(MAX_SUB_PIECES, shape[k][1] * chunks)]
        gain, k = max(gains, default=(0.0, -1))
        if gain <= 0:
            break
        subs[k] += 1
        if transfers() > MAX_TRANSFERS or steps() > max_steps:
            subs[k] -= 1
            break
    return [Level(r, g, s) for (r, g), s in zip(shape, subs, strict=True)]


def plan_transfers(levels_: Sequence[Level], mates: int, chunks: int, ranks: int) -> int:
    """Transfers of one phase: each rank's shard to its mates, and per rail send of a
    level (a sub-piece, or a piece of the paced tail) the send and its forwards."""
    sends = sum(len(turn) for lv in levels_ for turn in lv.turns(chunks))
    return ranks * (mates - 1 + sends * mates)


def host_steps(levels_: Sequence[Level], mates: int, chunks: int) -> int:
    """MSCCL steps of one host's ranks in one phase: a send and its receive per ``MAX_CNT``
    chunks of each range (as ``busiest_host_steps`` counts them), and two more a level
    where a rail send goes around the sender's own shard."""
    sends = mates - 1
    for lv in levels_:
        sends += sum(math.ceil(size / MAX_CNT) for turn in lv.turns(chunks)
                     for _, size in turn) * mates + 2
    return 2 * mates * sends


def _cuts(lo: int, size: int, parts: int) -> list[tuple[int, int]]:
    """``size`` chunks from ``lo`` in ``parts`` near-equal contiguous ranges."""
    edges = [lo + size * i // parts for i in range(parts + 1)]
    return [(a, b - a) for a, b in itertools.pairwise(edges) if b > a]


@dataclass(frozen=True)
class Send:
    """One send of every rank at once, in the per-host estimate: at level 0 the own shard to
    the mate ``turn`` slots on; at a level, a sub-piece (``lo``, ``size`` chunks into the
    piece) on the rail to the group ``turn`` on (``rail``), or the one that arrived from
    the group ``origin`` back, forwarded to the mate ``turn`` slots on."""

    at: float
    seconds: float
    level: int  # -1: level 0
    turn: int
    rail: bool = False
    origin: int = 0
    lo: int = 0
    size: int = 0


def timeline(levels_: Sequence[Level], mates: int, chunks: int, shard: float, host: Hop,
             rail: Hop) -> tuple[list[Send], float]:
    """The sends in estimated start order and the estimated end: each port serves its
    sends one after another, a level's rail sends start once the level before has ended
    (the first level's pieces are the ranks' own shards: it starts at once), and each
    arrival is forwarded to the mates as soon as the NVSwitch port is free."""
    cb = shard / chunks
    sends = [Send((turn - 1) * host.time(shard), host.time(shard), -1, turn)
             for turn in range(1, mates)]
    start, nvl_free = 0.0, (mates - 1) * host.time(shard)
    for k, lv in enumerate(levels_):
        rail_free = start
        arrivals = []
        for turn, pieces in enumerate(lv.turns(chunks), start=1):
            for lo, size in pieces:
                secs = rail.time(size * cb)
                sends.append(Send(rail_free, secs, k, turn, True, 0, lo, size))
                arrivals.append((rail_free + secs, turn, lo, size))
                rail_free += secs
        for at, turn, lo, size in arrivals:
            secs = host.time(size * cb)
            t = max(nvl_free, at)
            for step in range(1, mates):
                sends.append(Send(t, secs, k, step, False, turn, lo, size))
                t += secs
            nvl_free = t
        start = max(nvl_free, rail_free)
    return sends, start


def plan(demand: Demand, hosts: list[list[int]], host: Hop, rail: Hop,
         reduced: bool = False) -> np.ndarray:
    """AllGather sends in rank space: rows of (estimated start, estimated seconds, src
    rank, dst rank, first chunk, chunk count); ``reduced``: with the levels of a
    ReduceScatter (``phase`` inverts it). Every host runs the same timeline."""
    mates, nh, c = len(hosts[0]), len(hosts), demand.chunks
    ranks = np.asarray(hosts, dtype=np.int64)  # [host, slot] -> rank index
    h_idx = np.arange(nh)
    times: list[tuple[float, float, int]] = []
    cols: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []

    def add(at: float, secs: float, src: np.ndarray, dst: np.ndarray, lo: np.ndarray,
            count: int | np.ndarray) -> None:
        times.append((at, secs, len(src)))
        cols.append((src, dst, lo, np.broadcast_to(count, len(src))))

    def add_around_own(at: float, secs: float, src: np.ndarray, dst: np.ndarray,
                       lo: np.ndarray, count: int) -> None:
        """A range that may hold the sender's own shard, in up to three sends: a rank
        reads its own shard from its input buffer and the rest from its output (an
        AllReduce's whole range lies in one buffer, so it goes in one send)."""
        if whole:
            add(at, secs, src, dst, lo, count)
            return
        hi = lo + count
        own_lo, own_hi = np.clip(src * c, lo, hi), np.clip(src * c + c, lo, hi)
        for a, b in ((lo, own_lo), (own_lo, own_hi), (own_hi, hi)):
            keep = b > a
            if keep.any():
                add(at, secs, src[keep], dst[keep], a[keep], (b - a)[keep])

    whole = demand.collective is Collective.ALLREDUCE
    lvs, sends, _ = _timeline_of(demand, hosts, host, rail, reduced)
    order = piece_orders(tuple(lv.radix for lv in lvs), mates)
    for x in sends:
        if x.level < 0:
            for u in range(mates):
                add(x.at, x.seconds, ranks[:, u], ranks[:, (u + x.turn) % mates],
                    ranks[:, u] * c, c)
            continue
        lv = lvs[x.level]
        g, r, piece = lv.group, lv.radix, lv.group * c
        digit = (h_idx // g) % r
        sigma = order[x.level]
        if x.rail:  # piece sigma[u] of the own group's range to the group ``turn`` on
            peer = h_idx + (((digit + x.turn) % r) - digit) * g
            for u in range(mates):
                first = (h_idx // g) * g * mates * c + sigma[u] * piece + x.lo
                add_around_own(x.at, x.seconds, ranks[:, u], ranks[peer, u], first, x.size)
        else:  # what came from the group ``origin`` back, to a mate (``forward_orders``)
            origin = h_idx + (((digit - x.origin) % r) - digit) * g
            last = x.level + 1 == len(lvs)  # nobody sends it on: ``turn`` slots on
            table = None if last else forward_orders(mates, r, sigma, order[x.level + 1])
            for u in range(mates):
                first = (origin // g) * g * mates * c + sigma[u] * piece + x.lo
                mate = (np.full(nh, (u + x.turn) % mates) if table is None
                        else table[(digit - x.origin) % r, x.turn - 1, u])
                add(x.at, x.seconds, ranks[:, u], ranks[h_idx, mate], first, x.size)
    counts = [n for _, _, n in times]
    out = np.empty((sum(counts), 6), order="F")  # filled, and read, a column at a time
    out[:, 0] = np.repeat([at for at, _, _ in times], counts)
    out[:, 1] = np.repeat([secs for _, secs, _ in times], counts)
    for k in range(4):
        out[:, 2 + k] = np.concatenate([c[k] for c in cols])
    return out


def next_piece(group: int, piece: int, mates: int, radix: int) -> int:
    """The next level's piece that holds piece ``piece`` of group ``group`` of a level of
    radix ``radix``: the super-group's range is its groups' ranges in order, cut in
    ``mates`` pieces again."""
    return (group * mates + piece) // radix


@functools.cache
def piece_orders(radices_: tuple[int, ...], mates: int) -> tuple[tuple[int, ...], ...]:
    """Per level, the piece each slot sends (``sigma[u]``): the identity at the first level
    (a rank's own shard), then where it can be, a permutation under which no rank sends at
    the next level a range holding the piece it received itself. Inverted, as the
    ReduceScatter is, such a rank would reduce the next level's rail arrival and its mates'
    partial sums into one range, one after the other, on the critical path at every level."""
    orders = [tuple(range(mates))]
    for k in range(1, len(radices_)):
        prev, r = orders[-1], radices_[k - 1]
        cost = [[int(any(next_piece(j, prev[u], mates, r) == v for j in range(r)))
                 for v in range(mates)] for u in range(mates)]
        orders.append(tuple(_assignment(cost)))
    return tuple(orders)


@functools.cache
def forward_orders(mates: int, radix: int, sigma: tuple[int, ...],
                   nxt: tuple[int, ...]) -> np.ndarray:
    """Per group of the super-group and turn, the mate each slot forwards a piece from that
    group to (slot ``u`` received piece ``sigma[u]``; at the next level slot ``w`` sends
    piece ``nxt[w]``): every turn a derangement of the slots (each port sends one piece and
    receives one), together every mate once, and the mate that sends the piece on at the
    next level as early as the turns allow, so its rail send waits for about one forward
    and not for ``mates - 1``."""
    sender = {v: w for w, v in enumerate(nxt)}
    out = np.zeros((radix, mates - 1, mates), dtype=np.int64)
    for j in range(radix):
        needed = [sender[next_piece(j, sigma[u], mates, radix)] for u in range(mates)]
        free = [[v != u for v in range(mates)] for u in range(mates)]
        for t in range(mates - 1):
            cost = [[(0 if v == needed[u] else 1) if free[u][v] else mates * mates
                     for v in range(mates)] for u in range(mates)]
            to = _assignment(cost)
            for u, v in enumerate(to):
                free[u][v] = False
            out[j, t] = to
    out.setflags(write=False)  # cached: shared by every caller
    return out


def _assignment(cost: list[list[int]]) -> list[int]:
    """A least-cost perfect assignment of rows to columns (the Hungarian method, with
    potentials): ``result[row]`` is its column."""
    n = len(cost)
    inf = float("inf")
    u, v = [0.0] * (n + 1), [0.0] * (n + 1)
    match, way = [0] * (n + 1), [0] * (n + 1)  # match[col]: its row (1-based)
    for row in range(1, n + 1):
        match[0], col0 = row, 0
        least, used = [inf] * (n + 1), [False] * (n + 1)
        while match[col0]:
            used[col0] = True
            r0, delta, col1 = match[col0], inf, 0
            for col in range(1, n + 1):
                if not used[col]:
                    cur = cost[r0 - 1][col - 1] - u[r0] - v[col]
                    if cur < least[col]:
                        least[col], way[col] = cur, col0
                    if least[col] < delta:
                        delta, col1 = least[col], col
            for col in range(n + 1):
                if used[col]:
                    u[match[col]] += delta
                    v[col] -= delta
                else:
                    least[col] -= delta
            col0 = col1
        while col0:
            col1 = way[col0]
            match[col0] = match[col1]
            col0 = col1
    result = [0] * n
    for col in range(1, n + 1):
        result[match[col] - 1] = col - 1
    return result


def phases(demand: Demand) -> tuple[bool, ...]:
    """The plan's phases in order, each reduced (a ReduceScatter) or not (an AllGather)."""
    if demand.collective is Collective.ALLREDUCE:
        return (True, False)
    return (demand.collective is Collective.REDUCESCATTER,)


def block_transfers(demand: Demand, hosts: list[list[int]]) -> int:
    """Transfers the plan for ``demand`` on ``hosts`` (``block_layout``'s) has at least
    (one piece a level): per phase, each rank's shard to its mates, and a level's rail
    send and its forwards per partner group."""
    mates = len(hosts[0])
    per_phase = demand.n * (mates - 1 + mates * sum(r - 1 for r in radices(len(hosts))))
    return per_phase * len(phases(demand))


def estimate(fabric: Topology, demand: Demand, hosts: list[list[int]],
             costs: tuple[Hop, Hop] | None = None) -> float:
    """The plan's estimated time for ``demand`` alone on ``hosts`` (``block_layout``'s):
    its phases one after the other. ``costs``: ``hops``'s, found already."""
    host, rail = costs or hops(fabric, demand.ranks)
    return sum(_timeline_of(demand, hosts, host, rail, reduced)[2]
               for reduced in phases(demand))


def _timeline_of(demand: Demand, hosts: list[list[int]], host: Hop, rail: Hop,
                 reduced: bool) -> tuple[list[Level], list[Send], float]:
    """One phase's levels (nested sub-pieces where ``reduced``), sends and estimated
    end."""
    mates, c = len(hosts[0]), max(1, demand.chunks)
    shard = demand.size / demand.n
    # An AllReduce's two phases share its node's file: half the budget each, where one
    # piece a level fits in half (thousands of hosts: it does not, and the file goes over
    # one ConfigMap as plain text whatever the pieces, so each phase takes what it saves)
    budget = MAX_HOST_STEPS // len(phases(demand))
    lvs = levels(len(hosts), mates, c, shard, host, rail, demand.n, reduced, budget)
    if host_steps(lvs, mates, c) > budget:
        lvs = levels(len(hosts), mates, c, shard, host, rail, demand.n, reduced)
    if not reduced:
        lvs = _paced_top(lvs, mates, c, shard, host, rail, demand.n,
                         max(budget, host_steps(lvs, mates, c)))
    sends, end = timeline(lvs, mates, c, shard, host, rail)
    return lvs, sends, end


def _paced_top(lvs: list[Level], mates: int, chunks: int, shard: float, host: Hop, rail: Hop,
               ranks: int, max_steps: int) -> list[Level]:
    """The levels with the top level's last rail sends paced by both ports where that ends
    the estimate sooner (``railgather.paced_cuts``: the forwards of the last arrival are
    what the plan ends with), within ``MAX_TRANSFERS`` and ``max_steps``. Not for a
    ReduceScatter, whose sub-pieces must nest."""
    top = lvs[-1]
    piece = top.group * chunks
    whole = (mates - 1) * host.time(piece * shard / chunks)
    best, end = lvs, timeline(lvs, mates, chunks, shard, host, rail)[1]
    seen: set[tuple[int, ...]] = set()
    for lag in LAGS:
        tail = paced_cuts([piece] * (top.radix - 1), mates, shard / chunks, host, rail,
                          lag * whole)
        if not tail or tail in seen:
            continue
        seen.add(tail)
        paced = [*lvs[:-1], replace(top, tail=tail)]
        if plan_transfers(paced, mates, chunks, ranks) > MAX_TRANSFERS or \
                host_steps(paced, mates, chunks) > max_steps:
            continue
        t = timeline(paced, mates, chunks, shard, host, rail)[1]
        if t < end * (1 - 1e-9):
            best, end = paced, t
    return best


def block_gather(fabric: Topology, demands: Sequence[Demand],
                 layouts: Sequence[list[list[int]] | None] | None = None,
                 costs: Sequence[tuple[Hop, Hop]] | None = None) -> Schedule:
    """Every demand's block-doubling plan, routed on ``fabric`` and simulated jointly, as
    the rail plan is (``railgather.lay_out``); ``layouts`` and ``costs``: ``block_layout``'s
    and ``hops``'s, found already (each costs a pass over the ranks' links)."""
    if layouts is None:
        layouts = [block_layout(fabric, d) for d in demands]
    planned: list[Demand] = []
    rows: list[np.ndarray] = []
    for t, (d, hosts) in enumerate(zip(demands, layouts, strict=True)):
        if hosts is None:
            raise InputError(f"tenants[{t}]: the block plan needs an AllGather, "
                             "ReduceScatter or AllReduce over hosts alike on rails, each "
                             "host's ranks consecutive")
        host, rail = costs[t] if costs else hops(fabric, d.ranks)
        d = replace(d, chunks=max(1, d.chunks))
        planned.append(d)
        parts = [phase(plan(d, hosts, host, rail, reduced), reduced) for reduced in phases(d)]
        rows.append(in_sequence([(part, float((part[:, 0] + part[:, 1]).max()))
                                 for part in parts]))
    return lay_out(fabric, planned, rows, ENGINE, {"engine": ENGINE})
