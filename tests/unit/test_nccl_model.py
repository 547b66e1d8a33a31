"""The NCCL model against hand-computed channels, rings, trees and NVLS traffic, NCCL's
documented choices, degraded fabrics and the lower bound."""

from __future__ import annotations

import numpy as np
import pytest

from choreo.bounds import lower_bound
from choreo.collectives import Collective, Demand
from choreo.errors import InputError
from choreo.generators import build
from choreo.nccl import nccl_baseline
from choreo.nccl.channels import build as build_channels
from choreo.nccl.channels import search
from choreo.nccl.fabric import describe
from choreo.nccl.model import nccl_jointly, nvls_chunk_size
from choreo.nccl.schedule import ring_schedule
from choreo.nccl.traffic import sends
from choreo.nccl.tuning import PAT, choose, estimates
from choreo.routing import Router
from choreo.simulate import simulate
from choreo.topology import NodeKind, Topology, duplex
from choreo.verify import verify

C = Collective
GIB = 1 << 30
MIB = 1 << 20
KIB = 1 << 10


def _demand(fabric: Topology, c: Collective = C.ALLREDUCE, size: int = GIB) -> Demand:
    return Demand(c, tuple(fabric.npus), size)


def _channels(name: str):  # type: ignore[no-untyped-def]
    fabric = build(name)
    fab = describe(fabric, fabric.npus)
    return fabric, fab, build_channels(fab, search(fab))


def _rail(fabric: Topology, g: int) -> int:
    return int(fabric.node_name(g).rsplit("gpu", 1)[1])


# ---- channels ---------------------------------------------------------------------------
def test_multi_node_h100_runs_16_channels_two_per_nic_each_way() -> None:
    fabric, _, ch = _channels("dgx-h100-4")
    assert ch.graphs["ring"].n_channels == 8 and ch.graphs["ring"].bw_inter == 45.0
    assert ch.n_channels == 16
    exits = [r[7] for r in ch.rings]  # the GPU that leaves node 0, per channel
    assert sorted(_rail(fabric, g) for g in exits) == sorted(list(range(8)) * 2)


def test_single_node_h100_nvls_uses_16_channels() -> None:
    fabric = build("dgx-h100-1")
    r = nccl_baseline(fabric, _demand(fabric))
    assert (r.algorithm, r.channels) == ("nvls", 16)


def test_ring_order_on_one_node_is_a_rotation() -> None:
    _, _, ch = _channels("dgx-h100-1")
    assert ch.rings[0] == tuple(range(8))
    assert ch.rings[3] == (3, 4, 5, 6, 7, 0, 1, 2)


def test_ring_order_on_two_nodes_is_rail_aligned_and_swapped_on_the_odd_node() -> None:
    _, _, ch = _channels("dgx-h100-2")
    # ring 0 enters node 0 through NIC 0 and leaves through NIC 1; node 1 runs it the
    # other way: in through NIC 1, out through NIC 0, so both hops stay on one rail
    assert ch.rings[0] == (0, 2, 3, 4, 5, 6, 7, 1, 9, 10, 11, 12, 13, 14, 15, 8)
    assert ch.rings[1] == (1, 2, 3, 4, 5, 6, 7, 0, 8, 10, 11, 12, 13, 14, 15, 9)
    assert ch.rings[8] == ch.rings[0]  # connectRings' copy


@pytest.mark.parametrize("name", ["dgx-h100-2", "dgx-h100-4"])
def test_every_hop_between_nodes_stays_on_its_rail(name: str) -> None:
    fabric, _, ch = _channels(name)
    for ring in ch.rings:
        for a, b in zip(ring, ring[1:] + ring[:1], strict=True):
            if a // 8 != b // 8:
                assert _rail(fabric, a) == _rail(fabric, b)


def test_three_nodes_cross_rails_once_per_ring() -> None:
    fabric, _, ch = _channels("dgx-h100-3")
    for ring in ch.rings:
        crossing = [(a, b) for a, b in zip(ring, ring[1:] + ring[:1], strict=True)
                    if a // 8 != b // 8 and _rail(fabric, a) != _rail(fabric, b)]
        assert len(crossing) == 1 and crossing[0][1] < 8  # the wrap back to node 0


@pytest.mark.parametrize(("nodes", "tree0", "tree1"), [
    (2, [-1, 0], [1, -1]),
    (4, [-1, 2, 0, 2], [1, 3, 1, -1]),
    (8, [-1, 2, 4, 2, 0, 6, 4, 6], [1, 3, 1, 7, 5, 3, 5, -1]),
])
def test_double_binary_tree_between_node_heads(nodes: int, tree0: list[int],
                                               tree1: list[int]) -> None:
    _, _, ch = _channels(f"dgx-h100-{nodes}")
    for c, want in ((0, tree0), (8, tree1)):  # channel c < 8: tree 0; its copy: tree 1
        head = ch.rings[0][0]  # channel 0's NIC GPU is local GPU 0 on every node
        got = [ch.tree_parent[c][8 * k + head] for k in range(nodes)]
        assert got == [-1 if p < 0 else 8 * p + head for p in want]


def test_tree_chain_inside_a_node_starts_at_the_nic_gpu() -> None:
    _, _, ch = _channels("dgx-h100-2")
    parent = ch.tree_parent[0]
    assert [parent[g] for g in (2, 3, 4)] == [0, 2, 3]  # 0 -> 2 -> 3 -> 4 ...


def test_nvls_moves_each_buffer_up_once_and_the_result_down_once() -> None:
    fabric, fab, ch = _channels("dgx-h100-1")
    s = float(GIB)
    sent = sends(fab, ch, _demand(fabric), "nvls")
    assert len(sent.direct) == 16
    for i, b in sent.direct.items():
        assert b == pytest.approx(s + s / 8), fabric.links[i]


# ---- the NVLS kernel's pipeline -------------------------------------------------------------
def test_nvls_chunk_size_follows_calc_coll_chunking() -> None:
    """min(4 MiB / NCCL_STEPS, 128 KiB), then 64 KiB below 64 x heads x chunk bytes per
    channel, 32 KiB below 8 x heads x chunk, 16 KiB below 2 x heads x chunk."""
    assert nvls_chunk_size(512 * MIB, 8) == 128 * KIB  # 8 GiB over 16 channels
    assert nvls_chunk_size(64 * MIB, 8) == 128 * KIB  # 1 GiB: not below 64 x 8 x 128 KiB
    assert nvls_chunk_size(64 * MIB - 1, 8) == 64 * KIB
    assert nvls_chunk_size(8 * MIB, 8) == 64 * KIB  # 128 MiB: not below 8 x 8 x 64 KiB
    assert nvls_chunk_size(4 * MIB - 1, 8) == 32 * KIB
    assert nvls_chunk_size(MIB, 8) == 32 * KIB  # 16 MiB: not below 2 x 8 x 32 KiB
    assert nvls_chunk_size(512 * KIB - 1, 8) == 16 * KIB
    assert nvls_chunk_size(16 * MIB, 4) == 64 * KIB  # below 32 MiB, not below 2 MiB


def test_nvls_allreduce_on_one_node_pays_its_pipeline_fill_and_drain() -> None:
    """Each of 16 channels runs its share in steps of 8 heads x chunk through scatter, reduce
    and gather: two step times more than the steady state, at the channel's rate."""
    fabric = build("dgx-h100-1")
    fab = describe(fabric, fabric.npus)
    graphs = search(fab)
    runtime = build_channels(fab, graphs).n_channels
    nvls_bw = 8 * 40e9 * 5 / 6  # NCCL's NVLS AllReduce bandwidth: 8 heads x 40 GB/s x 5/6
    for size, chunk in ((16 * MIB, 32 * KIB), (128 * MIB, 64 * KIB), (GIB, 128 * KIB),
                        (8 * GIB, 128 * KIB)):
        r = nccl_baseline(fabric, _demand(fabric, size=size))
        assert (r.algorithm, r.channels) == ("nvls", 16)
        assert r.latency_s == pytest.approx(25e-6)  # NCCL's NVLS latency, unchanged
        assert r.bandwidth_s == pytest.approx(size / nvls_bw)
        per_channel = size / 16
        assert r.pipeline_s == pytest.approx(2 * 8 * chunk / per_channel * r.bandwidth_s)
        assert r.seconds == pytest.approx(r.latency_s + r.bandwidth_s + r.pipeline_s)
        # the fill is what really happens, not part of NCCL's cost model: same choice
        pick = choose(estimates(fab, graphs, C.ALLREDUCE, float(size), runtime), float(size))
        assert (pick.algorithm, pick.protocol) == (r.algorithm, r.protocol)
    # 16 MiB by hand: 25 us + 16 MiB / 266.7 GB/s (62.9 us) + 2 x 256 KiB of 1 MiB (31.5 us)
    r = nccl_baseline(fabric, _demand(fabric, size=16 * MIB))
    assert r.seconds == pytest.approx(119.37e-6, rel=1e-3)
    assert "pipeline fill and drain 31.5 us" in r.explanation
    # rings have no fill (every hop busy from the first step); NVLSTree is not modelled here
    assert nccl_baseline(fabric, _demand(fabric, size=16 * MIB),
                         algorithms=["ring"]).pipeline_s == 0.0
    two = build("dgx-h100-2")
    assert nccl_baseline(two, _demand(two, size=16 * MIB)).pipeline_s == 0.0


# ---- NCCL's choices -------------------------------------------------------------------------
def test_nccl_documented_choices() -> None:
    def pick(name: str, size: int, c: Collective = C.ALLREDUCE) -> str:
        fabric = build(name)
        return nccl_baseline(fabric, _demand(fabric, c, size)).algorithm

    assert pick("dgx-h100-1", GIB) == "nvls"
    assert pick("dgx-h100-2", GIB) in ("tree", "nvls_tree")
    assert pick("dgx-h100-4", GIB) == "ring"
    assert pick("dgx-h100-8", GIB) == "ring"
    assert pick("dgx-h100-16", 16 * MIB) in ("tree", "nvls_tree")
    assert pick("dgx-h100-128", 256 * MIB) in ("tree", "nvls_tree")
    assert pick("dgx-a100-1", GIB) == "ring"  # no NVLink SHARP on A100
    assert pick("dgx-h100-1:nvls=false", GIB) == "ring"


def test_nccl_latency_model_matches_its_published_start_up() -> None:
    """Ring Simple AllReduce: ~1.2 ms at 128 GPUs and ~9.7 ms at 1024 (tree 0.18 / 0.26 ms)."""
    for name, ring_ms, tree_ms in (("dgx-h100-16", 1.19, 0.176), ("dgx-h100-128", 9.66, 0.26)):
        fabric = build(name)
        fab = describe(fabric, fabric.npus)
        est = {(e.algorithm, e.protocol): e for e in
               estimates(fab, search(fab), C.ALLREDUCE, 1024, 16)}
        assert est[("ring", "simple")].latency_us / 1e3 == pytest.approx(ring_ms, rel=0.01)
        assert est[("tree", "simple")].latency_us / 1e3 == pytest.approx(tree_ms, rel=0.02)


def test_pat_only_with_one_gpu_per_node() -> None:
    for name, has_pat in (("torus-4x4", True), ("dgx-h100-4", False)):
        fabric = build(name)
        fab = describe(fabric, fabric.npus)
        algos = {e.algorithm for e in estimates(fab, search(fab), C.ALLGATHER, MIB, 4)}
        assert (PAT in algos) is has_pat


def test_alltoall_runs_at_about_one_nic_per_gpu() -> None:
    fabric = build("dgx-h100-4")
    d = _demand(fabric, C.ALLTOALL)
    r = nccl_baseline(fabric, d)
    off_node = 24 * d.size / d.n  # each GPU sends size / n to each of the 24 on other nodes
    assert off_node / r.seconds == pytest.approx(46e9, rel=0.1)


def test_forcing_an_algorithm_and_bad_names() -> None:
    fabric = build("dgx-h100-1")
    r = nccl_baseline(fabric, _demand(fabric), algorithms=["ring"])
    assert r.algorithm == "ring" and 350e9 < r.busbw < 372e9
    with pytest.raises(InputError, match="algorithms"):
        nccl_baseline(fabric, _demand(fabric), algorithms=["hypercube"])
    with pytest.raises(InputError, match="arch"):
        nccl_baseline(fabric, _demand(fabric), arch="pascal")
    with pytest.raises(InputError, match="nvls"):
        build("dgx-h100-2:nvls=7")
    with pytest.raises(InputError, match="unknown parameter 'nics'"):
        build("dgx-a100-2:nics=4")


# ---- fabrics NCCL treats poorly ----------------------------------------------------------------
@pytest.mark.parametrize("name", ["torus-4x4", "mesh-4x4", "switch-8", "dgx1", "mi250",
                                  "ndv2-2", "3d-rfs-16", "dragonfly-4x5", "hypercube-2x2x2"])
def test_fabrics_without_nic_information_get_a_model(name: str) -> None:
    fabric = build(name)
    for c in (C.ALLREDUCE, C.ALLGATHER, C.ALLTOALL):
        r = nccl_baseline(fabric, _demand(fabric, c, 64 * MIB))
        assert 0 < r.seconds < 10 and r.busbw > 0


def _down(fabric: Topology, a: str, b: str) -> Topology:
    ids = {fabric.node_name(v): v for v in range(fabric.num_nodes)}
    bad = [i for i, lk in enumerate(fabric.links)
           if {lk.src, lk.dst} == {ids[a], ids[b]}]
    assert bad
    return fabric.with_health(fabric.failed, bad)


@pytest.mark.parametrize("size", [16 * MIB, 256 * MIB, GIB])
@pytest.mark.parametrize("c", [C.ALLREDUCE, C.ALLGATHER, C.ALLTOALL])
def test_a_failed_nic_never_makes_nccl_faster(size: int, c: Collective) -> None:
    fabric = build("dgx-h100-4")
    healthy = nccl_baseline(fabric, _demand(fabric, c, size))
    broken = _down(fabric, "node1/gpu3", "sw-rail3")
    degraded = nccl_baseline(broken, _demand(broken, c, size))
    assert degraded.seconds >= healthy.seconds * (1 - 1e-9)
    if c is not C.ALLTOALL:
        assert describe(broken, broken.npus).hosts[1].nics.__len__() == 7
    if c is C.ALLREDUCE and size == GIB:
        assert degraded.channels == 14 and degraded.seconds > healthy.seconds * 1.05


def test_a_failed_gpu_leaves_fewer_ranks_and_no_more_bandwidth() -> None:
    fabric = build("dgx-h100-4")
    healthy = nccl_baseline(fabric, _demand(fabric))
    ids = {fabric.node_name(v): v for v in fabric.npus}
    broken = fabric.with_health(frozenset({ids["node2/gpu5"]}), ())
    fab = describe(broken, broken.npus)
    assert [h.ppn for h in fab.hosts] == [8, 8, 7, 8]
    degraded = nccl_baseline(broken, _demand(broken))
    assert degraded.busbw <= healthy.busbw * (1 + 1e-9)


def test_a_failed_nvswitch_port_turns_nvls_off() -> None:
    fabric = build("dgx-h100-2")
    broken = _down(fabric, "node0/gpu0", "node0/sw-nvswitch")  # gpu0 keeps its NIC
    healthy = nccl_baseline(fabric, _demand(fabric))
    degraded = nccl_baseline(broken, _demand(broken))
    assert healthy.algorithm == "nvls_tree" and not degraded.algorithm.startswith("nvls")
    assert degraded.busbw < healthy.busbw


# ---- the lower bound --------------------------------------------------------------------------
BOUND_FABRICS = ["dgx-h100-1", "dgx-h100-2", "dgx-h100-4", "dgx-a100-1", "dgx-a100-2",
                 "torus-4x4", "mesh-4x4", "switch-8", "dgx1", "ndv2-2", "dgx2"]


@pytest.mark.parametrize("name", BOUND_FABRICS)
@pytest.mark.parametrize("c", [C.ALLREDUCE, C.ALLGATHER, C.REDUCESCATTER, C.ALLTOALL,
                               C.BROADCAST])
def test_nccl_never_beats_the_lower_bound(name: str, c: Collective) -> None:
    fabric = build(name)
    for size in (MIB, 256 * MIB):
        d = _demand(fabric, c, size)
        assert nccl_baseline(fabric, d).seconds >= lower_bound(fabric, d).value_s


def test_the_bound_allows_in_switch_reduction() -> None:
    with_nvls, without = build("dgx-h100-1"), build("dgx-h100-1:nvls=false")
    d = _demand(with_nvls)
    assert lower_bound(with_nvls, d).value_s == pytest.approx(GIB / 370e9, rel=1e-6)
    assert lower_bound(without, d).value_s == pytest.approx(2 * 7 / 8 * GIB / 370e9, rel=1e-6)
    assert nccl_baseline(with_nvls, d).seconds >= lower_bound(with_nvls, d).value_s


# ---- the analytic bandwidth term against a simulated schedule ----------------------------------
@pytest.mark.parametrize("name", ["dgx-h100-1", "dgx-h100-2", "dgx-a100-2", "torus-4x4"])
def test_ring_channels_as_a_schedule_agree_with_the_link_loads(name: str) -> None:
    """The simulated, verified schedule of NCCL's ring channels needs at least the model's
    wire time (no link carries more than its bandwidth) and at most 15% more: the simulated
    plan is step-synchronous, so a transfer waits for its whole previous step, which leaves
    bubbles the continuous model does not have (measured 0.3-6% on these fabrics)."""
    fabric = build(name)
    d = _demand(fabric)
    sched = ring_schedule(fabric, d)
    assert verify(sched).ok
    simulated = simulate(sched).makespan
    wire = nccl_baseline(fabric, d, algorithms=["ring"], protocols=["simple"]).wire_s
    assert wire <= simulated <= 1.15 * wire


# ---- cost ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["dgx-h100-128", "torus-32x32"])
def test_large_fabrics_get_a_model(name: str) -> None:
    """(What a call costs there is a row of ``choreo bench --calibration``.)"""
    fabric = build(name)
    d = _demand(fabric, C.ALLREDUCE, 256 * MIB)
    r = nccl_baseline(fabric, d)
    assert np.isfinite(r.seconds) and r.seconds > lower_bound(fabric, d).value_s


# ---- the reducing flag in the fabric model and file format --------------------------------------
def test_reducing_switches_survive_every_round_trip(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from choreo.topofile import load_topology_file, save_topology

    fabric = build("dgx-h100-2")
    assert fabric.reducing == {16, 17} and not build("dgx-a100-2").reducing
    assert Topology.from_dict(fabric.to_dict()).reducing == fabric.reducing
    assert fabric.with_health(frozenset({3}), [0]).reducing == fabric.reducing
    for suffix in ("yaml", "json"):
        save_topology(fabric, tmp_path / f"f.{suffix}")
        assert load_topology_file(tmp_path / f"f.{suffix}").reducing == fabric.reducing
    assert fabric.fingerprint() != build("dgx-h100-2:nvls=false").fingerprint()


def test_only_existing_switches_reduce() -> None:
    from choreo.topofile import topology_from_doc

    doc = {"npus": 2, "switches": 1, "defaults": {"bandwidth": 1e9, "bidirectional": True},
           "links": [{"src": 0, "dst": 2}, {"src": 1, "dst": 2}]}
    assert topology_from_doc({**doc, "reducing": [2]}).reducing == {2}
    with pytest.raises(InputError, match=r"reducing\[0\]: node 0 is not a switch"):
        topology_from_doc({**doc, "reducing": [0]})
    with pytest.raises(InputError, match=r"reducing\[0\]: node 9 does not exist"):
        topology_from_doc({**doc, "reducing": [9]})
    with pytest.raises(InputError, match="reducing"):
        topology_from_doc({**doc, "reducing": ["sw"]})


# ---- calibration ---------------------------------------------------------------------------------
def test_calibration_reports_every_measured_row() -> None:
    from choreo.benchtable import exit_code
    from choreo.nccl.calibration import TABLE, calibration_rows

    rows = calibration_rows()
    assert len(rows) == len(TABLE) == 12
    for m, row in zip(TABLE, rows, strict=True):
        lo, hi = m.busbw
        model = row.value * (lo + hi) / 2
        assert row.ok == (0.85 * lo <= model <= 1.15 * hi)
    # every row is within 15%; NVLS at 16 MiB only with the kernel's pipeline fill (NCCL's
    # 25 us NVLS latency alone put it at 1.43)
    assert [r.case for r in rows if not r.ok] == []
    assert "16 MiB" in rows[3].case and rows[3].value == pytest.approx(1.051, abs=0.002)
    assert exit_code(rows) == 0


def test_tenants_running_at_once_share_only_the_links_they_share() -> None:
    fabric = build("dgx-h100-2")
    halves = [tuple(g for g in fabric.npus if (g % 8 < 4) == low) for low in (True, False)]
    demands = [Demand(Collective.ALLREDUCE, ranks, 1 << 30) for ranks in halves]
    alone = [nccl_baseline(fabric, d) for d in demands]
    assert [r.seconds for r in nccl_jointly(fabric, demands)] == [r.seconds for r in alone]

    spine = build("dgx-h100-spine-2x2")  # one node of each block per tenant: all cross the spine
    demands = [Demand(Collective.ALLREDUCE, tuple(range(8 * a, 8 * a + 8))
                      + tuple(range(8 * b, 8 * b + 8)), 1 << 30) for a, b in ((0, 2), (1, 3))]
    alone = [nccl_baseline(spine, d) for d in demands]
    joint = nccl_jointly(spine, demands)
    for a, j in zip(alone, joint, strict=True):
        assert j.choice == a.choice  # NCCL chooses as if alone
        assert a.wire_s < j.wire_s <= 2 * a.wire_s  # at most both tenants' bytes on a link
        assert j.seconds > a.seconds
        assert "spine" in j.explanation and "spine" not in a.explanation  # the shared uplinks
    assert joint[0].seconds == pytest.approx(joint[1].seconds)  # mirror images


@pytest.mark.parametrize("coll", [Collective.ALLREDUCE, Collective.BROADCAST])
def test_a_gpu_whose_only_link_out_failed_leaves_nccl_a_path(coll: Collective) -> None:
    """On dragonfly-3x4 each GPU has one link out of its group. With one failed, that GPU
    reaches the other groups through a peer's: NCCL's model keeps a positive speed (it divided
    by zero, an internal error in the service) and, with no NIC of its own to lose, the
    ring's speed of the healthy fabric."""
    healthy = build("dragonfly-3x4")
    out = next(i for i, lk in enumerate(healthy.links)
               if healthy.names[lk.src].split("/")[0] != healthy.names[lk.dst].split("/")[0])
    fabric = healthy.with_health(frozenset(), [out])
    d = Demand(coll, tuple(fabric.npus), 1 << 16, 1)
    assert describe(fabric, d.ranks).nic_bandwidth > 0
    ours = nccl_baseline(fabric, d)
    assert np.isfinite(ours.seconds) and ours.seconds > 0
    assert ours.seconds == pytest.approx(nccl_baseline(healthy, d).seconds)


def test_a_route_whose_last_hop_adds_nothing_in_floating_point_is_found() -> None:
    """GPU 1's one link is 1 B/s, GPU 0 to 2 is 1e18 B/s: for a 1 TiB message the path
    1 -> 0 -> 2 costs what 1 -> 0 does, to the last bit, and the compiled search pruned node 0
    at its two-hop bound ("no usable path", an INTERNAL error from the service)."""
    links = [(0, 1, 1e-12, 1.0), (0, 2, 1e-6, 1e18), (2, 3, 1e-12, 1.0), (0, 4, 1e-6, 1.0),
             (2, 4, 0.0, 1e18)]
    fabric = Topology("unlike", (NodeKind.NPU,) * 4 + (NodeKind.SWITCH,), tuple(
        lk for a, b, alpha, bw in links for lk in duplex(a, b, alpha, bw)))
    assert Router(fabric, 1 << 40).paths_from({1: [2]}) == {(1, 2): (1, 2)}
    d = Demand(Collective.ALLGATHER, (0, 1, 2, 3), 1 << 40, 1)
    assert np.isfinite(nccl_baseline(fabric, d).seconds)
