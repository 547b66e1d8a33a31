"""Judge a schedule: verify it, simulate it, and compare it with lower bounds and baselines.

The peer a user compares with is NCCL as it runs (``choreo.nccl``): its time is
``baselines["nccl"]`` with ``nccl_choice`` naming its algorithm and protocol. The textbook
single-channel algorithms stay as extra rows, named for what they are (``ring-1ch``, ...).
The CLI, the benchmark and the gRPC service all report through ``evaluate`` so that every
number choreo prints about a schedule comes from the same place.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from choreo.baselines import (
    BaselinePaths,
    BaselineUnavailable,
    baseline_makespan,
    baselines_for,
)
from choreo.bounds import Bound, Capacity, capacity, demand_key, lower_bound
from choreo.collectives import Demand
from choreo.nccl.compare import nccl_as_it_runs, versus_nccl
from choreo.nccl.model import NcclResult
from choreo.schedule import Schedule
from choreo.simulate import SimResult, simulate
from choreo.synth import auto_chunks
from choreo.topology import Topology
from choreo.verify import Verdict, verify

NCCL = "nccl"


def textbook_label(name: str) -> str:
    """How a report names a single-channel textbook baseline: for what it is."""
    return f"{name}-1ch"


@dataclass
class TenantResult:
    """One tenant's collective as simulated, against its bound (``tenant_bounds``) and the
    baselines (alone)."""

    name: str
    collective: str
    npus: int
    size: int
    chunks: int
    time: float
    algbw: float
    busbw: float
    bound: float
    bound_kind: str
    baselines: dict[str, float] = field(default_factory=dict)
    nccl_choice: str = ""  # NCCL's algorithm/protocol and channels, where it was modelled

    @property
    def fraction_of_bound(self) -> float:
        return self.bound / self.time if self.time > 0 else 0.0

    def speedup(self, baseline: str) -> float | None:
        t = self.baselines.get(baseline)
        return t / self.time if t is not None and self.time > 0 else None

    @property
    def best_baseline(self) -> tuple[str, float] | None:
        """The fastest of the textbook single-channel algorithms (not NCCL)."""
        textbook = {b: v for b, v in self.baselines.items() if b != NCCL}
        if not textbook:
            return None
        name = min(textbook, key=lambda b: textbook[b])
        return name, textbook[name]

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["fraction_of_bound"] = self.fraction_of_bound
        doc["speedup"] = {b: self.speedup(b) for b in self.baselines}
        return doc


@dataclass
class Evaluation:
    schedule: Schedule
    verdict: Verdict
    sim: SimResult
    tenants: list[TenantResult]

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.schedule.engine,
            "topology": self.schedule.topology.name,
            "transfers": len(self.schedule),
            "verified": self.verdict.ok,
            "verification_errors": self.verdict.errors[:10],
            "makespan": self.sim.makespan,
            "tenants": [t.to_dict() for t in self.tenants],
            "meta": self.schedule.meta,
        }


@dataclass(frozen=True)
class Known:
    """What judging a schedule of ``demands`` needs that does not depend on the schedule:
    each tenant's bound capacity alone, every tenant's jointly (more than one), and NCCL's
    run of each (None: NCCL could not connect its ranks). Found once, beside the solve."""

    alone: tuple[Capacity, ...]
    joint: Capacity | None
    nccl: tuple[NcclResult | None, ...]

    def serves(self, demands: Sequence[Demand]) -> bool:
        """Whether it was found for ``demands`` (their chunks aside)."""
        return tuple(c.demands[0] for c in self.alone) == demand_key(demands)


def known(fabric: Topology, demands: Sequence[Demand]) -> Known:
    """``Known`` for ``demands`` on ``fabric``; a solve may change their chunks only."""
    return Known(tuple(capacity(fabric, d) for d in demands),
                 capacity(fabric, demands[0], demands[1:]) if len(demands) > 1 else None,
                 tuple(nccl_as_it_runs(fabric, d) for d in demands))


def tenant_bounds(schedule: Schedule, times: np.ndarray, found: Known | None = None,
                  ) -> list[Bound]:
    """Per tenant, a time its collective cannot beat: its own bound, and for the tenant
    that ends last the larger of that and the joint bound of every tenant. The joint bound
    holds for the last end only: a tenant that goes first may well beat it (two tenants
    crossing one NIC-wide spine uplink: 2.838 ms for the first, against 2.918 ms for
    both). ``found``: their capacities, where known already."""
    demands, whole = schedule.demands, not schedule.ranged
    if found is not None and not found.serves(demands):
        found = None
    alone = [lower_bound(schedule.fabric, d, whole_chunks=whole,
                         known=found.alone[t] if found else None)
             for t, d in enumerate(demands)]
    if len(demands) < 2:
        return alone
    joint = lower_bound(schedule.fabric, demands[0], demands[1:], whole_chunks=whole,
                        known=found.joint if found else None)
    last = int(np.argmax(times))
    alone[last] = max(alone[last], joint, key=lambda b: b.value_s)
    return alone


def evaluate(
    schedule: Schedule,
    baselines: bool = True,
    step: Callable[[str], None] | None = None,
    found: Known | None = None,
) -> Evaluation:
    """Verify and simulate ``schedule``; bound and baseline every tenant (``found``: the
    bounds' capacities, where known already)."""
    say = step or (lambda _msg: None)
    say("verifying")
    verdict = verify(schedule)
    say("simulating")
    sim = simulate(schedule)
    fabric = schedule.fabric
    bounds = tenant_bounds(schedule, sim.tenant_time, found)
    results = []
    for t, d in enumerate(schedule.demands):
        bound = bounds[t]
        times: dict[str, float] = {}
        choice = ""
        if baselines:
            say(f"NCCL model for {d.name or d.collective.value}")
            vs = versus_nccl(fabric, d, float(sim.tenant_time[t]))
            if vs is not None:  # else NCCL could not connect the ranks: nothing to compare
                times[NCCL], choice = vs.nccl_s, vs.choice
            # A ranged plan picks its own (finer) chunks; the textbook algorithms pipeline with
            # what the demand would get, or their chunk-by-chunk sends multiply.
            textbook = replace(d, chunks=min(d.chunks, auto_chunks(
                fabric, d.collective, d.size, d.n))) if schedule.ranged else d
            paths = BaselinePaths(fabric, textbook)  # routes shared by the demand's baselines
            for name in baselines_for(textbook, fabric):
                say(f"baseline {name} for {d.name or d.collective.value}")
                try:
                    times[textbook_label(name)] = baseline_makespan(name, fabric, textbook,
                                                                    paths)
                except BaselineUnavailable:
                    continue
        results.append(TenantResult(
            name=d.name or f"tenant{t}", collective=d.collective.value, npus=d.n,
            size=d.size, chunks=d.chunks, time=float(sim.tenant_time[t]),
            algbw=float(sim.algbw[t]), busbw=float(sim.busbw[t]),
            bound=bound.value_s, bound_kind=bound.reason, baselines=times, nccl_choice=choice,
        ))
    return Evaluation(schedule, verdict, sim, results)
