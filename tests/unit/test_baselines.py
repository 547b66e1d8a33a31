"""Every baseline, on every collective it supports, produces a schedule that verifies, on
small ring, fully-connected, mesh and switch fabrics built by hand; known times hold."""

from __future__ import annotations

import pytest

from choreo.baselines import (
    BASELINES,
    BaselineUnavailable,
    baselines_for,
    btree_parents,
    dtree_parents,
    run_baseline,
    unavailable_reason,
)
from choreo.collectives import Collective, Demand
from choreo.simulate import simulate
from choreo.topology import Link, NodeKind, Topology, duplex
from choreo.verify import verify

ALPHA, BW = 1e-6, 1e9


def ring(n: int, bidirectional: bool = True) -> Topology:
    links: list[Link] = []
    for v in range(n):
        if bidirectional:
            links.extend(duplex(v, (v + 1) % n, ALPHA, BW))
        else:
            links.append(Link(v, (v + 1) % n, ALPHA, BW))
    return Topology(f"ring-{n}", (NodeKind.NPU,) * n, tuple(links))


def fc(n: int) -> Topology:
    links = [Link(a, b, ALPHA, BW) for a in range(n) for b in range(n) if a != b]
    return Topology(f"fc-{n}", (NodeKind.NPU,) * n, tuple(links))


def mesh(x: int, y: int) -> Topology:
    links: list[Link] = []
    for j in range(y):
        for i in range(x):
            v = i + x * j
            if i + 1 < x:
                links.extend(duplex(v, v + 1, ALPHA, BW))
            if j + 1 < y:
                links.extend(duplex(v, v + x, ALPHA, BW))
    return Topology(f"mesh-{x}x{y}", (NodeKind.NPU,) * (x * y), tuple(links), dims=(x, y))


def two_hosts(per: int) -> Topology:
    """Two hosts of ``per`` NPUs on a host switch each, joined by one spine switch."""
    n = 2 * per
    kinds = (NodeKind.NPU,) * n + (NodeKind.SWITCH,) * 3
    names = (*tuple(f"h{v // per}/gpu{v % per}" for v in range(n)), "h0/sw", "h1/sw", "spine")
    links: list[Link] = []
    for v in range(n):
        links.extend(duplex(v, n + v // per, ALPHA / 2, 4 * BW))
        links.extend(duplex(v, n + 2, ALPHA / 2, BW))
    return Topology("two-hosts", kinds, tuple(links), names=names)


FABRICS = [ring(5), ring(4, bidirectional=False), fc(4), mesh(3, 2), two_hosts(3)]


@pytest.mark.parametrize("fabric", FABRICS, ids=lambda f: f.name)
@pytest.mark.parametrize("collective", list(Collective), ids=lambda c: c.value)
def test_every_baseline_verifies(fabric: Topology, collective: Collective) -> None:
    ranks = tuple(fabric.npus)
    for chunks in (1, 3):
        d = Demand(collective, ranks, 1 << 16, chunks=chunks, root=1)
        names = baselines_for(d, fabric)
        assert {"ring", "direct"} <= set(names)
        for name in names:
            s = run_baseline(name, fabric, d)
            v = verify(s)
            assert v.ok, (name, chunks, v.errors[:3])
            assert s.engine == name
            assert simulate(s).makespan == pytest.approx(s.makespan)


def test_subset_tenant_with_relays() -> None:
    fabric = mesh(3, 3)
    d = Demand(Collective.ALLREDUCE, (0, 2, 6, 8), 1 << 12, chunks=2)
    for name in ("ring", "direct", "rhd", "dbt"):
        assert verify(run_baseline(name, fabric, d)).ok


@pytest.mark.parametrize("n", [3, 4, 6])
def test_ring_allreduce_takes_2n_minus_2_link_times(n: int) -> None:
    fabric = ring(n, bidirectional=False)
    d = Demand(Collective.ALLREDUCE, tuple(range(n)), 1 << 20)
    t = ALPHA + d.chunk_bytes / BW
    assert run_baseline("ring", fabric, d).makespan == pytest.approx(2 * (n - 1) * t)


def test_ring_allgather_and_direct_on_fc() -> None:
    n = 5
    d = Demand(Collective.ALLGATHER, tuple(range(n)), 1 << 20)
    t = ALPHA + d.chunk_bytes / BW
    assert run_baseline("ring", ring(n, False), d).makespan == pytest.approx((n - 1) * t)
    assert run_baseline("direct", fc(n), d).makespan == pytest.approx(t)


def test_switch_sends_are_circuits_through_ports() -> None:
    fabric = two_hosts(2)
    d = Demand(Collective.ALLGATHER, tuple(range(4)), 1 << 16)
    s = run_baseline("direct", fabric, d)
    used = {s.topology.links[i] for i in set(s.link.tolist())}
    assert all(len(lk.via) == 2 for lk in used)
    assert all(lk.bandwidth in (BW, 4 * BW) for lk in used)


def test_hierarchical_uses_hosts_or_dims_and_explains_otherwise() -> None:
    d = Demand(Collective.ALLREDUCE, tuple(range(4)), 1 << 16)
    assert unavailable_reason("hierarchical", fc(4), d) is not None
    assert "hierarchical" not in baselines_for(d, fc(4))
    with pytest.raises(BaselineUnavailable, match="no dims"):
        run_baseline("hierarchical", fc(4), d)
    assert unavailable_reason("hierarchical", two_hosts(2), d) is None
    ragged = Demand(Collective.ALLREDUCE, (0, 1, 2), 1 << 16)
    assert "grid" in (unavailable_reason("hierarchical", mesh(2, 2), ragged) or "")


def test_unsupported_pairs_are_reported() -> None:
    d = Demand(Collective.ALLTOALL, (0, 1, 2), 1 << 12)
    assert baselines_for(d) == ["ring", "direct"]
    with pytest.raises(BaselineUnavailable, match="not defined"):
        run_baseline("dbt", fc(3), d)
    assert set(BASELINES) == {"ring", "direct", "rhd", "dbt", "hierarchical"}


@pytest.mark.parametrize("n", range(2, 20))
def test_double_binary_tree_shapes(n: int) -> None:
    for parent in (btree_parents(n), *dtree_parents(n)):
        assert parent.count(-1) == 1
        assert all(sum(1 for p in parent if p == v) <= 2 for v in range(n))
        for v in range(n):  # every node reaches the root
            seen = 0
            while parent[v] >= 0:
                v = parent[v]
                seen += 1
                assert seen <= n
    t0, t1 = dtree_parents(n)
    if n > 2:
        assert t0 != t1
