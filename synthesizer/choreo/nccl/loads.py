"""Bytes on every link of the fabric when all of NCCL's channels run at once.

Each GPU-to-GPU send of a channel takes the cheapest route over usable links (the same
``choreo.routing.Router`` costs as the baselines' circuits); NCCL does not split one
connection over several paths. All sends are routed together: one shortest-path search per
source GPU in the compiled engine, stopped once its targets are settled.
The busiest link relative to its bandwidth sets the time the channels need.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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
    pairs = router.paths_from({a: list(bs) for a, bs in by_src.items()})  # compiled search
    alpha = [lk.alpha for lk in topo.links]
    hops: list[int] = []
    weights: list[float] = []
    for (a, b), path in pairs.items():
        hops += path
        weights += [by_src[a][b]] * len(path)
        at = 0.0
        for i in path:  # summed from the source, as the search reached it
            at += alpha[i]
        out.alpha[(a, b)] = at
    np.add.at(out.bytes, np.asarray(hops, dtype=np.int64), np.asarray(weights))
    return out
