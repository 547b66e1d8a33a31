"""NCCL's channels on a fabric: the graph search's channel count and bandwidth, the rings and
trees it connects (``src/graph/search.cc``, ``connect.cc``, ``trees.cc``).

* **Search**: NCCL tries per-channel speeds from a fixed list, fastest first, and keeps the
  one that gives the most bandwidth (channels x speed) the links allow, going no lower than
  half the speed of the first solution; rings inside a node
  share each GPU's NVLink bandwidth, rings across nodes take one NIC in and one out each.
  Fast graphs are then doubled (``ncclTopoDupChannels``) and ``connectRings`` doubles the
  result again at run time: 8 rings become 16 channels on a multi-node H100 system.
* **Rings**: one ring per NIC: ring 2k enters a node through NIC 2k and leaves through NIC
  2k+1, ring 2k+1 the other way round; odd nodes swap the two, so the hop between
  neighbouring nodes stays on one rail. Inside an NVSwitch node the order is free; on direct
  NVLink the search follows the links (a Hamiltonian cycle here).
* **Trees**: the same channels: a chain through the node starting at the channel's NIC GPU,
  and between nodes NCCL's double binary tree, tree 0 on the first half of the channels and
  tree 1 on their run-time copies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from choreo.baselines import dtree_parents
from choreo.nccl.fabric import Host, NcclFabric
from choreo.nccl.tuning import NVLS, NVLS_TREE, PAT, RING, TREE, Graph

SPEED_INTRA = (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0)
SPEED_INTER = (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0,
               3.0, 2.4, 1.2, 0.24, 0.12)
SM90_SPEED_INTRA = (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0)
SM90_SPEED_INTER = (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0,
                    2.4, 1.2, 0.24, 0.12)
SEARCH_MAX_CHANNELS = 16  # MAXCHANNELS / 2
MAX_CHANNELS = 32
NVLS_CHANNELS = 16  # NCCL_NVLS_NCHANNELS default on H100
PCI_BW = 24.0  # GB/s, NCCL's PCIe Gen4 x16 figure, for GPUs without NVLink to each other
GB = 1e9


@dataclass(frozen=True)
class Channels:
    """The structures NCCL runs: ``rings[c]`` lists every rank's GPU in ring order for run-time
    channel c; ``tree_parent[c][g]`` is GPU g's parent in channel c's tree (-1 at the root)."""

    graphs: dict[str, Graph]
    rings: tuple[tuple[int, ...], ...]
    tree_parent: tuple[dict[int, int], ...]
    nvls_heads: tuple[int, ...]  # per host, per NVLS channel: the GPU whose NIC it uses

    @property
    def n_channels(self) -> int:
        return len(self.rings)


def search(fab: NcclFabric) -> dict[str, Graph]:
    """Per algorithm, the graph NCCL's search would settle on (after ``ncclTopoDupChannels``)."""
    hopper = fab.arch == "hopper"
    intra_speeds = SM90_SPEED_INTRA if hopper else SPEED_INTRA
    inter_speeds = SM90_SPEED_INTER if hopper else SPEED_INTER
    gpu = fab.gpu_bandwidth / GB if fab.gpu_bandwidth > 0 else PCI_BW
    multi = fab.n_nodes > 1
    speeds = inter_speeds if multi else intra_speeds
    best = (0, 0.0)
    for speed in speeds:
        if best[0] and speed / best[1] <= .49:  # NCCL stops lowering the speed here
            break
        n = SEARCH_MAX_CHANNELS
        if fab.ppn > 1 or not multi:
            n = min(n, int(gpu // speed))
        if multi:
            n = min(n, _nic_channels(fab, speed))
        if n * speed > best[0] * best[1] + 1e-9:
            best = (n, speed)
    n, speed = best
    if n == 0:  # slower than every speed NCCL tries: one channel at what there is
        n, speed = 1, min(gpu, fab.nic_bandwidth / GB) if multi else gpu
    if speed >= 25.0 and not (hopper and speed < 50.0 and n > 4):
        doubled = min(2 * n, SEARCH_MAX_CHANNELS)
        speed /= math.ceil(doubled / n)
        n = doubled
    nvlink = fab.nvlink
    ring = Graph(n, speed, speed, nvlink)
    graphs = {RING: ring, TREE: ring, PAT: ring}
    if fab.nvls:
        heads = min(h.ppn for h in fab.hosts)
        intra = next((s for s in intra_speeds if heads * s <= gpu + 1e-9), intra_speeds[-1])
        inter = intra
        if multi:
            inter = min(intra, next((s for s in inter_speeds if s <= fab.nic_bandwidth / GB),
                                    inter_speeds[-1]))
        graphs[NVLS] = graphs[NVLS_TREE] = Graph(heads, intra, inter, True)
    return graphs


def _nic_channels(fab: NcclFabric, speed: float) -> int:
    """Ring channels the NICs carry at ``speed``: each takes one NIC in and one out, so a node
    carries as many as its NICs have room for; the slowest node decides."""
    if not fab.has_nics:
        return int(fab.nic_bandwidth / GB // speed)
    return min(sum(int(nic.bandwidth / GB // speed) for nic in h.nics) for h in fab.hosts)


def build(fab: NcclFabric, graphs: dict[str, Graph]) -> Channels:
    """Rings and trees for the run-time channels (the search's rings, doubled)."""
    ring_graph = graphs[RING]
    n_rings = ring_graph.n_channels
    runtime = min(2 * n_rings, MAX_CHANNELS)
    per_host = [_host_rings(fab, h, k, n_rings, swap=True) for k, h in enumerate(fab.hosts)]
    # trees enter and leave a node through one NIC, the same on every node: no swap
    chains = [_host_rings(fab, h, k, n_rings, swap=False) for k, h in enumerate(fab.hosts)]
    rings = []
    for c in range(runtime):
        j = c % n_rings
        rings.append(tuple(g for segments in per_host for g in segments[j]))
    trees = []
    n_nodes = fab.n_nodes
    dtree = dtree_parents(n_nodes) if n_nodes > 1 else ([-1], [-1])
    for c in range(runtime):
        j = c % n_rings
        up = dtree[0 if c < n_rings else 1]
        parent: dict[int, int] = {}
        for k in range(n_nodes):
            chain = chains[k][j]
            for i, g in enumerate(chain):
                parent[g] = chain[i - 1] if i else -1
            if up[k] >= 0:
                parent[chain[0]] = chains[up[k]][j][0]
        trees.append(parent)
    heads = []
    for h in fab.hosts:
        nic_gpus = [nic.gpu for nic in h.nics] or list(h.gpus)
        heads.append(tuple(nic_gpus[c % len(nic_gpus)] for c in range(NVLS_CHANNELS)))
    return Channels(graphs, tuple(rings), tuple(trees), tuple(g for hh in heads for g in hh))


def _host_rings(fab: NcclFabric, h: Host, k: int, n_rings: int,
                swap: bool) -> list[tuple[int, ...]]:
    """The node's segment of each search ring: entry GPU first, exit GPU last (``swap``: the
    odd nodes' rings run the other way through the NIC pair)."""
    if h.ppn == 1:
        return [h.gpus] * n_rings
    cycles = _cycles(fab, h, n_rings) if h.switch is None else []
    pairs = _nic_pairs(h)
    out = []
    for j in range(n_rings):
        if pairs:
            entry, exit_ = pairs[j % len(pairs)]
            if swap and k % 2 == 1:
                entry, exit_ = exit_, entry
        else:
            entry = exit_ = h.gpus[j % h.ppn]
        if cycles:
            cyc = cycles[j % len(cycles)]
            at = cyc.index(entry)
            out.append(cyc[at:] + cyc[:at])
            continue
        middle = [g for g in h.gpus if g not in (entry, exit_)]
        rot = h.gpus.index(entry)
        middle.sort(key=lambda g: (h.gpus.index(g) - rot) % h.ppn)
        out.append((entry, *middle, *((exit_,) if exit_ != entry else ())))
    return out


def _nic_pairs(h: Host) -> list[tuple[int, int]]:
    """(entry GPU, exit GPU) per search ring: NICs paired 0-1, 1-0, 2-3, 3-2, ...; an odd NIC
    out enters and leaves through the same NIC."""
    gpus = [nic.gpu for nic in h.nics]
    pairs = []
    for i in range(0, len(gpus), 2):
        if i + 1 < len(gpus):
            pairs += [(gpus[i], gpus[i + 1]), (gpus[i + 1], gpus[i])]
        else:
            pairs.append((gpus[i], gpus[i]))
    return pairs


def _cycles(fab: NcclFabric, h: Host, want: int, budget: int = 20000) -> list[tuple[int, ...]]:
    """Rings over direct links inside a node, each used both ways: a depth-first search for
    Hamiltonian cycles that prefers links the earlier rings used least (NCCL's search also
    subtracts each ring's bandwidth from the links it takes). Empty if there is none."""
    topo = fab.topo
    local = set(h.gpus)
    cap: dict[tuple[int, int], float] = {}
    for g in h.gpus:
        for i in topo.out_links(g):
            lk = topo.links[i]
            if topo.usable(i) and lk.dst in local:
                cap[(g, lk.dst)] = cap.get((g, lk.dst), 0.0) + lk.bandwidth
    used: dict[tuple[int, int], int] = {}
    found: list[tuple[int, ...]] = []
    steps = [0]

    def dfs(path: list[int], seen: set[int]) -> tuple[int, ...] | None:
        steps[0] += 1
        if steps[0] > budget:
            return None
        v = path[-1]
        if len(path) == len(h.gpus):
            return tuple(path) if (v, path[0]) in cap else None
        nxt = sorted((w for (u, w) in cap if u == v and w not in seen),
                     key=lambda w: (used.get((v, w), 0) / cap[(v, w)], h.gpus.index(w)))
        for w in nxt:
            seen.add(w)
            path.append(w)
            got = dfs(path, seen)
            if got:
                return got
            path.pop()
            seen.discard(w)
        return None

    for _ in range(max(1, (want + 1) // 2)):
        steps[0] = 0
        cyc = dfs([h.gpus[0]], {h.gpus[0]})
        if cyc is None:
            break
        for a, b in zip(cyc, cyc[1:] + cyc[:1], strict=True):
            used[(a, b)] = used.get((a, b), 0) + 1
            used[(b, a)] = used.get((b, a), 0) + 1
        found += [cyc, (cyc[0], *reversed(cyc[1:]))]
    return found[:max(want, 1)]
