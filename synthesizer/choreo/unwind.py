"""Switches as point-to-point links, so a link-chunk matcher (TACOS) can schedule them.

A switch lets any attached NPU talk to any other, but only as fast as its port. ``unwind``
replaces each switch -- or each connected group of switches, e.g. a leaf/spine fabric -- by
logical NPU->NPU links in a circulant pattern of degree d: every member NPU gets d out-links
and d in-links. Logical links ride on physical ones; ``via`` lists the physical link indices
in the ORIGINAL topology (up-port, switch-to-switch hops, down-port), ``alpha`` is the sum of
their alphas and ``kind`` is the up-port's kind. Node ids are unchanged: switches stay in
``kinds`` with no links left, direct NPU-NPU links are kept with ``via=(own index,)``.

Bandwidth rule. Each physical link's bandwidth is split evenly among the logical links routed
over it, and a logical link gets the smallest such share along its path. On one switch with
uniform ports that is ``min(up, down) / d``: each NPU's logical egress adds up to its port.
``circuits`` is the opposite view, used by baselines: one logical link per pair of NPUs on a
common switch group, each at the full bandwidth of its path, as if it took the ports
exclusively. Hence the rule every consumer applies (see ``is_fractional``):

    a logical link whose bandwidth is below the minimum of its ``via`` links is a
    *fractional share* (it can run concurrently with its port-mates); otherwise it is a
    *circuit* (it excludes every other link that shares one of its ``via`` links).

A logical link that splits some physical link with others is always a share: where its
share equals its slowest link (a port it has alone, behind an oversubscribed uplink it
splits), its bandwidth is set ``SHARED_GAP`` below, or it would pass for a circuit holding
the uplink exclusively while its port-mates use it too.

Failures: members are the live NPUs with a usable port into the group in each direction,
and routes use only usable links, so every logical link is healthy; unwinding a fabric after
``transforms`` re-spreads the circulant over the survivors.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cache

from choreo.errors import InputError
from choreo.topology import Link, NodeKind, Topology

SHARED_GAP = 1e-6  # relative; well above the 1e-9 that tells shares from circuits


@dataclass(frozen=True)
class SwitchGroup:
    """Switches joined by switch-to-switch links, and the NPUs that can use them."""

    switches: tuple[int, ...]
    members: tuple[int, ...]


# ---- circulant offsets -------------------------------------------------------------------
def _distances(m: int, offsets: Sequence[int]) -> list[int]:
    """Hop distance from 0 to every residue in the Cayley graph of Z_m with these offsets."""
    dist = [-1] * m
    dist[0] = 0
    queue = deque([0])
    while queue:
        v = queue.popleft()
        for s in offsets:
            w = (v + s) % m
            if dist[w] < 0:
                dist[w] = dist[v] + 1
                queue.append(w)
    return dist


def _fill(m: int, chosen: list[int], d: int) -> tuple[int, ...]:
    seen: list[int] = []
    for s in chosen:
        s %= m
        if s and s not in seen:
            seen.append(s)
    extra = (s for s in range(1, m) if s not in seen)
    while len(seen) < d:
        seen.append(next(extra))
    return tuple(seen[:d])


@cache
def circulant_offsets(m: int, d: int) -> tuple[int, ...]:
    """The ``d`` offsets (out of 1..m-1) of a low-diameter circulant on ``m`` NPUs.

    TACOS unwinds with consecutive offsets 1..d: diameter ceil((m-1)/d), 32 hops for m=64,
    d=2. Mixed-radix offsets 1, b, b^2, ... with b = ceil(m^(1/d)) reach every residue in at
    most d*(b-1) hops (write it with d base-b digits): 14 hops for m=64, d=2. Balanced
    offsets +-1, +-b, ... do better again when d is even. Every choice gives each NPU the
    same d links of bandwidth port/d, so the bandwidth bound of a collective is unchanged and
    fewer hops only cut latency. We build these candidates, measure their exact diameter (a
    BFS on Z_m; a circulant is vertex-transitive, so one source suffices) and keep the one
    with the lowest (diameter, mean distance), ties to the earlier candidate.
    """
    if m < 2:
        return ()
    d = max(1, min(d, m - 1))
    candidates = [_fill(m, list(range(1, d + 1)), d)]
    b = 2
    while b**d < m:
        b += 1
    candidates.append(_fill(m, [b**k for k in range(d) if b**k < m], d))
    half = d // 2
    if half:
        c = 2
        while (2 * (c // 2) + 1) ** half < m and c < m:
            c += 1
        sym: list[int] = []
        for k in range(half):
            sym += [c**k, -(c**k)]
        if d % 2:
            sym.append(m // 2)
        candidates.append(_fill(m, sym, d))
        candidates.append(_fill(m, [x for k in range(1, half + 1) for x in (k, -k)] + [m // 2], d))

    def score(offsets: tuple[int, ...]) -> tuple[int, int]:
        dist = _distances(m, offsets)
        return (max(dist) if min(dist) >= 0 else m, sum(dist))

    return min(candidates, key=score)


def default_degree(m: int) -> int:
    """ceil(log2 m), capped at m-1: diameter ~log m while each link keeps a useful share."""
    return max(1, min(m - 1, math.ceil(math.log2(m)))) if m > 1 else 0


def candidate_degrees(m: int, max_degree: int = 16) -> list[int]:
    """Degrees worth trying for a switch with ``m`` members: 1, 2, 4, ... and m-1 (full
    mesh of 1/(m-1) shares), all capped at ``max_degree`` to bound the link count."""
    if m < 2:
        return []
    out, d = [], 1
    while d < m - 1 and d <= max_degree:
        out.append(d)
        d *= 2
    if m - 1 <= max_degree:
        out.append(m - 1)
    return out


# ---- switch groups -----------------------------------------------------------------------
def switch_groups(topo: Topology) -> list[SwitchGroup]:
    """Connected groups of switches (over any switch-switch links) with their member NPUs."""
    is_switch = [k is NodeKind.SWITCH for k in topo.kinds]
    group_of: dict[int, int] = {}
    groups: list[list[int]] = []
    for s in topo.switches:
        if s in group_of:
            continue
        group_of[s] = len(groups)
        comp, stack = [s], [s]
        while stack:
            v = stack.pop()
            for i in (*topo.out_links(v), *topo.in_links(v)):
                link = topo.links[i]
                w = link.dst if link.src == v else link.src
                if is_switch[w] and w not in group_of:
                    group_of[w] = group_of[s]
                    comp.append(w)
                    stack.append(w)
        groups.append(sorted(comp))
    out = []
    for switches in groups:
        ups = {
            topo.links[i].src
            for s in switches
            for i in topo.in_links(s)
            if topo.usable(i) and topo.is_npu(topo.links[i].src)
        }
        downs = {
            topo.links[i].dst
            for s in switches
            for i in topo.out_links(s)
            if topo.usable(i) and topo.is_npu(topo.links[i].dst)
        }
        members = tuple(sorted(v for v in ups & downs if v not in topo.failed))
        out.append(SwitchGroup(tuple(switches), members))
    return out


class _Router:
    """Shortest (fewest-hop) paths through one group, spreading load over parallel choices."""

    def __init__(self, topo: Topology, group: SwitchGroup) -> None:
        self.topo = topo
        self.inside = set(group.switches)
        self.load: Counter[int] = Counter()
        self._dist: dict[int, dict[int, int]] = {}

    def _usable(self, i: int) -> bool:
        return self.topo.usable(i)

    def _to(self, q: int) -> dict[int, int]:
        """Hops from each group switch to a switch with a usable down-port to ``q``."""
        if q not in self._dist:
            topo = self.topo
            dist: dict[int, int] = {}
            queue: deque[int] = deque()
            for i in topo.in_links(q):
                s = topo.links[i].src
                if s in self.inside and self._usable(i) and s not in dist:
                    dist[s] = 0
                    queue.append(s)
            while queue:
                t = queue.popleft()
                for i in topo.in_links(t):
                    s = topo.links[i].src
                    if s in self.inside and s not in dist and self._usable(i):
                        dist[s] = dist[t] + 1
                        queue.append(s)
            self._dist[q] = dist
        return self._dist[q]

    def _least(self, options: list[int]) -> int:
        links = self.topo.links
        return min(options, key=lambda i: ((self.load[i] + 1) / links[i].bandwidth, i))

    def route(self, p: int, q: int, count: bool = True) -> tuple[int, ...] | None:
        topo, dist = self.topo, self._to(q)
        ups = [i for i in topo.out_links(p) if topo.links[i].dst in dist and self._usable(i)]
        if not ups:
            return None
        best = min(dist[topo.links[i].dst] for i in ups)
        path = [self._least([i for i in ups if dist[topo.links[i].dst] == best])]
        s = topo.links[path[0]].dst
        while dist[s] > 0:
            step = [
                i
                for i in topo.out_links(s)
                if dist.get(topo.links[i].dst, -1) == dist[s] - 1 and self._usable(i)
            ]
            path.append(self._least(step))
            s = topo.links[path[-1]].dst
        path.append(
            self._least(
                [i for i in topo.out_links(s) if topo.links[i].dst == q and self._usable(i)]
            )
        )
        if count:
            self.load.update(path)
        return tuple(path)


# ---- unwinding ---------------------------------------------------------------------------
def _direct_links(topo: Topology) -> list[Link]:
    """NPU-NPU links survive unchanged; a physical one learns its own index as ``via``."""
    return [
        link if link.via else replace(link, via=(i,))
        for i, link in enumerate(topo.links)
        if topo.is_npu(link.src) and topo.is_npu(link.dst)
    ]


def _logical(topo: Topology, p: int, q: int, path: tuple[int, ...], bandwidth: float) -> Link:
    first = topo.links[path[0]]
    alpha = sum(topo.links[i].alpha for i in path)
    return Link(p, q, alpha, bandwidth, first.kind, True, path)


def unwind(topo: Topology, degree: int | None = None) -> Topology:
    """Replace every switch group by a degree-``degree`` circulant of fractional-share links.

    ``degree=None`` uses ``default_degree`` per group; a degree above m-1 is capped at m-1.
    """
    if degree is not None and (isinstance(degree, bool) or degree < 1):
        raise InputError(f"unwind degree: must be a positive integer, got {degree!r}")
    links = _direct_links(topo)
    for group in switch_groups(topo):
        m = len(group.members)
        if m < 2:
            continue
        d = min(degree if degree is not None else default_degree(m), m - 1)
        router = _Router(topo, group)
        plan = []
        for pos, p in enumerate(group.members):
            for off in circulant_offsets(m, d):
                q = group.members[(pos + off) % m]
                path = router.route(p, q)
                if path is not None:
                    plan.append((p, q, path))
        for p, q, path in plan:
            share = min(topo.links[i].bandwidth / router.load[i] for i in path)
            if any(router.load[i] > 1 for i in path):  # it splits a link: always a share
                share = min(share, _min_bw(topo, path) * (1 - SHARED_GAP))
            links.append(_logical(topo, p, q, path, share))
    suffix = f"unwound-d{degree}" if degree is not None else "unwound"
    return replace(topo, links=tuple(links), name=f"{topo.name}/{suffix}")


def circuits(topo: Topology) -> Topology:
    """Full-bandwidth circuits between every pair of NPUs on a common switch group.

    Used by baselines (Direct, Ring over a switch): a circuit's bandwidth is the minimum of its
    ``via`` links, and it holds those links exclusively while it transfers.
    """
    links = _direct_links(topo)
    for group in switch_groups(topo):
        router = _Router(topo, group)
        for p in group.members:
            for q in group.members:
                if p == q:
                    continue
                path = router.route(p, q)
                if path is not None:
                    links.append(_logical(topo, p, q, path, _min_bw(topo, path)))
    return replace(topo, links=tuple(links), name=f"{topo.name}/circuits")


def _min_bw(topo: Topology, path: Sequence[int]) -> float:
    return min(topo.links[i].bandwidth for i in path)


def is_fractional(parent: Topology, link: Link, rel_tol: float = 1e-9) -> bool:
    """True if ``link`` (logical, ``via`` into ``parent``) is a fractional share of its path."""
    if not link.via:
        return False
    return link.bandwidth < _min_bw(parent, link.via) * (1 - rel_tol)


def hop_diameter(topo: Topology, npus: Sequence[int] | None = None) -> int:
    """Largest fewest-hop distance between live NPUs over usable links (-1 if disconnected)."""
    targets = list(topo.npus if npus is None else npus)
    succ = [
        [topo.links[i].dst for i in topo.out_links(v) if topo.usable(i)]
        for v in range(topo.num_nodes)
    ]
    worst = 0
    for s in targets:
        dist = {s: 0}
        queue = deque([s])
        while queue:
            v = queue.popleft()
            for w in succ[v]:
                if w not in dist:
                    dist[w] = dist[v] + 1
                    queue.append(w)
        if any(t not in dist for t in targets):
            return -1
        worst = max(worst, *(dist[t] for t in targets))
    return worst
