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
    if not len(key):
        return out
    # The pairs in ``key`` order: by source, then target (the compiled search's CSR layout).
    pair_src, pair_dst = key // span, key % span
    sources, starts = np.unique(pair_src, return_index=True)
    ptr = np.append(starts, len(key)).astype(np.int64)
    path_ptr, path_links = Router(topo, router_bytes).path_columns(sources, ptr, pair_dst)
    lengths = np.diff(path_ptr)
    np.add.at(out.bytes, path_links, np.repeat(total, lengths))
    # Each path's latency summed hop by hop from the source, as the search reached it.
    alpha = topo.columns.alpha[path_links]
    at = np.zeros(len(key))
    for hop in range(int(lengths.max())):
        more = lengths > hop
        at[more] += alpha[path_ptr[:-1][more] + hop]
    out.alpha.update(zip(zip(pair_src.tolist(), pair_dst.tolist(), strict=True), at.tolist(),
                         strict=True))
    return out
