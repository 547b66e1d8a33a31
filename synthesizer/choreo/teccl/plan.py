"""From chosen epoch transfers to timed ones.

A solver's optimum may contain *silly* transfers (TE-CCL section 3): a second copy of a chunk
a node already has, or a copy to a relay that never forwards it. They cost link time and, in
reduction trees built by reversal, would add a contribution twice, so they are removed first:
every node keeps its earliest arrival of each chunk, then transfers into non-destinations
that forward nothing are dropped until none is left.

Times come from a list schedule in epoch order: each transfer starts when its link is free
and its chunk has arrived, and lasts its full ``alpha + bytes/bw``. An exact epoch plan is
reproduced (or beaten, when a transfer's share of an epoch was slack); a plan made under
TE-CCL's pipelined-alpha model is stretched to what choreo's contract allows.
"""

from __future__ import annotations

import numpy as np

from choreo.teccl.epochs import Grid
from choreo.teccl.milp import Spread
from choreo.teccl.network import Net


def prune(net: Net, grid: Grid, spread: Spread, c: np.ndarray, e: np.ndarray,
          k: np.ndarray) -> np.ndarray:
    """Mask of the transfers worth keeping (see the module docstring)."""
    arrive = k + grid.delay[spread.tenant[c], e]
    dst = net.dst[e]
    order = np.lexsort((e, arrive, dst, c))
    first = np.ones(len(c), dtype=bool)
    same = (c[order][1:] == c[order][:-1]) & (dst[order][1:] == dst[order][:-1])
    first[order[1:][same]] = False
    keep = first & ~spread.have[c, dst]
    src = net.src[e]
    while True:
        # a kept arrival at a non-destination must feed a kept send of the same chunk
        sends = {(int(a), int(b)) for a, b in zip(c[keep], src[keep], strict=True)}
        dead = [i for i in np.flatnonzero(keep).tolist()
                if not spread.want[c[i], dst[i]] and (int(c[i]), int(dst[i])) not in sends]
        if not dead:
            return keep
        keep[dead] = False


def list_times(net: Net, spread: Spread, c: np.ndarray, e: np.ndarray, k: np.ndarray,
               have: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Start and end of each transfer, scheduled in epoch order (ties: link, commodity)."""
    holds = spread.have if have is None else have
    ready = np.where(holds, 0.0, np.inf)
    free = np.zeros(net.num_links)
    dur = net.time[spread.tenant[c], e]
    start = np.zeros(len(c))
    end = np.zeros(len(c))
    src, dst = net.src[e], net.dst[e]
    for i in np.lexsort((c, e, k)).tolist():
        ci, ei = int(c[i]), int(e[i])
        at = ready[ci, src[i]]
        if not np.isfinite(at):
            raise AssertionError("plan sends a chunk its sender never receives")
        s = max(free[ei], at)
        start[i], end[i] = s, s + dur[i]
        free[ei] = end[i]
        if end[i] < ready[ci, dst[i]]:
            ready[ci, dst[i]] = end[i]
    return start, end
