"""Lower bounds: known closed forms, and never above what a verified baseline achieves."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from choreo.baselines import baselines_for, run_baseline
from choreo.bounds import crossing_bytes, lower_bound
from choreo.collectives import Collective, Demand
from choreo.topology import Link, NodeKind, Topology, duplex
from choreo.verify import verify

ALPHA, BW, S = 1e-6, 1e9, 1 << 20


def uniring(n: int) -> Topology:
    return Topology("uniring", (NodeKind.NPU,) * n,
                    tuple(Link(i, (i + 1) % n, ALPHA, BW) for i in range(n)))


def fc(n: int) -> Topology:
    links = [Link(a, b, ALPHA, BW) for a in range(n) for b in range(n) if a != b]
    return Topology("fc", (NodeKind.NPU,) * n, tuple(links))


def test_allgather_on_unidirectional_ring() -> None:
    n = 6
    b = lower_bound(uniring(n), Demand(Collective.ALLGATHER, tuple(range(n)), S))
    assert b.bandwidth_s == pytest.approx((n - 1) / n * S / BW)
    assert b.latency_s == pytest.approx((n - 1) * ALPHA)
    assert b.value_s == max(b.bandwidth_s, b.latency_s)
    assert "into" in b.reason


def test_allreduce_patarasuk_yuan_on_fully_connected() -> None:
    n = 4
    b = lower_bound(fc(n), Demand(Collective.ALLREDUCE, tuple(range(n)), S))
    assert b.bandwidth_s == pytest.approx(2 * (n - 1) / n * S / ((n - 1) * BW))
    assert "land on NPUs" in b.reason


def test_helpers_weaken_allreduce_volume_but_not_per_rank_need() -> None:
    links: list[Link] = []
    for v in range(4):
        links.extend(duplex(v, (v + 1) % 4, ALPHA, BW))
    ring4 = Topology("ring4", (NodeKind.NPU,) * 4, tuple(links))
    b = lower_bound(ring4, Demand(Collective.ALLREDUCE, (0, 2), S))
    assert b.bandwidth_s == pytest.approx(S / (2 * BW))  # each rank must receive S


def test_broadcast_max_flow_on_a_line() -> None:
    links = [*duplex(0, 1, ALPHA, BW), *duplex(1, 2, ALPHA, 2 * BW)]
    line = Topology("line", (NodeKind.NPU,) * 3, tuple(links))
    b = lower_bound(line, Demand(Collective.BROADCAST, (0, 1, 2), S))
    assert b.bandwidth_s == pytest.approx(S / BW)
    assert b.latency_s == pytest.approx(2 * ALPHA)


def test_switch_down_links_count_at_port_bandwidth() -> None:
    links: list[Link] = []
    for v in range(4):
        links.extend(duplex(v, 4, ALPHA / 2, BW))
    star = Topology("star", (NodeKind.NPU,) * 4 + (NodeKind.SWITCH,), tuple(links))
    b = lower_bound(star, Demand(Collective.ALLGATHER, tuple(range(4)), S))
    assert b.bandwidth_s == pytest.approx(3 / 4 * S / BW)
    assert b.latency_s == pytest.approx(ALPHA)


def test_host_cut() -> None:
    names = tuple(f"h{v // 2}/g{v % 2}" for v in range(4))
    links = [*duplex(0, 1, ALPHA, 10 * BW), *duplex(2, 3, ALPHA, 10 * BW),
             *duplex(0, 2, ALPHA, BW), *duplex(1, 3, ALPHA, BW)]
    topo = Topology("hosts", (NodeKind.NPU,) * 4, tuple(links), names=names)
    b = lower_bound(topo, Demand(Collective.ALLREDUCE, tuple(range(4)), S))
    assert b.bandwidth_s == pytest.approx(S / (2 * BW))
    assert "host h" in b.reason


def test_joint_bound_adds_tenants() -> None:
    n = 4
    one = Demand(Collective.ALLGATHER, tuple(range(n)), S)
    solo = lower_bound(uniring(n), one)
    both = lower_bound(uniring(n), one, [Demand(Collective.ALLGATHER, tuple(range(n)), S)])
    assert both.bandwidth_s == pytest.approx(2 * solo.bandwidth_s)


@pytest.mark.parametrize("collective", list(Collective))
def test_crossing_bytes_of_whole_tenant_is_zero(collective: Collective) -> None:
    d = Demand(collective, (0, 1, 2), S)
    assert crossing_bytes(d, 3, True) == (0.0, 0.0)
    assert crossing_bytes(d, 0, False) == (0.0, 0.0)


@st.composite
def fabrics(draw: st.DrawFn) -> Topology:
    """Small connected fabrics: a random spanning tree plus extra cables, random costs."""
    n = draw(st.integers(3, 6))
    edges = {(draw(st.integers(0, v - 1)), v) for v in range(1, n)}
    for _ in range(draw(st.integers(0, n))):
        a, b = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
        if a != b:
            edges.add((min(a, b), max(a, b)))
    links: list[Link] = []
    for a, b in sorted(edges):
        bw = draw(st.sampled_from([0.5e9, 1e9, 4e9]))
        alpha = draw(st.sampled_from([0.0, 1e-7, 1e-6]))
        links.extend(duplex(a, b, alpha, bw))
    return Topology("random", (NodeKind.NPU,) * n, tuple(links))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fabric=fabrics(), data=st.data())
def test_bound_never_exceeds_a_verified_baseline(fabric: Topology, data: st.DataObject) -> None:
    n = fabric.num_nodes
    k = data.draw(st.integers(2, n))
    ranks = tuple(data.draw(st.permutations(range(n)))[:k])
    collective = data.draw(st.sampled_from(list(Collective)))
    d = Demand(collective, ranks, data.draw(st.sampled_from([1 << 10, 1 << 20])),
               chunks=data.draw(st.integers(1, 2)), root=data.draw(st.integers(0, k - 1)))
    bound = lower_bound(fabric, d)
    assert bound.value_s > 0
    for name in baselines_for(d, fabric):
        s = run_baseline(name, fabric, d)
        assert verify(s).ok
        assert bound.value_s <= s.makespan * (1 + 1e-9), (name, bound, s.makespan)
