"""Switch unwinding: shares, via paths, degrees, diameter, failures, circuits."""

from __future__ import annotations

import itertools
import math
import time
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from choreo.errors import InputError
from choreo.generators import build
from choreo.topology import Link, NodeKind, Topology, duplex
from choreo.transforms import fail_links, fail_npus
from choreo.unwind import (
    candidate_degrees,
    circuits,
    circulant_offsets,
    default_degree,
    hop_diameter,
    is_fractional,
    switch_groups,
    unwind,
)

SWITCHED = ["switch-8", "switch2d-8x4", "3d-rfs-32", "dgx2-2", "ndv2-3", "dgx-h100-3"]


def check_via(parent: Topology, logical: Topology) -> None:
    for link in logical.links:
        assert link.via, link
        path = [parent.links[i] for i in link.via]
        assert path[0].src == link.src and path[-1].dst == link.dst
        for a, b in itertools.pairwise(path):
            assert a.dst == b.src
        assert all(not parent.is_npu(x.dst) for x in path[:-1])
        assert link.alpha == pytest.approx(sum(x.alpha for x in path))
        assert link.bandwidth <= min(x.bandwidth for x in path) * (1 + 1e-12)


@pytest.mark.parametrize("spec", SWITCHED)
@pytest.mark.parametrize("degree", [1, 2, 3, None])
def test_unwound_fabrics_keep_ids_and_conserve_port_bandwidth(
    spec: str, degree: int | None
) -> None:
    topo = build(spec)
    u = unwind(topo, degree)
    assert u.kinds == topo.kinds
    assert all(topo.is_npu(x.src) and topo.is_npu(x.dst) for x in u.links)
    check_via(topo, u)
    u.check_connected(u.npus)
    for v in topo.npus:
        assert u.egress_bandwidth(v) == pytest.approx(topo.egress_bandwidth(v))
        assert u.ingress_bandwidth(v) == pytest.approx(topo.ingress_bandwidth(v))


def test_single_switch_degree_and_share() -> None:
    topo = build("switch-16")
    for d in (1, 2, 4, 15):
        u = unwind(topo, d)
        assert len(u.links) == 16 * d
        assert set(Counter(x.src for x in u.links).values()) == {d}
        assert set(Counter(x.dst for x in u.links).values()) == {d}
        assert [x.bandwidth for x in u.links] == pytest.approx([50e9 / d] * len(u.links))
        assert [x.alpha for x in u.links] == pytest.approx([0.5e-6] * len(u.links))
        assert all(len(x.via) == 2 for x in u.links)
    assert len(unwind(topo, 99).links) == 16 * 15  # capped at m-1


def test_degree_one_is_a_unidirectional_ring_at_full_bandwidth() -> None:
    u = unwind(build("switch-4"), 1)
    assert sorted((x.src, x.dst) for x in u.links) == [(0, 1), (1, 2), (2, 3), (3, 0)]
    assert all(x.bandwidth == 50e9 for x in u.links)
    assert not any(is_fractional(build("switch-4"), x) for x in u.links)


def test_direct_links_are_kept_with_their_own_index() -> None:
    topo = build("3d-rfs-16")
    u = unwind(topo, 1)
    direct = [x for x in u.links if len(x.via) == 1]
    assert len(direct) == sum(1 for x in topo.links if topo.is_npu(x.src) and topo.is_npu(x.dst))
    assert all(
        topo.links[x.via[0]] == Link(x.src, x.dst, x.alpha, x.bandwidth, x.kind) for x in direct
    )


def test_unwinding_is_idempotent() -> None:
    once = unwind(build("dgx-h100-2"), 2)
    assert unwind(once, 2).links == once.links


def test_invalid_degree() -> None:
    with pytest.raises(InputError, match="degree"):
        unwind(build("switch-4"), 0)


def test_fractional_rule() -> None:
    topo = build("switch-8")
    assert all(is_fractional(topo, x) for x in unwind(topo, 2).links)
    assert not any(is_fractional(topo, x) for x in circuits(topo).links)


def test_circuits_full_bandwidth_between_every_pair() -> None:
    topo = build("dgx-h100-2")
    c = circuits(topo)
    check_via(topo, c)
    pairs = Counter((x.src, x.dst) for x in c.links if len(x.via) == 2)
    # 8 GPUs per NVSwitch: 2 * 8 * 7 ordered pairs; 8 rails of 2 GPUs: 8 * 2
    assert sum(pairs.values()) == 2 * 56 + 16
    nv = [x for x in c.links if x.kind == "nvswitch"]
    assert {x.bandwidth for x in nv} == {370e9}  # the preset's achievable port rate


@pytest.mark.parametrize(
    ("m", "d"), [(8, 2), (16, 2), (64, 2), (64, 3), (64, 4), (128, 7), (100, 5)]
)
def test_offsets_beat_consecutive_diameter(m: int, d: int) -> None:
    offsets = circulant_offsets(m, d)
    assert len(set(offsets)) == d and all(0 < s < m for s in offsets)
    topo = Topology(
        "sw",
        (NodeKind.NPU,) * m + (NodeKind.SWITCH,),
        tuple(x for v in range(m) for x in duplex(v, m, 0.0, 1.0)),
    )
    diameter = hop_diameter(unwind(topo, d))
    assert diameter <= math.ceil((m - 1) / d)  # never worse than TACOS' 1..d
    b = math.ceil(m ** (1 / d) - 1e-9)
    assert diameter <= d * (b - 1)  # mixed-radix bound


def test_offsets_small_cases() -> None:
    assert circulant_offsets(4, 1) == (1,)
    assert sorted(circulant_offsets(4, 3)) == [1, 2, 3]
    assert circulant_offsets(64, 2) != (1, 2)


def test_candidate_and_default_degrees() -> None:
    assert candidate_degrees(2) == [1]
    assert candidate_degrees(8) == [1, 2, 4, 7]
    assert candidate_degrees(16) == [1, 2, 4, 8, 15]
    assert candidate_degrees(128) == [1, 2, 4, 8, 16]
    assert candidate_degrees(1) == []
    assert default_degree(64) == 6 and default_degree(2) == 1


def test_multi_level_switch_group() -> None:
    """Two leaf switches joined by two parallel spine links: one group, paths leaf-leaf."""
    n = 8
    kinds = (NodeKind.NPU,) * n + (NodeKind.SWITCH,) * 2
    links: list[Link] = []
    for v in range(n):
        links += duplex(v, n + v // 4, 0.1, 100.0)
    links += [*duplex(n, n + 1, 0.2, 100.0), *duplex(n, n + 1, 0.2, 100.0)]
    topo = Topology("leafspine", kinds, tuple(links))
    groups = switch_groups(topo)
    assert len(groups) == 1 and groups[0].members == tuple(range(8))
    u = unwind(topo, 4)
    check_via(topo, u)
    cross = [x for x in u.links if (x.src < 4) != (x.dst < 4)]
    assert cross and all(len(x.via) == 3 for x in cross)
    trunk_use = Counter(
        i for x in cross for i in x.via if topo.links[i].src >= n and topo.links[i].dst >= n
    )
    assert len(trunk_use) == 4 and max(trunk_use.values()) - min(trunk_use.values()) <= 1
    # each trunk carries its share: per-link bandwidth never exceeds trunk/load
    for x in cross:
        assert x.bandwidth <= 100.0 / max(trunk_use[i] for i in x.via if i in trunk_use) + 1e-9
    for v in range(n):
        assert u.egress_bandwidth(v) <= 100.0 + 1e-9


def test_failed_npu_and_port_are_left_out() -> None:
    topo = build("switch-8")
    dead = fail_npus(topo, [3])
    u = unwind(dead, 2)
    assert all(3 not in (x.src, x.dst) for x in u.links)
    assert Counter(x.src for x in u.links) == Counter({v: 2 for v in range(8) if v != 3})
    u.check_connected(u.npus)
    port = next(i for i in topo.out_links(5))
    u2 = unwind(fail_links(topo, [port]), 2)
    assert all(5 not in (x.src, x.dst) for x in u2.links)
    assert all(port not in x.via for x in u2.links)


@settings(max_examples=30, deadline=None)
@given(m=st.integers(2, 40), d=st.integers(1, 8), bw=st.floats(1.0, 1e12))
def test_single_switch_property(m: int, d: int, bw: float) -> None:
    topo = build(f"switch-{m}", bandwidth=bw)
    u = unwind(topo, d)
    u.check_connected(u.npus)
    eff = min(d, m - 1)
    assert len(u.links) == m * eff
    for v in u.npus:
        assert u.egress_bandwidth(v) == pytest.approx(bw)
    assert all(0 <= i < len(topo.links) for x in u.links for i in x.via)


def test_large_unwind_stays_near_linear() -> None:
    """A guard against a quadratic blow-up, not a timing: the benchmark measures the speed."""
    topo = build("3d-rfs-1024")
    start = time.perf_counter()
    u = unwind(topo, 4)
    assert time.perf_counter() - start < 20.0
    assert len(u.links) == 4096 + 8 * 128 * 4


def test_a_logical_link_that_splits_an_uplink_is_a_share_not_a_circuit() -> None:
    """NPUs 0 and 2 under leaf 4, 1 and 3 under leaf 5, the leaves on spine 6 by uplinks as
    fast as two ports: at degree 1 every NPU's one link crosses the spine, two per uplink.
    Each gets its whole port and half an uplink, as fast as its slowest link, but a circuit
    would hold the uplink alone."""
    port, up = 46e9, 92e9
    links = [*duplex(0, 4, 1e-6, port), *duplex(2, 4, 1e-6, port), *duplex(1, 5, 1e-6, port),
             *duplex(3, 5, 1e-6, port), *duplex(4, 6, 1e-6, up), *duplex(5, 6, 1e-6, up)]
    topo = Topology("two-leaves", (NodeKind.NPU,) * 4 + (NodeKind.SWITCH,) * 3, tuple(links))
    logical = unwind(topo, 1)
    assert len(logical.links) == 4
    for link in logical.links:
        assert link.bandwidth == pytest.approx(port, rel=1e-5)
        assert is_fractional(topo, link), link
