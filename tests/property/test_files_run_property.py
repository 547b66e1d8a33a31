"""Random fabrics (and presets where tenants hold parts of switches), failures, tenants and
engines (greedy with and without relays, the MILP, the LP, the portfolio with its chunk
search and pieces): every schedule verifies, and every tenant's MSCCL file that lowers runs
to completion in the interpreter and computes its collective, in every dialect that takes
it."""

from __future__ import annotations

from fabric_strategies import fabrics
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from choreo.collectives import Collective, Demand
from choreo.errors import InfeasibleError, InputError
from choreo.generators import build
from choreo.msccl import run, to_xml
from choreo.msccl.layout import DIALECTS, supported
from choreo.portfolio import PortfolioOptions, solve
from choreo.schedule import Schedule
from choreo.synth import SynthOptions, synthesize
from choreo.teccl.flow import FLOW_COLLECTIVES
from choreo.topology import Topology
from choreo.transforms import fail_npus
from choreo.verify import verify

ENGINES = ("greedy", "relay", "milp", "lp", "auto")
PRESETS = ("dgx-h100-1", "switch2d-4x2", "dragonfly-3x4", "dgx1")  # tenants on parts of switches


def _synthesize(fabric: Topology, demands: list[Demand], engine: str) -> Schedule:
    if engine in ("greedy", "relay"):
        return synthesize(fabric, demands, SynthOptions(restarts=1, relay=engine == "relay"))
    deadline = 2.0 if engine == "auto" else 5.0
    return solve(fabric, demands, engine, deadline, PortfolioOptions(restarts=1, relay=False))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fabric=st.one_of(fabrics(), st.sampled_from(PRESETS).map(build)),
       engine=st.sampled_from(ENGINES), tenants=st.integers(1, 2), data=st.data())
def test_every_file_that_lowers_runs(fabric: Topology, engine: str, tenants: int,
                                     data: st.DataObject) -> None:
    if data.draw(st.booleans(), label="fail an npu"):
        fabric = fail_npus(fabric, [data.draw(st.sampled_from(fabric.npus), label="failed")])
    live = data.draw(st.permutations(fabric.npus), label="rank order")
    cut = data.draw(st.integers(2, max(2, len(live) - 2)), label="cut") if tenants == 2 else 0
    groups = [live[:cut], live[cut:]] if tenants == 2 and len(live) - cut >= 2 else [live]
    kinds = FLOW_COLLECTIVES if engine == "lp" else tuple(Collective)
    demands = [Demand(data.draw(st.sampled_from(kinds), label="collective"), tuple(g), 4 << 20,
                      data.draw(st.integers(1, 3), label="chunks"),
                      root=data.draw(st.integers(0, len(g) - 1), label="root"), name=f"t{t}")
               for t, g in enumerate(groups)]
    try:
        sched = _synthesize(fabric, demands, engine)
    except InfeasibleError:
        event(f"{engine}: refused")
        return  # the failures (or own-NPU links only) cut a tenant apart, or no schedule in time
    verdict = verify(sched)
    assert verdict.ok, verdict.errors[:3]
    for t, d in enumerate(demands):
        for dialect in DIALECTS:
            if not supported(d.collective, dialect):
                continue
            try:
                xml = to_xml(sched, t, dialect=dialect)
            except InputError:
                continue  # beyond this runtime's limits: refused with the reason, never shipped
            result = run(xml, root=d.root)
            assert result.ok, f"{engine}, tenant {t}, {dialect}: {result}"
            event(f"{engine}: a file ran")
