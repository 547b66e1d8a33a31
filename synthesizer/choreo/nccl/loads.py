"""Bytes on every link of the fabric when all of NCCL's channels run at once.

Each GPU-to-GPU send of a channel takes the cheapest route over usable links (the same
``choreo.routing.Router`` costs as the baselines' circuits); NCCL does not split one
connection over several paths. All sends are routed together: one shortest-path search per
source GPU, stopped once its targets are settled, and the bytes to every target are summed
up the search tree, so a source with a thousand targets costs one pass, not a thousand.
The busiest link relative to its bandwidth sets the time the channels need.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from choreo.errors import InputError
from choreo.routing import Router
from choreo.topology import Topology


@dataclass
class Loads:
    """Bytes per fabric link, and the alpha of each routed (src, dst) pair."""

    topo: Topology
    bytes: np.ndarray
    alpha: dict[tuple[int, int], float]

    def bottleneck(self) -> tuple[float, int]:
        """(seconds the busiest link needs, its index); (0, -1) when nothing moves."""
        bw = np.array([lk.bandwidth for lk in self.topo.links])
        t = self.bytes / bw
        if not len(t) or t.max() <= 0:
            return 0.0, -1
        i = int(np.argmax(t))
        return float(t[i]), i

    def describe(self, i: int) -> str:
        lk = self.topo.links[i]
        return (f"{self.topo.node_name(lk.src)}->{self.topo.node_name(lk.dst)} "
                f"({lk.kind}, {lk.bandwidth / 1e9:.0f} GB/s)")


def route_loads(topo: Topology, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray,
                router_bytes: float, loads: Loads | None = None) -> Loads:
    """Add ``nbytes[i]`` from ``src[i]`` to ``dst[i]`` (NPU ids) along routed paths."""
    out = loads or Loads(topo, np.zeros(len(topo.links)), {})
    if not len(src):
        return out
    keep = src != dst
    src, dst, nbytes = src[keep], dst[keep], nbytes[keep]
    span = topo.num_nodes
    key, inv = np.unique(src.astype(np.int64) * span + dst, return_inverse=True)
    total = np.bincount(inv, weights=nbytes)
    by_src: dict[int, dict[int, float]] = {}
    for k, w in zip(key.tolist(), total.tolist(), strict=True):
        by_src.setdefault(k // span, {})[k % span] = w
    router = Router(topo, router_bytes)
    alpha = np.array([lk.alpha for lk in topo.links])
    for s, targets in by_src.items():
        _accumulate(topo, router, alpha, s, targets, out)
    return out


def _accumulate(topo: Topology, router: Router, alpha: np.ndarray, s: int,
                targets: dict[int, float], out: Loads) -> None:
    pred, order = router.search(s, set(targets))
    missing = [t for t in targets if t != s and pred[t] < 0]
    if missing:
        raise InputError(f"{topo.name}: no usable path from {topo.node_name(s)} to "
                         f"{topo.node_name(missing[0])}")
    weight = dict(targets)
    acc = out.bytes
    links = topo.links
    for v in reversed(order[1:]):
        here = weight.get(v, 0.0)
        if here:
            i = pred[v]
            acc[i] += here
            u = links[i].src
            weight[u] = weight.get(u, 0.0) + here
    a_to = {s: 0.0}
    for v in order[1:]:
        i = pred[v]
        a_to[v] = a_to[links[i].src] + float(alpha[i])
    for t in targets:
        out.alpha[(s, t)] = a_to[t]
