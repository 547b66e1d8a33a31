"""The simulator: alpha-beta durations, FIFO links, store-and-forward, never later than a
feasible plan, and NCCL's bandwidth definitions."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from choreo.collectives import Collective, Demand
from choreo.schedule import COLUMNS, Op, Schedule
from choreo.simulate import simulate
from choreo.topology import Link, NodeKind, Topology, duplex
from choreo.verify import verify

ALPHA, BW = 1e-6, 1e9


def line(n: int) -> Topology:
    links: list[Link] = []
    for v in range(n - 1):
        links.extend(duplex(v, v + 1, ALPHA, BW))
    return Topology(f"line-{n}", (NodeKind.NPU,) * n, tuple(links))


def make(fabric: Topology, topo: Topology, d: Demand, rows: list[tuple[Any, ...]]) -> Schedule:
    cols: dict[str, Any] = {
        name: np.array(col) for name, col in zip(COLUMNS, zip(*rows, strict=True), strict=False)
    }
    return Schedule(fabric, topo, (d,), **cols)


def sched(topo: Topology, d: Demand, rows: list[tuple[Any, ...]]) -> Schedule:
    return make(topo, topo, d, rows)


def test_store_and_forward_and_bandwidths() -> None:
    topo = line(3)  # links: 0:0->1 1:1->0 2:1->2 3:2->1
    d = Demand(Collective.BROADCAST, (0, 1, 2), 1000)
    t = ALPHA + 1000 / BW
    # planned with slack: the simulator pulls the second hop forward to the arrival
    s = sched(topo, d, [(0, 0, 0, 1, 0, 0.0, t, Op.COPY), (0, 0, 1, 2, 2, 5 * t, 6 * t, Op.COPY)])
    r = simulate(s)
    assert r.start.tolist() == pytest.approx([0.0, t])
    assert r.makespan == pytest.approx(2 * t)
    assert r.tenant_time[0] == pytest.approx(2 * t)
    assert r.algbw[0] == pytest.approx(1000 / (2 * t))
    assert r.busbw[0] == pytest.approx(r.algbw[0])  # broadcast factor 1
    assert r.link_utilization.tolist() == pytest.approx([0.5, 0.0, 0.5, 0.0])
    assert r.fabric_utilization.tolist() == pytest.approx([0.5, 0.0, 0.5, 0.0])


def test_fifo_on_a_link_in_planned_order() -> None:
    topo = line(2)
    d = Demand(Collective.SCATTER, (0, 1), 2000)  # chunk 1 goes to rank 1
    t = ALPHA + 1000 / BW
    # both planned at once (infeasible plan): the link serves the lower index first
    rows = [(0, 1, 0, 1, 0, 0.0, t, Op.COPY), (0, 1, 0, 1, 0, 0.0, t, Op.COPY)]
    r = simulate(sched(topo, d, rows))
    assert r.start.tolist() == pytest.approx([0.0, t])
    assert r.end.tolist() == pytest.approx([t, 2 * t])


def test_dependency_is_only_arrivals_planned_before_start() -> None:
    topo = line(3)
    d = Demand(Collective.BROADCAST, (0, 1, 2), 1000)
    t = ALPHA + 1000 / BW
    # the 1->2 hop is planned to start before the 0->1 arrival, so it does not wait for it;
    # the simulator still runs it (the verifier is what rejects such a plan)
    rows = [(0, 0, 0, 1, 0, 0.0, t, Op.COPY), (0, 0, 1, 2, 2, 0.5 * t, 1.5 * t, Op.COPY)]
    r = simulate(sched(topo, d, rows))
    assert r.start[1] == pytest.approx(0.0)


def test_feasible_plan_is_never_delayed() -> None:
    n = 5
    topo = Topology("uniring", (NodeKind.NPU,) * n,
                    tuple(Link(i, (i + 1) % n, ALPHA, BW) for i in range(n)))
    d = Demand(Collective.ALLREDUCE, tuple(range(n)), 5000, chunks=2)
    t = ALPHA + d.chunk_bytes / BW
    rows = []
    for step in range(2 * (n - 1)):
        for v in range(n):
            piece = (v - step - 1) % n if step < n - 1 else (v - step + n - 1) % n
            op = Op.REDUCE if step < n - 1 else Op.COPY
            for k in range(2):  # stretched plan: each step takes 3 link times
                st = 3 * step * t + 1.5 * k * t
                rows.append((0, piece * 2 + k, v, (v + 1) % n, v, st, st + 1.5 * t, op))
    s = sched(topo, d, rows)
    assert verify(s).ok
    r = simulate(s)
    assert np.all(r.start <= s.start + 1e-15)
    assert np.all(r.end <= s.end + 1e-15)
    assert verify(r.retimed(s)).ok
    # every link carries both chunks of one piece per step, back to back
    assert r.makespan == pytest.approx(2 * 2 * (n - 1) * t)


def test_fractional_share_and_circuit_on_one_port_wait_for_each_other() -> None:
    fab_links: list[Link] = []
    for v in range(3):
        fab_links.extend(duplex(v, 3, ALPHA / 2, BW))  # up 2v, down 2v+1
    fab = Topology("star", (NodeKind.NPU,) * 3 + (NodeKind.SWITCH,), tuple(fab_links))
    topo = Topology("mixed", fab.kinds, (
        Link(0, 1, ALPHA, BW / 2, via=(0, 3)),  # share of port 0
        Link(0, 2, ALPHA, BW, via=(0, 5)),  # circuit through port 0
    ))
    d = Demand(Collective.BROADCAST, (0, 1, 2), 1000)
    t_half = ALPHA + 1000 / (BW / 2)
    t_full = ALPHA + 1000 / BW
    rows = [(0, 0, 0, 1, 0, 0.0, t_half, Op.COPY), (0, 0, 0, 2, 1, 0.0, t_full, Op.COPY)]
    r = simulate(make(fab, topo, d, rows))
    assert r.start[1] == pytest.approx(t_half)
    # port 0 carried half its bandwidth for t_half, then all of it for t_full
    assert r.fabric_utilization[0] * r.makespan == pytest.approx(t_half / 2 + t_full)


def test_empty_schedule() -> None:
    topo = line(2)
    d = Demand(Collective.ALLGATHER, (0, 1), 10)
    r = simulate(Schedule.empty(topo, topo, (d,)))
    assert r.makespan == 0.0 and r.tenant_time.tolist() == [0.0]


def _two_leaves(uplink: float) -> tuple[Topology, Topology]:
    """NPUs 0, 1, 4 on leaf 5 and 2, 3 on leaf 6, the leaves joined at ``uplink`` B/s; the
    circuits 0->2, 1->3 and 4->3 through it."""
    fab_links: list[Link] = []
    for v, leaf in ((0, 5), (1, 5), (4, 5), (2, 6), (3, 6)):
        fab_links.extend(duplex(v, leaf, ALPHA / 2, BW))  # NIC up 2k, down 2k+1
    fab_links.extend(duplex(5, 6, ALPHA / 2, uplink))  # up 10, down 11
    fab = Topology("leaves", (NodeKind.NPU,) * 5 + (NodeKind.SWITCH,) * 2, tuple(fab_links))
    topo = Topology("circuits", fab.kinds, (
        Link(0, 2, 3 * ALPHA / 2, BW, via=(0, 10, 7)),
        Link(1, 3, 3 * ALPHA / 2, BW, via=(2, 10, 9)),
        Link(4, 3, 3 * ALPHA / 2, BW, via=(4, 10, 9)),
    ))
    return fab, topo


@pytest.mark.parametrize(("uplink", "together"), [(2 * BW, True), (1.5 * BW, False)])
def test_a_link_twice_as_fast_as_its_circuits_carries_two_at_once(uplink: float,
                                                                   together: bool) -> None:
    fab, topo = _two_leaves(uplink)
    d = Demand(Collective.ALLGATHER, (0, 1, 2, 3), 4000, chunks=1)
    t = 3 * ALPHA / 2 + 1000 / BW
    rows = [(0, 0, 0, 2, 0, 0.0, t, Op.COPY), (0, 1, 1, 3, 1, 0.0, t, Op.COPY)]
    s = make(fab, topo, d, rows)
    r = simulate(s)
    assert r.start[1] == pytest.approx(0.0 if together else t)
    assert verify(r.retimed(s)).counts["overlap"] == 0  # resources only: two sends are no AllGather
    if together:  # each circuit used half the uplink
        assert r.fabric_utilization[10] * r.makespan == pytest.approx(t)


def test_circuits_on_one_lane_of_a_fast_link_do_not_overlap() -> None:
    fab, topo = _two_leaves(2 * BW)
    d = Demand(Collective.BROADCAST, (0, 1, 2, 3, 4), 1000, chunks=1)
    t = 3 * ALPHA / 2 + 1000 / BW
    # the uplink's sources 0, 1, 4 take lanes 0, 1, 0: 0->2 and 4->3 share a lane
    rows = [(0, 0, 0, 2, 0, 0.0, t, Op.COPY), (0, 0, 4, 3, 2, 0.0, t, Op.COPY),
            (0, 0, 1, 3, 1, 2 * t, 3 * t, Op.COPY)]
    v = verify(make(fab, topo, d, rows))
    assert v.counts["overlap"] == 1 and any("fabric link 10" in e for e in v.errors), v.errors
