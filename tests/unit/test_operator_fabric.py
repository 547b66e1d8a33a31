"""FabricTopology + NodeFabric - DeviceFailure -> Topology, and the sub-fabric of a group."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from api_helpers import fabric, failure, node_fabric, valid

from choreo import generators
from choreo.errors import ChoreoError
from choreo.topology import Topology
from choreo_api import DeviceFailure
from choreo_operator import model
from choreo_operator.fabric import Subfabrics, build_fabric, subfabric


def test_preset_rails_match_the_generator() -> None:
    fab = build_fabric(fabric(4, type="rail", rails=8), {})
    ref = generators.dgx_h100(4)
    topo = fab.topology
    assert len(topo.all_npus) == 32 and len(topo.links) == len(ref.links)
    assert sorted(lk.bandwidth for lk in topo.links) == sorted(lk.bandwidth for lk in ref.links)
    assert topo.node_name(0) == "n0/gpu0" and fab.gpu("n3", 7) == 31
    topo.check_connected(topo.npus)


def test_fewer_rails_than_gpus_share_nics() -> None:
    topo = build_fabric(fabric(2, type="rail", rails=2), {}).topology
    names = [topo.node_name(v) for v in topo.switches]
    assert {"n0/nic0", "n0/nic1", "n1/nic0", "n1/nic1", "rail0", "rail1"} <= set(names)
    nic = names.index("n0/nic1")
    attached = {topo.node_name(topo.links[i].src) for i in topo.in_links(topo.switches[nic])}
    assert {"n0/gpu4", "n0/gpu7", "rail1"} <= attached and "n0/gpu0" not in attached


def test_failures_and_down_nodes() -> None:
    failures = [failure("g", "n0", "gpu", gpu=3),
                failure("r", "n0", "gpu", gpu=5, resolved=True),
                failure("x", "nope", "gpu", gpu=1),
                failure("y", "n0", "gpu", gpu=60),
                failure("l", "n1", "link", gpu=0, peer_gpu=1)]
    fab = build_fabric(fabric(3, type="rail", rails=8), {}, failures, down_nodes=["n2"])
    failed = {fab.topology.node_name(v) for v in fab.topology.failed}
    assert failed == {"n0/gpu3"} | {f"n2/gpu{g}" for g in range(8)}
    assert set(fab.problems) == {"x", "y", "l"}  # dgx-h100 GPUs have no direct links
    assert "not in FabricTopology" in fab.problems["x"] and "no GPU 60" in fab.problems["y"]
    # built from the healthy fabric's adjacency: the same as a fabric built from scratch
    topo = fab.topology
    fresh = Topology(topo.name, topo.kinds, topo.links, topo.failed, topo.names)
    assert topo == fresh and topo.fingerprint() == fresh.fingerprint()
    assert all(topo.out_links(v) == fresh.out_links(v) and topo.in_links(v) == fresh.in_links(v)
               for v in range(topo.num_nodes))


def test_dgx1_link_failure_cuts_both_directions() -> None:
    fab = build_fabric(fabric(1, intra={"preset": "dgx1"}), {},
                       [failure("l", "n0", "link", gpu=0, peer_gpu=1)])
    topo = fab.topology
    bad = [lk for lk in topo.links if not lk.healthy]
    assert bad and {(lk.src, lk.dst) for lk in bad} == {(0, 1), (1, 0)}
    assert not fab.problems


def test_nic_failure_cuts_the_nic() -> None:
    fab = build_fabric(fabric(2, type="rail", rails=2), {},
                       [failure("n", "n1", "nic", nic="nic0")])
    topo = fab.topology
    nic = topo.names.index("n1/nic0")
    assert all(not topo.links[i].healthy for i in (*topo.in_links(nic), *topo.out_links(nic)))
    assert sum(not lk.healthy for lk in topo.links) == 2 * (4 + 1)
    fresh = Topology(topo.name, topo.kinds, topo.links, topo.failed, topo.names)
    assert topo == fresh and topo.fingerprint() == fresh.fingerprint()
    assert build_fabric(fabric(2, type="rail", rails=2), {}).topology != topo


def test_agent_node_fabric_replaces_the_preset() -> None:
    nf = node_fabric({"nodeName": "n1", "gpus": [
        {"index": 0}, {"index": 1}, {"index": 2, "healthy": False}], "links": [
        {"src": 0, "dstGPU": 1, "kind": "nvlink", "count": 2, "alphaSeconds": 1e-6,
         "bandwidthBytesPerSecond": 25e9},
        {"src": 1, "dstGPU": 0, "kind": "nvlink", "count": 2, "alphaSeconds": 1e-6,
         "bandwidthBytesPerSecond": 25e9},
        {"src": 0, "dstNIC": "mlx5_0", "kind": "pcie", "bandwidthBytesPerSecond": 32e9,
         "healthy": False}],
        "nics": [{"name": "mlx5_0", "rail": 0, "bandwidthBytesPerSecond": 50e9,
                  "nearestGPU": 0}]})
    fab = build_fabric(fabric(2, type="rail", rails=1), {"n1": nf})
    topo = fab.topology
    assert fab.node_gpus["n1"] == (8, 9, 10)
    assert topo.node_name(10) in {topo.node_name(v) for v in topo.failed}
    nvlinks = [lk for lk in topo.links if lk.kind == "nvlink"]
    assert len(nvlinks) == 4
    # a NIC serving one GPU is that GPU's port into its rail; its down PCIe link cuts the port
    assert "n1/mlx5_0" not in topo.names
    gpu0, rail0 = topo.names.index("n1/gpu0"), topo.names.index("rail0")
    port = [lk for lk in topo.links if {lk.src, lk.dst} == {gpu0, rail0}]
    assert len(port) == 2 and not any(lk.healthy for lk in port)
    assert all(lk.bandwidth == 32e9 for lk in port)  # the slower of NIC and PCIe


def test_shared_agent_nic_stays_a_switch_and_nic_failures_apply() -> None:
    def nic(name: str, rail: int) -> dict[str, object]:
        return {"name": name, "rail": rail, "bandwidthBytesPerSecond": 50e9, "nearestGPU": rail}

    def pcie(gpu: int, nic: str, bandwidth: float) -> dict[str, object]:
        return {"src": gpu, "dstNIC": nic, "kind": "pcie", "bandwidthBytesPerSecond": bandwidth}

    gpus = [{"index": 0}, {"index": 1}]
    shared = node_fabric({"nodeName": "n1", "gpus": gpus, "nics": [nic("mlx5_0", 0)],
                          "links": [pcie(g, "mlx5_0", 32e9) for g in (0, 1)]})
    topo = build_fabric(fabric(2, type="rail", rails=1), {"n1": shared}).topology
    assert "n1/mlx5_0" in topo.names
    own = node_fabric({"nodeName": "n1", "gpus": gpus,
                       "links": [pcie(0, "mlx5_0", 49.7e9), pcie(1, "mlx5_1", 50.2e9)],
                       "nics": [nic("mlx5_0", 0), nic("mlx5_1", 1)]})
    fab = build_fabric(fabric(2, type="rail", rails=2), {"n1": own},
                       [failure("f", "n1", "nic", nic="mlx5_1")])
    topo = fab.topology
    assert not fab.problems
    gpu1, rail1 = topo.names.index("n1/gpu1"), topo.names.index("rail1")
    assert not any(lk.healthy for lk in topo.links if {lk.src, lk.dst} == {gpu1, rail1})
    gpu0, rail0 = topo.names.index("n1/gpu0"), topo.names.index("rail0")
    port = [lk for lk in topo.links if {lk.src, lk.dst} == {gpu0, rail0}]
    # PCIe measured within noise of the NIC's rate: the port runs at the NIC's line rate
    assert all(lk.healthy and lk.bandwidth == 50e9 for lk in port) and len(port) == 2


def test_torus_links_neighbours_gpu_to_gpu() -> None:
    topo = build_fabric(fabric(4, intra={"preset": "generic", "gpus": 2}, type="torus", dims=[4]),
                        {}).topology
    optical = {(topo.node_name(lk.src), topo.node_name(lk.dst)) for lk in topo.links
               if lk.kind == "optical"}
    assert ("n0/gpu1", "n1/gpu1") in optical and ("n3/gpu0", "n0/gpu0") in optical
    assert ("n0/gpu0", "n2/gpu0") not in optical


def test_duplicate_positions_are_noted() -> None:
    spec = fabric([("a", 0), ("b", 0)])
    assert "share position 0" in build_fabric(spec, {}).notes[0]


def test_subfabric_keeps_only_useful_switches() -> None:
    fab = build_fabric(fabric(50, type="rail", rails=2), {})
    npus = [fab.gpu("n0", g) for g in range(4)] + [fab.gpu("n1", g) for g in range(4)]
    sub, ids = subfabric(fab.topology, [v for v in npus if v is not None])
    names = {sub.node_name(v) for v in sub.switches}
    assert names == {"n0/sw-nvswitch", "n1/sw-nvswitch", "n0/nic0", "n1/nic0", "rail0"}
    assert len(sub.npus) == 8 and sorted(ids.values())[:8] == list(range(8))
    sub.check_connected(sub.npus)


def test_subfabric_holds_every_link_between_what_it_keeps() -> None:
    """The cut walks switch-to-switch links only; it must still hold exactly the links of
    the fabric between the nodes it keeps (checked against a scan of every link)."""
    fab = build_fabric(fabric(6, type="rail", rails=2), {},
                       [failure("l", "n1", "nic", nic="nic1")])
    topo = fab.topology
    npus = [v for v in (fab.gpu(n, g) for n in ("n1", "n4") for g in range(8)) if v is not None]
    sub, ids = subfabric(topo, npus)
    scanned = [(ids[lk.src], ids[lk.dst], lk.healthy) for lk in topo.links
               if lk.src in ids and lk.dst in ids]
    assert [(lk.src, lk.dst, lk.healthy) for lk in sub.links] == scanned
    assert not all(lk.healthy for lk in sub.links)  # the failed NIC's links came along
    assert {topo.node_name(i) for i in range(topo.num_nodes) if topo.trunk_links[i]} == {
        f"n{k}/nic{r}" for k in range(6) for r in range(2)} | {"rail0", "rail1"}


def test_subfabrics_are_reused_until_their_own_health_changes() -> None:
    spec = fabric(4, type="rail", rails=8)
    before = build_fabric(spec, {}).topology
    cache = Subfabrics()
    fab = build_fabric(spec, {})
    mine = [v for v in (fab.gpu(n, g) for n in ("n0", "n1") for g in range(8)) if v is not None]
    first, _ = cache.get(before, mine, "t")
    elsewhere = build_fabric(spec, {}, [failure("f", "n3", "gpu", gpu=2)]).topology
    assert cache.get(elsewhere, mine, "t")[0] is first
    inside = build_fabric(spec, {}, [failure("f", "n0", "nic", nic="nic2")]).topology
    cut, _ = cache.get(inside, mine, "t")
    assert cut is not first and cut == subfabric(inside, mine, "t")[0]
    assert sum(not lk.healthy for lk in cut.links) == 2
    cache.keep_used()  # used since the start: kept
    assert cache.get(inside, mine, "t")[0] is cut
    cache.keep_used()
    cache.keep_used()  # not asked for in between: forgotten
    assert cache.get(inside, mine, "t")[0] is not cut


def test_a_cut_follows_failures_and_recoveries_as_a_fresh_cut_would() -> None:
    """A failure changes only the health of a tenant's cut (its failed GPU stays in it, as
    failed): the cached cut, marked again, is the fresh cut of the fabric, and its verdict is
    the one a cut of the live GPUs alone gives."""
    spec = fabric(4, type="rail", rails=8)
    fab = build_fabric(spec, {})
    mine = tuple(v for v in (fab.gpu(n, g) for n in ("n0", "n1") for g in range(8))
                 if v is not None)
    steps = [[], [failure("a", "n0", "gpu", gpu=2)],
             [failure("a", "n0", "gpu", gpu=2), failure("b", "n1", "nic", nic="nic3")],
             [failure("b", "n1", "nic", nic="nic3")], [],
             [failure(f"c{g}", "n1", "gpu", gpu=g) for g in range(8)],
             [failure(f"d{k}", "n1", "nic", nic=f"nic{k}") for k in range(8)],
             [failure("a", "n0", "gpu", gpu=2)]]
    cache = Subfabrics()
    verdicts = set()
    for failures in steps:
        topo = build_fabric(spec, {}, failures).topology
        got, ids = cache.get(topo, mine, "t")
        want, want_ids = subfabric(topo, mine, "t")
        assert got == want and ids == want_ids and got.fingerprint() == want.fingerprint()
        live = [v for v in mine if v not in topo.failed]
        alone, alone_ids = subfabric(topo, live)
        try:
            alone.check_connected([alone_ids[v] for v in live], "tenant")
            expected = None
        except ChoreoError as err:
            expected = str(err)
        assert cache.disconnected(topo, mine) == expected
        verdicts.add(expected is None)
    assert verdicts == {True, False}  # both verdicts were met


def test_connectivity_is_learned_once_per_cut_and_follows_its_health(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A tenant's verdict (connected or why not) is kept with its cut: a failure elsewhere
    keeps both, one on the tenant's own path changes both."""
    checks: list[int] = []
    real = Topology.check_connected

    def counted(self: Topology, npus: Sequence[int], where: str = "topology") -> None:
        checks.append(len(npus))
        real(self, npus, where)

    monkeypatch.setattr(Topology, "check_connected", counted)
    spec = fabric(3, type="rail", rails=8)
    healthy = build_fabric(spec, {})
    pair = (healthy.gpu("n0", 0), healthy.gpu("n1", 0))
    assert None not in pair
    mine = tuple(v for v in pair if v is not None)
    cache = Subfabrics()
    assert cache.disconnected(healthy.topology, mine) is None
    elsewhere = build_fabric(spec, {}, [failure("f", "n2", "nic", nic="nic0")]).topology
    assert cache.disconnected(elsewhere, mine) is None
    assert len(checks) == 1  # the same cut: checked once
    cut = build_fabric(spec, {}, [failure("f", "n0", "nic", nic="nic0")]).topology
    why = cache.disconnected(cut, mine)
    assert why is not None and ("disconnected" in why or "no usable links" in why)
    assert cache.disconnected(healthy.topology, mine) is None  # the link came back
    assert len(checks) == 3


def test_footprints_are_cached_per_tenant_and_forgotten_when_unused() -> None:
    from choreo_operator.grouping import footprint

    fab = build_fabric(fabric(3, type="rail", rails=8), {})
    topo = fab.topology
    cache = Subfabrics()
    mine = tuple(v for v in (fab.gpu("n1", g) for g in range(8)) if v is not None)
    first = cache.footprint(topo, mine)
    assert first == footprint(topo, mine) and cache.footprint(topo, mine[::-1]) is first
    cache.keep_used()
    cache.keep_used()
    assert cache.footprint(topo, mine) is not first


def test_fabric_topology_from_body() -> None:
    ft = model.fabric_topology({"metadata": {"name": "x", "generation": 3}, "spec": {
        "nodes": [{"name": "b", "position": 1}, {"name": "a", "position": 0}],
        "intraNode": {"preset": "dgx1"}, "interNode": {"type": "torus", "dims": [2]}}})
    assert not isinstance(ft, model.Invalid)
    assert [(n.name, n.position) for n in ft.spec.nodes or ()] == [("a", 0), ("b", 1)]
    assert ft.spec.intra_node is not None and ft.spec.intra_node.preset == "dgx1"
    assert ft.spec.inter_node.dims == (2,)


def test_a_failed_gpu_to_nvswitch_link_is_applied() -> None:
    """The CRD and the agent name a GPU's link to its NVSwitch with ``device.switch``; the
    operator must take that link down, not look for a GPU pair."""

    def link_to(name: str, switch: str) -> DeviceFailure:
        return valid(model.device_failure({"metadata": {"name": name}, "spec": {
            "node": "n0", "source": "agent",
            "device": {"type": "link", "gpu": 3, "switch": switch}}}))

    fab = build_fabric(fabric(2, type="rail", rails=8), {},
                       [link_to("down", "sw-nvswitch"), link_to("bad", "sw-none")])
    topo = fab.topology
    gpu3, nvswitch = topo.names.index("n0/gpu3"), topo.names.index("n0/sw-nvswitch")
    port = [lk for lk in topo.links if {lk.src, lk.dst} == {gpu3, nvswitch}]
    assert port and not any(lk.healthy for lk in port)
    assert sum(not lk.healthy for lk in topo.links) == len(port)
    assert set(fab.problems) == {"bad"}
    assert "sw-none" in fab.problems["bad"]


def test_a_failure_regroups_nobody_and_a_hash_is_computed_once_while_asked_for() -> None:
    """Tenants are grouped by the GPUs placed, so a failure round finds the last grouping
    (and keeps its footprints); a moved tenant is grouped again."""
    from choreo_operator.grouping import Member, groups

    spec = fabric(4, type="rail", rails=8)
    fab = build_fabric(spec, {})
    placed = {t: tuple(v for v in (fab.gpu(n, g) for n in nodes for g in range(8))
                       if v is not None)
              for t, nodes in (("a", ("n0", "n1")), ("b", ("n2",)), ("c", ("n3",)))}
    members = [Member(f"ns/{t}", npus, True, ("executor", 1, "Simple"))
               for t, npus in placed.items()]
    cache = Subfabrics()
    first = cache.groups(fab.topology, members)
    assert first == groups(fab.topology, members)
    failed = build_fabric(spec, {}, [failure("f", "n0", "gpu", gpu=0)]).topology
    fp = cache.footprint(fab.topology, placed["a"])
    cache.keep_used()
    assert cache.groups(failed, list(members)) is first
    cache.keep_used()  # the footprints were asked for through the grouping: kept
    assert cache.footprint(failed, placed["a"]) is fp
    moved = [*members[:2], Member("ns/c", placed["b"][:4], True, ("executor", 1, "Simple"))]
    again = cache.groups(failed, moved)
    assert again is not first and again == groups(failed, moved)
    computed: list[int] = []
    for _ in range(3):
        assert cache.hashed(("k",), lambda: str(computed.append(1) or len(computed))) == "1"
        cache.keep_used()
    cache.keep_used()  # not asked for in a round: forgotten
    assert cache.hashed(("k",), lambda: "new") == "new" and computed == [1]
