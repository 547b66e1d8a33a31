"""Measured link rates planned as equal where they lie close together."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from choreo.topology import Topology

EQUAL_WITHIN = 0.05  # link alphas or bandwidths this close to the next are planned as equal
EQUAL_SPAN = 0.40  # ... up to this far from the group's smallest (the most a plan can give up)


def equalized(values: np.ndarray, up: bool, tolerance: float = EQUAL_WITHIN,
              span: float = EQUAL_SPAN) -> np.ndarray:
    """Near-equal values made equal, rounded toward the safe side.

    Measured links differ by a few percent. The engine matches at transfer ends, so such
    noise scatters the ends of what should be one round and the greedy choice falls apart
    (an AllGather on two DGX-H100s with 0.1% noise on its bandwidths took 4.9x longer; with
    4% noise, 4.6x). Sorted values join one group while each is within ``tolerance`` of the
    previous one and within ``span`` of the group's first, so a cloud of noisy measurements
    around one true rate is one group however wide it is, and distinct link classes (NVLink
    against a NIC: many times apart) never merge. Each group takes its slowest member: the
    largest alpha (``up``) or the smallest bandwidth, so every planned transfer still lasts
    at least its true ``alpha + bytes / bandwidth``; a plan gives up at most the group's
    spread.
    """
    values = np.asarray(values, dtype=np.float64)
    distinct, index = np.unique(values, return_inverse=True)  # few, even on large fabrics
    slowest = distinct.copy()
    group_start = 0
    for k in range(1, len(distinct) + 1):
        if (k == len(distinct) or distinct[k] > distinct[k - 1] * (1 + tolerance)
                or distinct[k] > distinct[group_start] * (1 + span)):
            slowest[group_start:k] = distinct[k - 1] if up else distinct[group_start]
            group_start = k
    return slowest[index.reshape(values.shape)]


def planned_costs(topology: Topology, links: Sequence[int] | np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The alphas and bandwidths of ``links`` as plans take them: ``equalized``, each at the
    slowest of its near-equal group."""
    ids = np.asarray(links, dtype=np.int64)
    cols = topology.columns
    return equalized(cols.alpha[ids], up=True), equalized(cols.bandwidth[ids], up=False)
