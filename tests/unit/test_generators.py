"""Built-in fabrics: shapes, link counts, per-NPU bandwidth, names and bad sizes."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from choreo.errors import InputError
from choreo.generators import DGX1_DOUBLE, DGX1_SINGLE, build, list_builtins, mesh, torus
from choreo.topology import NodeKind, Topology

GB = 1e9

SMALL = [
    "ring-8",
    "ring-2",
    "uniring-5",
    "fc-6",
    "mesh-5x5",
    "mesh-3x3x3",
    "torus-4x4",
    "torus-2x3",
    "torus-4x4x4",
    "hypercube-4x4",
    "hypercube-2x2x2",
    "switch-16",
    "switch2d-8x4",
    "3d-rfs-8",
    "3d-rfs-16",
    "3d-rfs-64",
    "dragonfly-4x5",
    "dragonfly-7x8",
    "dragonfly-2x6",
    "dgx1",
    "dgx2",
    "dgx2-2",
    "ndv2-1",
    "ndv2-3",
    "dgx-h100",
    "dgx-h100-4",
    "mi250",
]


def in_degrees(topo: Topology) -> Counter[int]:
    return Counter(link.dst for link in topo.links)


@pytest.mark.parametrize("spec", SMALL)
def test_every_builtin_is_valid_and_connected(spec: str) -> None:
    topo = build(spec)
    topo.validate()
    topo.check_connected(topo.npus)
    assert topo.npus == list(range(len(topo.npus))), "NPUs must come first: id == rank"
    assert len(topo.names) == topo.num_nodes
    assert len(set(topo.names)) == topo.num_nodes
    assert all(topo.names[s].split("/")[-1].startswith("sw") for s in topo.switches)
    assert all(not name.split("/")[-1].startswith("sw") for name in topo.names[: len(topo.npus)])


def test_every_listed_shape_builds_from_its_pattern() -> None:
    examples = {"N": "8", "AxB[xC]": "4x4", "AxBxC": "2x2x2", "AxB": "4x2", "AxG": "4x5"}
    for pattern, _ in list_builtins():
        name = pattern.replace("[-K]", "")
        for key, size in examples.items():
            name = name.replace(key, size)
        name = name.replace("-K", "-2")
        assert build(name).npus, pattern


def test_ring_and_uniring_counts() -> None:
    assert len(build("ring-8").links) == 16
    assert len(build("uniring-8").links) == 8
    uni = build("uniring-8")
    assert {(link.src, link.dst) for link in uni.links} == {(i, (i + 1) % 8) for i in range(8)}
    assert len(build("ring-2").links) == 2  # one duplex link, not two


def test_fully_connected() -> None:
    topo = build("fc-8")
    assert len(topo.links) == 56
    assert set(in_degrees(topo).values()) == {7}


def test_torus_4x4_has_64_links_and_in_degree_4() -> None:
    topo = build("torus-4x4")
    assert len(topo.links) == 64
    assert set(in_degrees(topo).values()) == {4}
    assert topo.dims == (4, 4)


def test_torus_3d_and_size_two_dimension() -> None:
    assert set(in_degrees(build("torus-4x4x4")).values()) == {6}
    # dimension of size 2: a single neighbour
    assert set(in_degrees(build("torus-2x4")).values()) == {3}


def test_mesh_degrees() -> None:
    topo = build("mesh-5x5")
    assert len(topo.links) == 2 * 2 * 5 * 4
    deg = in_degrees(topo)
    assert deg[0] == 2 and deg[12] == 4 and deg[2] == 3  # corner, centre, edge
    assert len(build("mesh-4x4x4").links) == 2 * 3 * 16 * 3


def test_grid_rank_order_dimension_zero_fastest() -> None:
    topo = mesh([3, 2])
    pairs = {(link.src, link.dst) for link in topo.links}
    assert (0, 1) in pairs and (0, 3) in pairs and (0, 2) not in pairs


def test_per_dimension_bandwidth() -> None:
    topo = torus([4, 4], bandwidth=[10 * GB, 20 * GB])
    for link in topo.links:
        along_x = abs(link.src - link.dst) in (1, 3)
        assert link.bandwidth == (10 * GB if along_x else 20 * GB)


def test_hypercube_8x8x8_link_count() -> None:
    topo = build("hypercube-8x8x8")
    assert len(topo.npus) == 512
    assert len(topo.links) == 512 * 21
    assert set(in_degrees(topo).values()) == {21}
    assert len(build("hypercube-2x2x2").links) == 24  # the binary 3-cube


def test_switch() -> None:
    topo = build("switch-16")
    assert topo.switches == [16]
    assert len(topo.links) == 32
    assert all(topo.ingress_bandwidth(v) == 50 * GB for v in topo.npus)
    # alpha is the latency through the switch: half on each port
    assert all(link.alpha == pytest.approx(0.25e-6) for link in topo.links)


def test_switch2d() -> None:
    topo = build("switch2d-8x4")
    assert len(topo.npus) == 32 and len(topo.switches) == 4 + 8
    assert all(topo.ingress_bandwidth(v) == pytest.approx(325 * GB) for v in topo.npus)
    rail3 = topo.names.index("sw-rail3")
    assert sorted(topo.links[i].src for i in topo.in_links(rail3)) == [3, 11, 19, 27]


def test_3d_rfs_64_per_npu_bandwidth_and_rails() -> None:
    topo = build("3d-rfs-64")
    assert topo.dims == (2, 4, 8)
    assert len(topo.switches) == 8
    for v in topo.npus:
        assert topo.ingress_bandwidth(v) == pytest.approx((200 + 3 * 100 + 50) * GB)
        assert topo.egress_bandwidth(v) == pytest.approx((200 + 3 * 100 + 50) * GB)
    for r in range(8):
        sw = topo.names.index(f"sw-rail{r}")
        members = sorted(topo.links[i].src for i in topo.in_links(sw))
        assert members == list(range(r, 64, 8))
    assert all(link.alpha <= 0.5e-6 for link in topo.links)


@pytest.mark.parametrize("n", [16, 32, 64, 128, 512, 1024])
def test_3d_rfs_sizes(n: int) -> None:
    topo = build(f"3d-rfs-{n}")
    assert len(topo.npus) == n
    assert topo.dims == (2, 4, n // 8)


def test_dragonfly_global_links() -> None:
    topo = build("dragonfly-4x5")
    glob = [link for link in topo.links if link.bandwidth == 200 * GB]
    assert len(glob) == 2 * (5 * 4 // 2)  # one duplex link per pair of groups
    assert Counter(link.src for link in glob) == Counter({v: 1 for v in range(20)})
    groups = {(link.src // 4, link.dst // 4) for link in glob}
    assert len(groups) == 20 and all(a != b for a, b in groups)


def test_dgx1_exact_links() -> None:
    topo = build("dgx1")
    for v in topo.npus:
        assert topo.ingress_bandwidth(v) == pytest.approx(6 * 25 * GB)
        assert len(topo.out_links(v)) == 6
    pairs = Counter((link.src, link.dst) for link in topo.links)
    for a, b in DGX1_DOUBLE:
        assert pairs[(a, b)] == pairs[(b, a)] == 2
    for a, b in DGX1_SINGLE:
        assert pairs[(a, b)] == pairs[(b, a)] == 1
    assert len(pairs) == 32


def test_dgx1_merged_double_links() -> None:
    topo = build("dgx1", merge_double=True)
    assert len(topo.links) == 32
    assert all(topo.ingress_bandwidth(v) == pytest.approx(150 * GB) for v in topo.npus)


def test_dgx2_multi_node() -> None:
    topo = build("dgx2-2")
    assert len(topo.npus) == 32
    assert topo.names[17] == "node1/gpu1"
    nic = [link for link in topo.links if link.kind == "ib" and topo.is_npu(link.src)]
    assert sorted(link.src for link in nic) == [
        g + 16 * k for k in range(2) for g in range(0, 16, 2)
    ]
    assert all(link.bandwidth == 12.5 * GB for link in nic)
    assert len(build("dgx2").switches) == 1


def test_ndv2_one_nic_per_node() -> None:
    topo = build("ndv2-3")
    nic = [link for link in topo.links if link.kind == "ib" and topo.is_npu(link.src)]
    assert sorted(link.src for link in nic) == [0, 8, 16]
    nvlink = [link for link in topo.links if link.kind == "nvlink"]
    assert nvlink[0].bandwidth == pytest.approx(1e6 / 46e-6)
    assert nvlink[0].alpha == pytest.approx(0.7e-6)


def test_dgx_h100_rails() -> None:
    topo = build("dgx-h100-4")
    assert len(topo.npus) == 32 and len(topo.switches) == 4 + 8
    for v in topo.npus:  # achievable rates: 370 GB/s NVSwitch port (450 nominal), 46 GB/s NIC
        assert topo.egress_bandwidth(v) == pytest.approx((370 + 46) * GB)
    rail = topo.names.index("sw-rail5")
    assert sorted(topo.links[i].src for i in topo.in_links(rail)) == [5, 13, 21, 29]
    assert build("dgx-h100-1").switches == [8]  # one node: no rails


def test_mi250() -> None:
    topo = build("mi250")
    assert len(topo.npus) == 16
    assert all(link.kind == "xgmi" for link in topo.links)
    for v in topo.npus:
        assert topo.egress_bandwidth(v) == pytest.approx(7 * 50 * GB)
        twin = Counter(topo.links[i].dst for i in topo.out_links(v))[v ^ 1]
        assert twin == 4


def test_parameter_overrides_in_name() -> None:
    topo = build("dragonfly-4x5:bandwidth=100e9/10e9,alpha=1e-6")
    assert {link.bandwidth for link in topo.links} == {100 * GB, 10 * GB}
    assert {link.alpha for link in topo.links} == {1e-6}
    assert topo.name == "dragonfly-4x5:bandwidth=100e9/10e9,alpha=1e-6"


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("torus-0x4", "dims[0]"),
        ("3d-rfs-12", "not a multiple of"),
        ("ring-1", "ring size"),
        ("blob-4", "ring-N"),
        ("switch2d-8", "2 dimension"),
        ("dgx1-2", "takes no size"),
        ("mesh-4x4:speed=2", "unknown parameter 'speed'"),
        ("ring-4:bandwidth=-1", "must be positive"),
        ("ring-4:alpha=-1", "non-negative"),
        ("torus-4x4:bandwidth=1/2/3", "expected 2 values"),
        ("ndv2-2:nic_gpu=9", "nic_gpu"),
        ("ring", "needs a size"),
    ],
)
def test_bad_names_are_input_errors(spec: str, needle: str) -> None:
    with pytest.raises(InputError, match=None) as info:
        build(spec)
    assert needle in str(info.value)


def test_big_generators_stay_near_linear() -> None:
    """A guard against a quadratic blow-up (each takes well under a second alone)."""
    for spec in ("3d-rfs-1024", "torus-64x64", "hypercube-8x8x8"):
        start = time.perf_counter()
        topo = build(spec)
        assert time.perf_counter() - start < 10.0, spec
        assert topo.num_nodes > 500


@settings(max_examples=25, deadline=None)
@given(dims=st.lists(st.integers(2, 5), min_size=1, max_size=3))
def test_torus_property(dims: list[int]) -> None:
    topo = torus(dims)
    topo.check_connected(topo.npus)
    per_dim = [2 if d > 2 else 1 for d in dims]
    assert set(in_degrees(topo).values()) == {sum(per_dim)}
    # every link has its reverse
    pairs = Counter((link.src, link.dst) for link in topo.links)
    assert all(pairs[(b, a)] == c for (a, b), c in pairs.items())
    assert all(k is NodeKind.NPU for k in topo.kinds)


@pytest.mark.parametrize(("spec", "needle"), [
    ("torus-100000x100000", "10,000,000,000 NPUs or nodes, more than the 1,048,576"),
    ("dgx-h100-2000000", "more than the 1,048,576"),
    ("fc-10000", "fc size: 99,990,000 links"),
    ("hypercube-64x64x64", "hypercube dims"),
])
def test_fabrics_too_large_for_the_machine_are_refused_before_they_are_built(
        spec: str, needle: str) -> None:
    with pytest.raises(InputError) as info:
        build(spec)
    assert needle in str(info.value)


def test_spine_blocks_meet_on_oversubscribed_uplinks() -> None:
    fabric = build("dgx-h100-spine-2x4")
    assert len(fabric.npus) == 64
    by_name = {name: i for i, name in enumerate(fabric.names)}
    leaf, spine = by_name["block1/rail3"], by_name["spine/rail3"]
    up = [lk for lk in fabric.links if (lk.src, lk.dst) == (leaf, spine)]
    ports = [lk for lk in fabric.links if lk.dst == leaf and fabric.is_npu(lk.src)]
    assert len(up) == 1 and len(ports) == 4  # GPU 3 of the block's four nodes
    assert up[0].bandwidth == sum(p.bandwidth for p in ports) / 2  # 2:1
    assert {fabric.names[p.src] for p in ports} == {f"node{n}/gpu3" for n in range(4, 8)}
    with pytest.raises(InputError, match="blocks"):
        build("dgx-h100-spine-1x4")


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sets(st.integers(0, 63), max_size=6), min_size=1, max_size=3),
       st.sets(st.integers(0, 15), max_size=3))
def test_health_applied_in_turn_marks_exactly_the_links_down(downs: list[set[int]],
                                                             failed: set[int]) -> None:
    """``with_health`` replaces only the links named, keeps the ones already down, and its
    ``broken_links`` is what a look at every link finds."""
    fabric = build("torus-4x4")
    topo, down = fabric, set()
    for d in downs:
        topo = topo.with_health(frozenset(failed), d)
        down |= d
        assert [not lk.healthy for lk in topo.links] == [i in down for i in range(64)]
        assert topo.broken_links == frozenset(down)
        assert [replace(lk, healthy=True) for lk in topo.links] == list(fabric.links)
        assert topo.failed == frozenset(failed) and topo.trunk_links == fabric.trunk_links
