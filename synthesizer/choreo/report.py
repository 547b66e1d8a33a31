"""Judge a schedule: verify it, simulate it, and compare it with lower bounds and baselines.

The CLI, the benchmark and the gRPC service all report through ``evaluate`` so that every
number choreo prints about a schedule comes from the same place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from choreo.baselines import BaselineUnavailable, baselines_for, run_baseline
from choreo.bounds import lower_bound
from choreo.schedule import Schedule
from choreo.simulate import SimResult, simulate
from choreo.verify import Verdict, verify


@dataclass
class TenantResult:
    """One tenant's collective as simulated, against its bound and the baselines (alone)."""

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

    @property
    def fraction_of_bound(self) -> float:
        return self.bound / self.time if self.time > 0 else 0.0

    def speedup(self, baseline: str) -> float | None:
        t = self.baselines.get(baseline)
        return t / self.time if t is not None and self.time > 0 else None

    @property
    def best_baseline(self) -> tuple[str, float] | None:
        if not self.baselines:
            return None
        name = min(self.baselines, key=lambda b: self.baselines[b])
        return name, self.baselines[name]

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


def evaluate(
    schedule: Schedule,
    baselines: bool = True,
    step: Callable[[str], None] | None = None,
) -> Evaluation:
    """Verify and simulate ``schedule``; bound and baseline every tenant."""
    say = step or (lambda _msg: None)
    say("verifying")
    verdict = verify(schedule)
    say("simulating")
    sim = simulate(schedule)
    fabric = schedule.fabric
    results = []
    for t, d in enumerate(schedule.demands):
        others = [o for i, o in enumerate(schedule.demands) if i != t]
        bound = lower_bound(fabric, d, others)
        times: dict[str, float] = {}
        if baselines:
            for name in baselines_for(d, fabric):
                say(f"baseline {name} for {d.name or d.collective.value}")
                try:
                    times[name] = simulate(run_baseline(name, fabric, d)).makespan
                except BaselineUnavailable:
                    continue
        results.append(TenantResult(
            name=d.name or f"tenant{t}", collective=d.collective.value, npus=d.n,
            size=d.size, chunks=d.chunks, time=float(sim.tenant_time[t]),
            algbw=float(sim.algbw[t]), busbw=float(sim.busbw[t]),
            bound=bound.value_s, bound_kind=bound.reason, baselines=times,
        ))
    return Evaluation(schedule, verdict, sim, results)
