"""The sends each NCCL algorithm makes, per channel, as (source GPU, destination GPU, bytes).

Volumes are NCCL's: a ring AllReduce channel carrying ``S/C`` sends ``2(n-1)/n * S/C`` over
each ring hop; a tree channel sends ``S/C`` up and ``S/C`` down every tree edge; NVLS moves
each GPU's buffer up to the switch once and the reduced result down once (plus the GPU's own
``1/n`` slice each way, the ``multimem`` load-reduce and store it issues); PAT (Bruck-like)
doubles the distance and the data every step; AllToAll goes through PXN: to the local GPU
on the destination's rail over NVLink, then across that rail.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np

from choreo.collectives import Collective, Demand
from choreo.nccl.channels import NVLS_CHANNELS, Channels
from choreo.nccl.fabric import NcclFabric
from choreo.nccl.tuning import NVLS, NVLS_TREE, P2P, PAT, RING, TREE

C = Collective


@dataclass
class Sends:
    src: list[np.ndarray] = field(default_factory=list)
    dst: list[np.ndarray] = field(default_factory=list)
    nbytes: list[np.ndarray] = field(default_factory=list)
    direct: dict[int, float] = field(default_factory=dict)  # link id -> bytes (switch ports)
    steps: list[list[tuple[int, int]]] = field(default_factory=list)  # latency path, per step

    def add(self, src: object, dst: object, nbytes: object) -> None:
        s, d, b = np.broadcast_arrays(np.asarray(src, dtype=np.int64),
                                      np.asarray(dst, dtype=np.int64),
                                      np.asarray(nbytes, dtype=float))
        self.src.append(s.ravel())
        self.dst.append(d.ravel())
        self.nbytes.append(b.ravel())

    def columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if not self.src:
            z = np.zeros(0, dtype=np.int64)
            return z, z, np.zeros(0)
        return np.concatenate(self.src), np.concatenate(self.dst), np.concatenate(self.nbytes)


def sends(fab: NcclFabric, ch: Channels, d: Demand, algorithm: str) -> Sends:
    """Every send of ``algorithm`` for demand ``d`` over all channels."""
    out = Sends()
    s = float(d.size)
    n = fab.n_ranks
    c = d.collective
    if algorithm == RING:
        _ring(out, ch, d, s, n)
    elif algorithm == TREE:
        _tree(out, ch, s)
    elif algorithm == NVLS:
        _nvls(out, fab, c, s)
    elif algorithm == NVLS_TREE:
        _nvls(out, fab, c, s)
        _nvls_tree(out, fab, ch, s)
    elif algorithm == PAT:
        _pat(out, fab, s)
    elif algorithm == P2P:
        _p2p(out, fab, d)
    else:
        raise ValueError(f"unknown algorithm {algorithm}")
    return out


def _ring(out: Sends, ch: Channels, d: Demand, s: float, n: int) -> None:
    c = d.collective
    per = s / ch.n_channels
    root = d.ranks[d.root]
    for k, order in enumerate(ch.rings):
        o = np.asarray(order)
        if c in (C.BROADCAST, C.REDUCE):  # a chain that starts (ends) at the root
            at = int(np.flatnonzero(o == root)[0])
            o = np.roll(o, -at)
            a, b = (o[:-1], o[1:]) if c is C.BROADCAST else (o[1:][::-1], o[:-1][::-1])
            out.add(a, b, per)
            if k == 0:
                out.steps = [[(int(x), int(y))] for x, y in zip(a, b, strict=True)]
            continue
        share = 2 * (n - 1) / n if c is C.ALLREDUCE else (n - 1) / n
        nxt = np.roll(o, -1)
        out.add(o, nxt, per * share)
        if k == 0:
            hops = list(zip(o.tolist(), nxt.tolist(), strict=True))
            rounds = 2 * (n - 1) if c is C.ALLREDUCE else n - 1
            # every step crosses one hop of the ring; over the pass each hop is crossed
            # rounds / n times: take the hops in ring order, wrapping around
            out.steps = [[hops[i % n]] for i in range(rounds)]


def _tree(out: Sends, ch: Channels, s: float) -> None:
    per = s / ch.n_channels
    for k, parent in enumerate(ch.tree_parent):
        kids = np.array([g for g, p in parent.items() if p >= 0], dtype=np.int64)
        ups = np.array([parent[g] for g in kids.tolist()], dtype=np.int64)
        out.add(kids, ups, per)  # reduce up
        out.add(ups, kids, per)  # broadcast down
        if k == 0:
            path = _deepest(parent)
            up = list(itertools.pairwise(path))
            out.steps = [[h] for h in up] + [[(b, a)] for a, b in reversed(up)]


def _deepest(parent: dict[int, int]) -> list[int]:
    """The longest leaf-to-root path of a tree, leaf first."""
    best: list[int] = []
    for g in parent:
        path = [g]
        while parent[path[-1]] >= 0:
            path.append(parent[path[-1]])
        if len(path) > len(best):
            best = path
    return best


def _switch_ports(fab: NcclFabric, g: int, sw: int) -> tuple[list[int], list[int]]:
    topo = fab.topo
    up = [i for i in topo.out_links(g) if topo.links[i].dst == sw and topo.usable(i)]
    down = [i for i in topo.in_links(g) if topo.links[i].src == sw and topo.usable(i)]
    return up, down


def _spread(out: Sends, fab: NcclFabric, links: list[int], nbytes: float) -> None:
    """Bytes over parallel ports in proportion to their bandwidth."""
    total = sum(fab.topo.links[i].bandwidth for i in links)
    for i in links:
        out.direct[i] = out.direct.get(i, 0.0) + nbytes * fab.topo.links[i].bandwidth / total


def _nvls(out: Sends, fab: NcclFabric, c: Collective, s: float) -> None:
    """multimem.ld_reduce reads every GPU's buffer through the switch and returns each GPU
    its reduced 1/n slice; multimem.st multicasts each slice to every GPU."""
    for h in fab.hosts:
        assert h.switch is not None
        p = h.ppn
        if c is C.ALLREDUCE:
            up_b, down_b = s + s / p, s / p + s
        elif c is C.REDUCESCATTER:
            up_b, down_b = s, s / p
        else:  # AllGather
            up_b, down_b = s / p, s
        for g in h.gpus:
            up, down = _switch_ports(fab, g, h.switch)
            _spread(out, fab, up, up_b)
            _spread(out, fab, down, down_b)
        if not out.steps:
            g = h.gpus[0]
            out.steps = [[(g, h.switch)], [(h.switch, g)]] * (2 if c is C.ALLREDUCE else 1)


def _nvls_tree(out: Sends, fab: NcclFabric, ch: Channels, s: float) -> None:
    """Between nodes NVLSTree runs a tree per NVLS channel over the heads' NICs (the channels'
    trees); a head feeds what it receives into the switch and takes what it sends out of it."""
    per = s / NVLS_CHANNELS
    host_of = {g: k for k, h in enumerate(fab.hosts) for g in h.gpus}
    tree_steps: list[list[tuple[int, int]]] = []
    for c in range(NVLS_CHANNELS):
        parent = ch.tree_parent[c % len(ch.tree_parent)]
        for g, up in parent.items():
            if up < 0 or host_of[g] == host_of[up]:
                continue
            out.add([g, up], [up, g], per)
            if not tree_steps:
                tree_steps = [[(g, up)], [(up, g)]]
            for x in (g, up):
                sw = fab.hosts[host_of[x]].switch
                if sw is not None:
                    ports_up, ports_down = _switch_ports(fab, x, sw)
                    _spread(out, fab, ports_up, per)
                    _spread(out, fab, ports_down, per)
    out.steps = out.steps[:2] + tree_steps + out.steps[2:]


def _pat(out: Sends, fab: NcclFabric, s: float) -> None:
    """Bruck-style AllGather (ReduceScatter runs it backwards): step k sends min(2^k, n-2^k)
    pieces to the rank 2^k away."""
    r = np.asarray(fab.ranks)
    n = len(r)
    dist = 1
    steps = []
    while dist < n:
        pieces = min(dist, n - dist)
        out.add(r, np.roll(r, -dist), pieces * s / n)
        steps.append([(int(r[0]), int(r[dist]))])
        dist *= 2
    out.steps = steps


def _p2p(out: Sends, fab: NcclFabric, d: Demand) -> None:
    """Gather/Scatter: the root exchanges each rank's piece directly; AllToAll: every pair,
    through PXN where the destination's host has a NIC on a rail the source's host also has."""
    r = np.asarray(d.ranks)
    n = len(r)
    s = float(d.size)
    root = d.ranks[d.root]
    if d.collective is C.GATHER:
        out.add(r[r != root], root, s / n)
        out.steps = [[(int(r[r != root][0]), root)]]
        return
    if d.collective is C.SCATTER:
        out.add(root, r[r != root], s / n)
        out.steps = [[(root, int(r[r != root][0]))]]
        return
    pair = d.volume / (n * n)
    nn = fab.topo.num_nodes
    host_of = np.full(nn, -1, dtype=np.int64)
    for k, h in enumerate(fab.hosts):
        host_of[list(h.gpus)] = k
    a, b = np.meshgrid(r, r, indexing="ij")
    off = a != b
    a, b = a[off], b[off]
    relay = a.copy()
    if fab.has_nics:
        rails = sorted({nic.rail for h in fab.hosts for nic in h.nics})
        col = {rail: i for i, rail in enumerate(rails)}
        table = np.full((fab.n_nodes, len(rails)), -1, dtype=np.int64)
        for k, h in enumerate(fab.hosts):
            for nic in h.nics:
                table[k, col[nic.rail]] = nic.gpu
        dest_rail = np.full(nn, -1, dtype=np.int64)
        for h in fab.hosts:
            dest_rail[list(h.gpus)] = col[h.nics[0].rail]  # no NIC: the host's first one
            for nic in h.nics:
                dest_rail[nic.gpu] = col[nic.rail]
        cross = host_of[a] != host_of[b]
        via = table[host_of[a], dest_rail[b]]
        use = cross & (via >= 0)
        relay[use] = via[use]
    hop = relay != a
    out.add(np.concatenate([a[hop], relay]), np.concatenate([relay[hop], b]), pair)
    out.steps = [[(int(a[0]), int(relay[0]))], [(int(relay[0]), int(b[0]))]]
