"""Epoch discretization of link costs: how many epochs a transfer occupies a link and when its
chunk can be forwarded.

Choreo's contract is that a transfer holds its link exclusively for ``alpha + bytes/bw``.
With epoch length ``tau`` a transfer that fits in one epoch uses ``t/tau`` of it (several can
share the epoch back to back); a longer one occupies ``ceil(t/tau)`` whole epochs. The chunk
can be forwarded from the epoch after the occupation ends, so alpha is a whole-epoch delay
folded into the occupation. ``pipelined_alpha`` instead reproduces TE-CCL's cost model
(links busy only for ``bytes/bw``, alpha a pure propagation delay of ``ceil(alpha/tau)``
epochs) for comparing with its published numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from choreo.teccl.network import Net

ROUND = 1e-9


@dataclass(frozen=True)
class Grid:
    """Per tenant and usable link: epochs occupied, share of each occupied epoch, and epochs
    from the start of a transfer until its chunk is usable at the receiver."""

    tau: float
    kappa: np.ndarray
    load: np.ndarray
    delay: np.ndarray

    @property
    def max_delay(self) -> int:
        return int(self.delay.max()) if self.delay.size else 1


def make_grid(net: Net, tau: float, alpha: np.ndarray | None = None,
              pipelined_alpha: bool = False) -> Grid:
    """``alpha`` (per usable link) is needed only for ``pipelined_alpha``."""
    busy = net.time
    if pipelined_alpha:
        assert alpha is not None
        busy = net.time - alpha[None, :]
    kappa = np.maximum(1, np.ceil(busy / tau - ROUND)).astype(np.int64)
    load = np.where(kappa == 1, busy / tau, 1.0)
    delay = kappa.copy()
    if pipelined_alpha:
        assert alpha is not None
        delay = kappa + np.ceil(alpha / tau - ROUND).astype(np.int64)[None, :]
    return Grid(tau, kappa, load, delay)


def epoch_candidates(net: Net, scales: tuple[float, ...],
                     pipelined_alpha: bool = False) -> list[float]:
    """Epoch lengths to try: the fastest transfer (TE-CCL's fine option), scaled; a scale
    above 1 lets several fast transfers share an epoch and shrinks the model."""
    busy = net.time - net.alpha[None, :] if pipelined_alpha else net.time
    fastest = float(busy.min())
    return [fastest * s for s in scales]


def epochs_for(seconds: float, tau: float) -> int:
    return max(1, math.ceil(seconds / tau - ROUND))
