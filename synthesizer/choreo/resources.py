"""What a transfer on a schedule link physically occupies: the one resource model shared by
the verifier, the simulator and the lower bounds, so they can never disagree about it.

A link of ``schedule.topology`` maps to physical links of ``schedule.fabric``: its ``via``
when given, else itself when the fabric has a link with the same index and ends (direct links
of a topology that is, or keeps the indices of, the fabric), else nothing (a purely logical
link, which is then its own resource).

* A *fractional share* (bandwidth below the slowest of its physical links) is a static slice
  of those ports: it is its own exclusive resource, and its bandwidth is reserved on each
  physical link, so concurrent shares of one port never exceed the port.
* Otherwise the link is a *circuit*: a transfer on it occupies every physical link on its
  path exclusively for its whole duration (cut-through).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from choreo.arrays import unique_sorted
from choreo.topology import Topology

# Bandwidths within this relative distance count as equal: a unit-share link is a circuit.
SHARE_RTOL = 1e-9


@dataclass(frozen=True)
class LinkModel:
    """Physical footprint of the links ``links`` (indices into the schedule topology).

    ``ptr``/``phys`` are CSR: link ``links[k]`` rides fabric links ``phys[ptr[k]:ptr[k+1]]``.
    ``bad`` holds a reason (or ``""``) per link for a via that is missing or unusable.
    """

    links: np.ndarray
    fractional: np.ndarray
    ptr: np.ndarray
    phys: np.ndarray
    bad: list[str]

    def row(self, link: int) -> int:
        """Position of a topology link in this model (it must be one of ``links``)."""
        return int(np.searchsorted(self.links, link))

    def physical_of(self, k: int) -> np.ndarray:
        return self.phys[self.ptr[k] : self.ptr[k + 1]]


def physical_path(topology: Topology, fabric: Topology, link: int) -> tuple[int, ...]:
    """The fabric links that topology link ``link`` rides on (see the module docstring)."""
    lk = topology.links[link]
    if lk.via:
        return lk.via
    if link < len(fabric.links):
        f = fabric.links[link]
        if f.src == lk.src and f.dst == lk.dst:
            return (link,)
    return ()


def link_model(topology: Topology, fabric: Topology, links: np.ndarray) -> LinkModel:
    """Classify ``links`` (sorted unique topology link ids) as circuits or fractional shares."""
    links = np.asarray(links, dtype=np.int64)
    nf = len(fabric.links)
    paths = [physical_path(topology, fabric, i) for i in links.tolist()]
    ptr = np.zeros(len(links) + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(path) for path in paths])
    raw = np.fromiter((p for path in paths for p in path), dtype=np.int64, count=int(ptr[-1]))
    row = np.repeat(np.arange(len(links)), np.diff(ptr))
    exists = (raw >= 0) & (raw < nf)
    usable = fabric.columns.usable
    dead = exists & ~usable[np.where(exists, raw, 0)]
    bad = [""] * len(links)
    for k in unique_sorted(row[~exists | dead]).tolist():  # the first problem of each bad link
        path = paths[k]
        missing = [p for p in path if not 0 <= p < nf]
        if missing:
            bad[k] = f"via link {missing[0]} does not exist in fabric {fabric.name}"
            continue
        first = next(p for p in path if not fabric.usable(p))
        f = fabric.links[first]
        bad[k] = (f"via link {first} ({fabric.node_name(f.src)}->{fabric.node_name(f.dst)}) "
                  "is not usable in the fabric")
    phys = raw[exists]  # a missing via link occupies nothing
    ptr[1:] = np.cumsum(np.bincount(row[exists], minlength=len(links)))
    fab_bw = fabric.columns.bandwidth
    slowest = np.full(len(links), np.inf)
    np.minimum.at(slowest, row[exists], fab_bw[phys])
    own_bw = topology.columns.bandwidth[links]
    fractional = np.isfinite(slowest) & (own_bw < slowest * (1 - SHARE_RTOL))
    return LinkModel(links, fractional, ptr, phys, bad)


def share_of_port(topology: Topology, fabric: Topology, model: LinkModel) -> np.ndarray:
    """Per CSR entry: the fraction of the physical link's bandwidth the logical link uses
    (1 for circuits), so utilization and capacity are counted in physical terms."""
    out = np.ones(len(model.phys))
    for k, i in enumerate(model.links.tolist()):
        if model.fractional[k]:
            bw = topology.links[i].bandwidth
            for j in range(model.ptr[k], model.ptr[k + 1]):
                out[j] = bw / fabric.links[int(model.phys[j])].bandwidth
    return out


def footprint(model: LinkModel, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Expand items on model rows ``rows`` to (item, CSR position) pairs, one per physical
    link each item occupies; vectorized so millions of transfers expand in milliseconds."""
    cnt = (model.ptr[1:] - model.ptr[:-1])[rows]
    item = np.repeat(np.arange(len(rows)), cnt)
    offs = np.arange(len(item)) - np.repeat(np.cumsum(cnt) - cnt, cnt)
    return item, np.repeat(model.ptr[:-1][rows], cnt) + offs
