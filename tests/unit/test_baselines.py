"""Every baseline, on every collective it supports, produces a schedule that verifies, on
small ring, fully-connected, mesh and switch fabrics built by hand; known times hold."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from choreo import baselines
from choreo.baselines import (
    BASELINES,
    BaselinePaths,
    BaselineUnavailable,
    baseline_makespan,
    baselines_for,
    btree_parents,
    dtree_parents,
    run_baseline,
    unavailable_reason,
)
from choreo.collectives import Collective, Demand
from choreo.generators import dgx_h100_spine
from choreo.resources import link_model
from choreo.schedule import Op
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


@pytest.mark.parametrize("fabric", [*FABRICS, mesh(3, 3)], ids=lambda f: f.name)
def test_reported_time_is_the_simulated_schedules(fabric: Topology) -> None:
    """What a report prints (``baseline_makespan``: routed and timed as columns) is exactly
    the makespan of the baseline's simulated schedule, also for a tenant whose routes relay
    through NPUs outside it."""
    tenants = [tuple(fabric.npus), tuple(fabric.npus[::2])]
    for ranks, collective, chunks in itertools.product(tenants, Collective, (1, 3)):
        if len(ranks) < 2:
            continue
        d = Demand(collective, ranks, 3 << 14, chunks=chunks, root=1)
        paths = BaselinePaths(fabric, d)
        for name in baselines_for(d, fabric):
            want = simulate(run_baseline(name, fabric, d)).makespan
            assert baseline_makespan(name, fabric, d, paths) == want, (name, ranks, chunks)
            assert baseline_makespan(name, fabric, d) == want


@pytest.mark.parametrize("collective", [Collective.ALLGATHER, Collective.ALLREDUCE])
def test_reported_time_is_the_simulated_schedules_on_a_fabric_with_lanes(
        collective: Collective) -> None:
    """Uplinks twice as fast as a NIC carry two circuits at once (``choreo.resources``),
    in the reported time as in the simulator."""
    fabric = dgx_h100_spine(2, 2, oversubscription=1.0)
    d = Demand(collective, tuple(fabric.npus), 1 << 20, chunks=1)
    for name in baselines_for(d, fabric):
        s = run_baseline(name, fabric, d)
        used = np.unique(s.link)
        assert link_model(s.topology, fabric, used).lanes == 2
        assert baseline_makespan(name, fabric, d) == simulate(s).makespan, name


def test_reported_time_on_a_fabric_of_logical_links() -> None:
    base = fc(4)
    fabric = base.with_links(replace(lk, via=(i,)) for i, lk in enumerate(base.links))
    d = Demand(Collective.ALLREDUCE, (0, 1, 2, 3), 1 << 16, chunks=2)
    for name in baselines_for(d, fabric):
        want = simulate(run_baseline(name, fabric, d)).makespan
        assert baseline_makespan(name, fabric, d) == want


def _rhd_sends(d: Demand) -> list[tuple[int, int, int, int, int]]:
    """Recursive halving/doubling as the textbook loop: (step, src, dst, chunk, op)."""
    n, k, c = d.n, d.chunks, d.collective
    p = 1 << (n.bit_length() - 1)
    extra = n - p
    owned = [[i] + ([p + i] if i < extra else []) for i in range(p)]
    out: list[tuple[int, int, int, int, int]] = []

    def pieces(step: int, src: int, dst: int, which: list[int], op: Op) -> None:
        out.extend((step, src, dst, x * k + j, op) for x in which for j in range(k))

    def block(lo: int, size: int) -> list[int]:
        return [x for v in range(lo, lo + size) for x in owned[v]]

    step = 0
    if extra:
        for i in range(extra):
            if c is Collective.ALLGATHER:
                pieces(step, p + i, i, [p + i], Op.COPY)
            else:
                out.extend((step, p + i, i, x, Op.REDUCE) for x in range(d.num_chunks))
        step += 1
    if c in (Collective.REDUCESCATTER, Collective.ALLREDUCE):
        for lvl in reversed(range(p.bit_length() - 1)):
            dist = 1 << lvl
            for i in range(p):
                pieces(step, i, i ^ dist, block((i ^ dist) & ~(dist - 1), dist), Op.REDUCE)
            step += 1
    if c in (Collective.ALLGATHER, Collective.ALLREDUCE):
        for lvl in range(p.bit_length() - 1):
            dist = 1 << lvl
            for i in range(p):
                pieces(step, i, i ^ dist, block(i & ~(dist - 1), dist), Op.COPY)
            step += 1
    for i in range(extra):
        if c is Collective.REDUCESCATTER:
            pieces(step, i, p + i, [p + i], Op.COPY)
        else:
            keep = [x for x in range(n) if x != p + i or c is not Collective.ALLGATHER]
            pieces(step, i, p + i, keep, Op.COPY)
    return out


def _dbt_sends(d: Demand) -> list[tuple[int, int, int, int, int]]:
    """The double binary tree as the textbook loop, chunk by chunk."""
    n, root, c = d.n, d.root, d.collective
    shift = 0 if c is Collective.ALLREDUCE else root
    trees = []
    for par in dtree_parents(n):
        parent = [-1 if par[(v - shift) % n] < 0 else (par[(v - shift) % n] + shift) % n
                  for v in range(n)]
        trees.append((parent, *baselines._shape(parent)))
    out: list[tuple[int, int, int, int, int]] = []
    for ch in range(d.num_chunks):
        parent, troot, height, depth = trees[ch % 2]
        j, top = ch // 2, height[troot]
        kids = [v for v in range(n) if parent[v] >= 0]
        if c in (Collective.ALLREDUCE, Collective.REDUCE):
            out.extend((j + height[v], v, parent[v], ch, Op.REDUCE) for v in kids)
        if c is Collective.ALLREDUCE:
            out.extend((j + top + depth[v] - 1, parent[v], v, ch, Op.COPY) for v in kids)
        if c is Collective.REDUCE and troot != root:
            out.append((j + top, troot, root, ch, Op.COPY))
        if c is Collective.BROADCAST:
            lead = int(troot != root)
            if lead:
                out.append((j, root, troot, ch, Op.COPY))
            out.extend((j + lead + depth[v] - 1, parent[v], v, ch, Op.COPY)
                       for v in kids if v != root)
    return out


@pytest.mark.parametrize("n", [*range(2, 18), 33])
def test_vectorized_plans_send_in_the_textbook_order(n: int) -> None:
    """The simulator serves a link in planned order with ties by index, so the plans must
    list their sends exactly as the per-rank, per-chunk loops do."""
    for collective, chunks, root in itertools.product(Collective, (1, 2, 3), (0, 1, n - 1)):
        d = Demand(collective, tuple(range(n)), 1 << 16, chunks=chunks, root=root)
        for name, loop in (("rhd", _rhd_sends), ("dbt", _dbt_sends)):
            if collective not in baselines.SUPPORT[name]:
                continue
            plan = baselines._Plan(d)
            getattr(baselines, f"_{name}")(plan)
            got = np.stack(plan.columns(), axis=1).tolist()
            assert got == [list(map(int, row)) for row in loop(d)], (name, collective, chunks)


def test_a_baseline_too_large_to_time_is_left_out_before_its_sends_exist(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A textbook ring AllGather on 16,384 GPUs is 268 M sends (it grew past 15 GiB): such a
    baseline is unavailable, and the report goes on with the others and the NCCL model."""
    from choreo.generators import build
    from choreo.report import evaluate
    from choreo.synth import SynthOptions, synthesize

    fabric = build("dgx-h100-2")
    demand = Demand(Collective.ALLGATHER, tuple(fabric.npus), 16 << 20, 1)
    monkeypatch.setattr(baselines, "MAX_SENDS", 16 * 15 - 1)  # one chunk to 15 ranks each
    with pytest.raises(BaselineUnavailable, match="240 sends"):
        baseline_makespan("ring", fabric, demand)
    tenant = evaluate(synthesize(fabric, [demand], SynthOptions(relay=False))).tenants[0]
    assert set(tenant.baselines) == {"nccl"}
    monkeypatch.setattr(baselines, "MAX_SENDS", 16 * 15)
    assert baseline_makespan("ring", fabric, demand) > 0
