"""Fabrics whose links differ by up to eighteen orders of magnitude (1 B/s beside 1e18 B/s,
alphas from 0 to 100 s): everything a request runs, the portfolio with the exact solvers,
judging against NCCL and lowering, either gives an answer or a ChoreoError, never another
exception (each of those was an INTERNAL error from the service once). Float64 cannot
resolve such spreads, so a schedule may fail verification: then it is not lowered."""

from __future__ import annotations

from fabric_strategies import fabrics
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from choreo.collectives import Collective, Demand
from choreo.errors import ChoreoError
from choreo.msccl import to_xml
from choreo.nccl.compare import versus_nccl
from choreo.portfolio import PortfolioOptions, solve
from choreo.report import evaluate
from choreo.topology import Topology

BANDWIDTHS = (1.0, 1e3, 1e9, 50e9, 1e15, 1e18)
ALPHAS = (0.0, 1e-12, 1e-6, 1e-3, 1.0, 100.0)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fabric=fabrics(ALPHAS, BANDWIDTHS, ALPHAS, BANDWIDTHS),
       collective=st.sampled_from(list(Collective)),
       size=st.sampled_from([1, 1 << 20, 1 << 40]), chunks=st.integers(1, 4), data=st.data())
def test_every_step_answers_or_says_why(fabric: Topology, collective: Collective, size: int,
                                        chunks: int, data: st.DataObject) -> None:
    ranks = tuple(sorted(data.draw(st.lists(st.sampled_from(fabric.npus), min_size=2,
                                            unique=True), label="ranks")))
    demand = Demand(collective, ranks, size, chunks, root=data.draw(
        st.integers(0, len(ranks) - 1), label="root"))
    try:
        sched = solve(fabric, [demand], "auto", 1.0, PortfolioOptions(restarts=1, relay=False))
        report = evaluate(sched, baselines=False)
        versus_nccl(fabric, demand, report.tenants[0].time)
        if report.verdict.ok:
            to_xml(sched)
        event(f"answered, {'verified' if report.verdict.ok else 'failed verification'}")
    except ChoreoError as err:
        event(f"refused: {type(err).__name__}")
