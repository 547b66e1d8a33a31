"""Lower bounds: known closed forms, and never above what a verified baseline achieves."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from choreo.baselines import baselines_for, run_baseline
from choreo.bounds import chunk_needs, crossing_bytes, lower_bound
from choreo.collectives import Collective, Demand
from choreo.generators import build
from choreo.portfolio import solve
from choreo.report import evaluate
from choreo.simulate import simulate
from choreo.synth import SynthOptions, synthesize
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
    # each of the n-1 chunks pays alpha on the one in-link
    assert b.transfers_s == pytest.approx((n - 1) * (ALPHA + S / n / BW))
    assert b.value_s == max(b.bandwidth_s, b.latency_s, b.transfers_s)
    assert "into" in b.reason


def test_allreduce_patarasuk_yuan_on_fully_connected() -> None:
    n = 4
    b = lower_bound(fc(n), Demand(Collective.ALLREDUCE, tuple(range(n)), S))
    assert b.bandwidth_s == pytest.approx(2 * (n - 1) / n * S / ((n - 1) * BW))
    # the same 2(n-1) landings per chunk, counted in transfers: 2 per link, each with alpha
    assert b.transfers_s == pytest.approx(b.bandwidth_s + 2 * ALPHA)
    assert "gossip" in b.reason


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


# ---- transfers: every chunk pays its link's alpha ------------------------------------------
def _link_time(fabric: Topology, d: Demand) -> float:
    return fabric.links[0].cost(d.chunk_bytes)


@pytest.mark.parametrize(("name", "degree"), [("ring-6", 2), ("torus-4x4", 4),
                                              ("hypercube-2x2x2", 3), ("torus-32x32", 4)])
def test_one_chunk_allgather_needs_ceil_n_minus_1_over_degree_link_times(
        name: str, degree: int) -> None:
    fabric = build(name)
    n = len(fabric.npus)
    d = Demand(Collective.ALLGATHER, tuple(fabric.npus), n * 1024)
    b = lower_bound(fabric, d)
    steps = -(-(n - 1) // degree)
    assert b.transfers_s == pytest.approx(steps * _link_time(fabric, d), rel=1e-6)
    assert b.value_s == b.transfers_s > max(b.bandwidth_s, b.latency_s)
    assert b.reason.startswith(f"{n - 1} chunk transfers into")
    # the bound is on the collective, not on its chunking: more chunks only add alphas
    finer = lower_bound(fabric, Demand(Collective.ALLGATHER, tuple(fabric.npus), n * 1024, 3))
    assert finer.value_s == pytest.approx(b.value_s)


def test_reducescatter_is_the_mirror_image() -> None:
    fabric = build("torus-4x4")
    d = Demand(Collective.REDUCESCATTER, tuple(fabric.npus), 16 * 1024)
    b = lower_bound(fabric, d)
    assert b.transfers_s == pytest.approx(4 * _link_time(fabric, d))  # ceil(15 / 4) sends
    assert "out of" in b.reason


def test_allreduce_needs_the_gossip_landings() -> None:
    """2(n-1) landings per chunk over 4n in-links: ceil(2 * 15 * 16 / 64) = 8 link times,
    where each rank alone only needs its n chunks (4 link times)."""
    fabric = build("torus-4x4")
    d = Demand(Collective.ALLREDUCE, tuple(fabric.npus), 16 * 1024)
    b = lower_bound(fabric, d)
    assert b.transfers_s == pytest.approx(8 * _link_time(fabric, d))
    assert "gossip" in b.reason


def test_no_transfer_bound_where_it_is_not_claimed() -> None:
    # switch ports carry fractional shares side by side: nothing beyond the bandwidth cuts
    star_links: list[Link] = []
    for v in range(4):
        star_links.extend(duplex(v, 4, ALPHA, BW))
    star = Topology("star", (NodeKind.NPU,) * 4 + (NodeKind.SWITCH,), tuple(star_links))
    assert lower_bound(star, Demand(Collective.ALLGATHER, tuple(range(4)), 4096)).transfers_s == 0
    # all-reduce across hosts may get the rail-hierarchical plan, which moves chunk ranges
    names = tuple(f"h{v // 2}/g{v % 2}" for v in range(4))
    links = [*duplex(0, 1, ALPHA, 10 * BW), *duplex(2, 3, ALPHA, 10 * BW),
             *duplex(0, 2, ALPHA, BW), *duplex(1, 3, ALPHA, BW)]
    hosts = Topology("hosts", (NodeKind.NPU,) * 4, tuple(links), names=names)
    assert chunk_needs(Demand(Collective.ALLREDUCE, tuple(range(4)), S), hosts) is None
    assert lower_bound(hosts, Demand(Collective.ALLREDUCE, tuple(range(4)), 4096)).transfers_s == 0
    # in-network reduction: partial sums need not land, so no gossip count
    nvls = build("dgx-h100-1")
    needs = chunk_needs(Demand(Collective.ALLREDUCE, tuple(nvls.npus), S), nvls)
    assert needs is not None and needs.landings == 0


def test_parallel_cables_pick_the_best_chunk_count() -> None:
    """Broadcast over k parallel cables: k chunks of S/k, one per cable, is the best count."""
    def pair(k: int) -> Topology:
        links = [lk for _ in range(k) for lk in duplex(0, 1, ALPHA, BW)]
        return Topology("pair", (NodeKind.NPU,) * 2, tuple(links))

    d = Demand(Collective.BROADCAST, (0, 1), S)
    b = lower_bound(pair(4), d)
    assert b.transfers_s == pytest.approx(ALPHA + S / 4 / BW)
    assert "(4 chunk(s) per piece" in b.reason
    # beyond the counts solved exactly the monotone envelope stands in: still below the truth
    wide = lower_bound(pair(20), d)
    assert S / 20 / BW < wide.transfers_s <= ALPHA + S / 20 / BW
    assert "+" in wide.reason


SMALL_FABRICS = ["ring-6", "torus-4x4", "mesh-3x3", "dgx1", "switch-8", "dgx-h100-2",
                 "hypercube-2x2x2", "3d-rfs-16", "ndv2-2", "uniring-5"]


@pytest.mark.parametrize("name", SMALL_FABRICS)
@pytest.mark.parametrize("chunks", [1, 2])
def test_bound_never_exceeds_a_synthesized_schedule(name: str, chunks: int) -> None:
    """Every collective, in the alpha-bound regime (1 KiB chunks) and beyond it."""
    fabric = build(name)
    ranks = tuple(fabric.npus)
    for collective in Collective:
        for size in (1 << 12, 1 << 20):
            d = Demand(collective, ranks, size, chunks, root=len(ranks) // 3)
            sched = synthesize(fabric, [d], SynthOptions(restarts=1))
            assert verify(sched).ok
            bound = lower_bound(fabric, d)
            assert simulate(sched).makespan >= bound.value_s * (1 - 1e-9), (collective, size)


@pytest.mark.parametrize(("name", "collective"), [
    ("ring-6", Collective.ALLGATHER), ("torus-4x4", Collective.ALLREDUCE),
    ("dgx1", Collective.REDUCESCATTER), ("mesh-3x3", Collective.ALLTOALL),
    ("switch-8", Collective.ALLGATHER), ("dgx1", Collective.BROADCAST),
    ("hypercube-2x2x2", Collective.GATHER),
])
def test_bound_never_exceeds_any_engine(name: str, collective: Collective) -> None:
    """engine=auto: greedy with other chunk counts, and the MILP or the LP."""
    fabric = build(name)
    ranks = tuple(fabric.npus)
    d = Demand(collective, ranks, 1 << 14, 1, root=1)
    sched = solve(fabric, [d], engine="auto", deadline_s=3.0)
    assert verify(sched).ok
    bound = lower_bound(fabric, d).value_s
    for cand in sched.meta["portfolio"]["candidates"]:
        if "time" in cand:
            assert cand["time"] >= bound * (1 - 1e-9), cand


def test_a_schedule_moving_chunk_ranges_is_judged_without_the_per_transfer_bound() -> None:
    """One transfer of a chunk range pays alpha once for all of them, so a schedule that
    moves ranges is held to the bandwidth and latency bounds only."""
    from choreo.report import evaluate
    from choreo.schedule import Schedule
    from choreo.synth import synthesize

    fabric = build("torus-4x4")
    d = Demand(Collective.ALLGATHER, tuple(fabric.npus), 1 << 10, chunks=1)
    whole = lower_bound(fabric, d)
    ranged = lower_bound(fabric, d, whole_chunks=False)
    assert whole.transfers_s > 0 and ranged.transfers_s == 0
    assert ranged.value_s == max(ranged.bandwidth_s, ranged.latency_s) < whole.value_s
    sched = synthesize(fabric, [d])
    assert evaluate(sched, baselines=False).tenants[0].bound == whole.value_s
    cols = {c: getattr(sched, c).copy() for c in ("tenant", "chunk", "src", "dst", "link",
                                                  "start", "end", "op", "count")}
    cols["count"][0] = 2  # as a range would read
    moved = Schedule(sched.fabric, sched.topology, sched.demands, **cols)
    assert moved.ranged
    assert evaluate(moved, baselines=False).tenants[0].bound == ranged.value_s


def test_alltoall_bound_sends_size_over_n_to_every_peer() -> None:
    fabric = build("dgx-h100-2")
    d = Demand(Collective.ALLTOALL, tuple(fabric.npus), 16 << 20)
    # every GPU of node0 receives size / 16 from each of node1's 8 GPUs through 8 NICs
    nic = next(lk.bandwidth for lk in fabric.links if lk.kind == "ib")
    into_node = 8 * 8 * (16 << 20) / 16
    assert lower_bound(fabric, d).bandwidth_s == pytest.approx(into_node / (8 * nic), rel=1e-6)


def test_tenants_meeting_on_a_spine_share_its_uplinks() -> None:
    fabric = build("dgx-h100-spine-2x4")  # two blocks of four nodes, leaves under a 2:1 spine
    per_node = [tuple(range(8 * k, 8 * k + 8)) for k in range(8)]
    tenants = [Demand(Collective.ALLREDUCE, per_node[t] + per_node[4 + t], 1 << 30, name=f"t{t}")
               for t in range(4)]  # one node in each block: all of it crosses the spine
    nic = next(lk.bandwidth for lk in fabric.links if lk.kind == "ib")
    uplinks = 8 * 4 * nic / 2  # per block: 8 rail leaves, each half its 4 nodes' NICs up
    bound = lower_bound(fabric, tenants[0], tenants[1:])
    assert bound.value_s == pytest.approx(4 * (1 << 30) / uplinks, rel=1e-6)
    assert "block of node0/gpu0" in bound.reason
    # alone, a tenant is bound by its hosts' NICs, not the spine
    alone = lower_bound(fabric, tenants[0])
    assert alone.value_s <= bound.value_s / 2 + 1e-12 and "block" not in alone.reason


def test_a_tenant_that_ends_first_is_held_to_its_own_bound() -> None:
    """Two tenants, one node in each block of dgx-h100-spine-2x2, whose uplinks are one NIC
    wide: the tenants' joint bound is both their shards through it, which the tenant that
    crosses first beats. Each tenant is reported against its own bound; the one that ends
    last against the joint bound, which its end cannot beat."""
    fabric = build("dgx-h100-spine-2x2")
    demands = [Demand(Collective.ALLGATHER, tuple((b * 2 + t) * 8 + u for b in range(2)
                                                  for u in range(8)), 1 << 30, 1, name=f"t{t}")
               for t in range(2)]
    s = synthesize(fabric, demands, SynthOptions(relay=False))
    ev = evaluate(s, baselines=False)
    first, last = sorted(ev.tenants, key=lambda r: r.time)
    joint = lower_bound(fabric, demands[0], demands[1:], whole_chunks=not s.ranged).value_s
    assert first.time < joint <= last.time
    alone = {d.name: lower_bound(fabric, d, whole_chunks=not s.ranged).value_s
             for d in demands}
    assert first.bound == pytest.approx(alone[first.name])
    assert last.bound == pytest.approx(max(joint, alone[last.name]))
    assert all(0 < r.fraction_of_bound <= 1 for r in ev.tenants)
