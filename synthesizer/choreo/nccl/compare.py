"""choreo's schedule against NCCL as it runs, for the decision to ship a file or not.

A file that makes a job slower than not installing choreo is worse than no file: where the
NCCL model predicts NCCL faster, the CLI, the service and the operator ship nothing for those
sizes and the MSCCL runtime falls back to NCCL.
"""

from __future__ import annotations

from dataclasses import dataclass

from choreo.collectives import Demand
from choreo.errors import ChoreoError
from choreo.nccl.model import NcclResult, nccl_baseline
from choreo.topology import Topology


@dataclass(frozen=True)
class Versus:
    """One collective's predicted time under choreo and under NCCL's own choice."""

    choreo_s: float
    nccl_s: float
    choice: str  # "ring/simple, 16 channels"

    @property
    def speedup(self) -> float:
        """NCCL's time over choreo's: above 1 choreo is faster."""
        return self.nccl_s / self.choreo_s if self.choreo_s > 0 else float("inf")

    @property
    def nccl_ahead(self) -> bool:
        return self.nccl_s < self.choreo_s

    def why(self) -> str:
        return (f"NCCL ({self.choice}) is predicted {self.choreo_s / self.nccl_s:.2f}x faster "
                f"({self.nccl_s * 1e3:.3f} ms against {self.choreo_s * 1e3:.3f} ms)")


def nccl_as_it_runs(fabric: Topology, demand: Demand) -> NcclResult | None:
    """NCCL's own choice and time for ``demand`` on ``fabric``; None where NCCL could not
    connect the ranks (nothing to compare with, so nothing to fall back to). It does not
    depend on how choreo cuts the data into chunks."""
    try:
        return nccl_baseline(fabric, demand)
    except ChoreoError:
        return None


def versus(nccl: NcclResult | None, choreo_s: float) -> Versus | None:
    """choreo at ``choreo_s`` seconds against NCCL's run ``nccl`` (None: none to compare)."""
    if nccl is None:
        return None
    return Versus(choreo_s, nccl.seconds, f"{nccl.choice}, {nccl.channels} channels")


def versus_nccl(fabric: Topology, demand: Demand, choreo_s: float) -> Versus | None:
    """How ``demand`` at ``choreo_s`` seconds compares with NCCL on ``fabric``; None where
    NCCL could not connect the ranks (nothing to compare with, so nothing to fall back to)."""
    return versus(nccl_as_it_runs(fabric, demand), choreo_s)
