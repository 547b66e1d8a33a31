"""Blocks with an oversubscribed spine, and FabricTopology spec.source (Topograph, Kueue, Volcano).

Real parts only: the bodies are parsed by ``model`` as the operator's indexes parse them,
resolved by ``sources.resolve`` and built by ``fabric.build_fabric``.
"""

from __future__ import annotations

from typing import Any

from api_helpers import failure, valid

from choreo_api import FabricTopology, TopographSource
from choreo_operator import model, sources
from choreo_operator.fabric import build_fabric, subfabric
from choreo_operator.model import (
    HyperNode,
    KueueTopology,
    NodeInfo,
    hyper_node,
    kueue_topology,
    node_info,
)

BLOCK = "network.topology.nvidia.com/block"
SPINE = "network.topology.nvidia.com/spine"
RACK = "example.com/rack"
ROW = "example.com/row"
HOST = "kubernetes.io/hostname"
INTER = {"type": "rail", "rails": 8, "spineOversubscription": 2}


def _node(name: str, gpus: int = 8, **labels: str) -> NodeInfo:
    body: dict[str, Any] = {
        "metadata": {"name": name, "labels": {HOST: name, **labels}},
        "status": {"capacity": {"nvidia.com/gpu": str(gpus)},
                   "conditions": [{"type": "Ready", "status": "True"}]}}
    return node_info(body)


def _fabric(spec: dict[str, Any], name: str = "f", generation: int = 1) -> FabricTopology:
    return valid(model.fabric_topology({"metadata": {"name": name, "generation": generation},
                                        "spec": {"intraNode": {"preset": "dgx-h100"},
                                                 "interNode": INTER, **spec}}))


def _nodes(ft: FabricTopology) -> tuple[tuple[str, int], ...]:
    return tuple((n.name, n.position) for n in ft.spec.nodes or ())


def _blocks(ft: FabricTopology) -> dict[str, str]:
    return {n.name: n.block for n in ft.spec.nodes or () if n.block}


def _inter(ft: FabricTopology, **update: Any) -> FabricTopology:
    inter = ft.spec.inter_node.model_copy(update=update)
    return ft.model_copy(update={"spec": ft.spec.model_copy(update={"inter_node": inter})})


def _source(ft: FabricTopology, **update: Any) -> FabricTopology:
    assert ft.spec.source is not None
    source = ft.spec.source.model_copy(update=update)
    return ft.model_copy(update={"spec": ft.spec.model_copy(update={"source": source})})


def _hand(blocks: dict[str, str]) -> FabricTopology:
    """The same cluster written by hand: positions in (block, name) order."""
    order = sorted(blocks, key=lambda n: (blocks[n], n))
    return _fabric({"nodes": [{"name": n, "position": i, **({"block": blocks[n]} if blocks[n]
                                                            else {})}
                              for i, n in enumerate(order)]})


def _cluster() -> dict[str, NodeInfo]:
    """Six GPU nodes under two leaf switches (s1: a-c, s2: d-f) and one spine, plus a CPU
    node and a GPU node outside Topograph's labels."""
    nodes = [_node(n, **{BLOCK: "s1", SPINE: "sp", RACK: "r1", ROW: "w1"}) for n in "bca"]
    nodes += [_node(n, **{BLOCK: "s2", SPINE: "sp", RACK: "r2", ROW: "w1"}) for n in "fed"]
    nodes += [_node("cpu", gpus=0, **{BLOCK: "s9", SPINE: "sp", "role": "cpu"}), _node("lone")]
    return {n.name: n for n in nodes}


KUEUE = kueue_topology({"metadata": {"name": "tas"}, "spec": {"levels": [
    {"nodeLabel": ROW}, {"nodeLabel": RACK}, {"nodeLabel": HOST}]}})


def _hn(name: str, tier: Any, *members: dict[str, Any]) -> HyperNode:
    return hyper_node({"metadata": {"name": name},
                       "spec": {"tier": tier, "members": list(members)}})


def _exact(name: str) -> dict[str, Any]:
    return {"type": "Node", "selector": {"exactMatch": {"name": name}}}


HYPERNODES = [
    _hn("s1", 1, _exact("a"), {"type": "Node", "selector": {"regexMatch": {"pattern": "^[bc]$"}}}),
    _hn("s2", 1, {"type": "Node", "selector": {"labelMatch": {"matchLabels": {RACK: "r2"}}}}),
    _hn("top", 2, {"type": "HyperNode", "selector": {"exactMatch": {"name": "s1"}}},
        {"type": "HyperNode", "selector": {"exactMatch": {"name": "s2"}}}),
]
EXPECTED = {"a": "s1", "b": "s1", "c": "s1", "d": "s2", "e": "s2", "f": "s2"}


# ---- the fabric model: blocks and the spine ------------------------------------------------------


def test_blocks_get_leaves_and_a_two_to_one_spine() -> None:
    spec = _hand({"a": "b1", "b": "b1", "c": "b2", "d": "b2"})
    assert spec.spec.inter_node.spine_oversubscription == 2.0 and _blocks(spec)["c"] == "b2"
    fab = build_fabric(spec, {})
    topo = fab.topology
    names = topo.names
    assert "rail0" not in names
    for r in range(8):
        for leaf in (f"b1/rail{r}", f"b2/rail{r}"):
            assert leaf in names
        spine = names.index(f"spine/rail{r}")
        ups = [lk for lk in topo.links if spine in (lk.src, lk.dst)]
        # one duplex uplink per leaf: 2 nodes x 46 GB/s NIC ports / 2
        assert len(ups) == 4 and all(lk.bandwidth == 46e9 and lk.kind == "ib" for lk in ups)
        assert {names[lk.src] for lk in ups if lk.dst == spine} == {f"b1/rail{r}", f"b2/rail{r}"}
    gpu = names.index("c/gpu3")
    assert {names[lk.dst] for lk in topo.links if lk.src == gpu and lk.kind == "ib"} == {
        "b2/rail3"}
    assert not fab.notes
    topo.check_connected(topo.npus)
    # non-blocking: the uplink carries every port of the leaf
    flat = build_fabric(_inter(spec, spine_oversubscription=1.0), {}).topology
    spine0 = flat.names.index("spine/rail0")
    assert {lk.bandwidth for lk in flat.links if lk.dst == spine0} == {92e9}


def test_a_tenant_within_one_block_does_not_reach_the_spine() -> None:
    fab = build_fabric(_hand({"a": "b1", "b": "b1", "c": "b2", "d": "b2"}), {})
    inside = [fab.gpu(n, g) for n in "ab" for g in range(8)]
    sub, _ = subfabric(fab.topology, [v for v in inside if v is not None])
    assert not any(sub.node_name(v).startswith("spine/") for v in sub.switches)
    across = [fab.gpu(n, g) for n in "ac" for g in range(8)]
    sub, _ = subfabric(fab.topology, [v for v in across if v is not None])
    assert "spine/rail0" in {sub.node_name(v) for v in sub.switches}
    sub.check_connected(sub.npus)


def test_nodes_without_a_block_share_the_plain_rails_and_one_block_needs_no_spine() -> None:
    mixed = build_fabric(_hand({"a": "", "b": "", "c": "b2"}), {}).topology.names
    assert {"rail0", "b2/rail0", "spine/rail0"} <= set(mixed)
    single = build_fabric(_hand({"a": "b1", "b": "b1"}), {}).topology.names
    assert "b1/rail0" in single and not any(n.startswith("spine/") for n in single)


def test_a_failed_nic_takes_down_its_link_to_the_block_leaf() -> None:
    spec = _hand({"a": "b1", "b": "b1", "c": "b2", "d": "b2"})
    fab = build_fabric(spec, {}, [failure("x", "c", "nic", nic="nic2"),
                                  failure("y", "c", "link", gpu=5, nic="nic5"),
                                  failure("z", "c", "nic", nic="nic9")])
    topo = fab.topology
    down = {(topo.names[lk.src], topo.names[lk.dst]) for lk in topo.links if not lk.healthy}
    assert down == {("c/gpu2", "b2/rail2"), ("b2/rail2", "c/gpu2"),
                    ("c/gpu5", "b2/rail5"), ("b2/rail5", "c/gpu5")}
    assert set(fab.problems) == {"z"}


def test_fewer_rails_than_gpus_with_blocks_use_nic_switches() -> None:
    spec = _inter(_hand({"a": "b1", "b": "b2"}), rails=2)
    topo = build_fabric(spec, {}).topology
    nic = topo.names.index("b/nic1")
    assert {topo.names[lk.dst] for lk in topo.links if lk.src == nic} >= {"b2/rail1"}
    spine = topo.names.index("spine/rail1")
    # one node of four GPUs per NIC: 46 GB/s of ports per leaf, over 2
    assert {lk.bandwidth for lk in topo.links if lk.dst == spine} == {23e9}


def test_a_block_named_like_the_spine_is_reported() -> None:
    notes = build_fabric(_hand({"a": "spine", "b": "b2"}), {}).notes
    assert notes and "used twice" in notes[0] and "spine/rail0" in notes[0]


# ---- parsing ---------------------------------------------------------------------------------


def test_source_and_labels_are_parsed() -> None:
    spec = _fabric({"source": {"topograph": {}, "nodeSelector": {
        "matchLabels": {"nvidia.com/gpu.present": "true"}}}})
    source = spec.spec.source
    assert source is not None and source.topograph is not None
    assert source.topograph.block_label == BLOCK and spec.spec.nodes is None
    assert source.node_selector is not None and not source.node_selector.empty
    volcano = _fabric({"source": {"volcano": {}, "nodeSelector": {}}}).spec.source
    assert volcano is not None and volcano.volcano is not None
    assert volcano.node_selector is not None and volcano.node_selector.empty
    kueue = _fabric({"source": {"kueue": {"topology": "tas"}}}).spec.source
    assert kueue is not None and kueue.kueue is not None and kueue.kueue.topology == "tas"
    assert KUEUE.levels == (ROW, RACK, HOST) and isinstance(KUEUE, KueueTopology)
    assert _hn("x", "1").tier == 1 and _hn("x", "one").tier is None  # early Volcano: a string
    a, b = _node("a", zone="z1"), _node("b", zone="z1")
    assert a.label_map == {HOST: "a", "zone": "z1"}
    assert dict(a.labels)["zone"] == "z1" and a.labels[1] is b.labels[1]  # one shared pair


# ---- the three sources: the same fabric as by hand -------------------------------------------


def test_topograph_gives_the_hand_written_fabric() -> None:
    spec = _fabric({"source": {"topograph": {}, "nodeSelector": {
        "matchExpressions": [{"key": "role", "operator": "DoesNotExist"}]}}})
    resolved, notes = sources.resolve(spec, _cluster())
    assert resolved == _hand(EXPECTED) and not notes
    assert _nodes(resolved)[:2] == (("a", 0), ("b", 1))
    ours, theirs = build_fabric(resolved, {}).topology, build_fabric(_hand(EXPECTED), {}).topology
    assert ours.fingerprint() == theirs.fingerprint() and ours.links == theirs.links
    # without the selector the CPU node carrying the block label is in too
    every, _ = sources.resolve(_source(spec, node_selector=None), _cluster())
    assert _blocks(every)["cpu"] == "s9"


def test_kueue_gives_the_hand_written_fabric() -> None:
    spec = _fabric({"source": {"kueue": {"topology": "tas"}}})
    expected = {n: {"s1": "r1", "s2": "r2"}[b] for n, b in EXPECTED.items()}
    resolved, notes = sources.resolve(spec, _cluster(), [KUEUE])
    assert resolved == _hand(expected) and not notes
    assert build_fabric(resolved, {}).topology.fingerprint() == \
        build_fabric(_hand(expected), {}).topology.fingerprint()


def test_volcano_gives_the_hand_written_fabric() -> None:
    spec = _fabric({"source": {"volcano": {}}})
    resolved, notes = sources.resolve(spec, _cluster(), hypernodes=HYPERNODES)
    assert resolved == _hand(EXPECTED) and not notes
    assert build_fabric(resolved, {}).topology.fingerprint() == \
        build_fabric(_hand(EXPECTED), {}).topology.fingerprint()


def test_a_spec_without_source_is_returned_as_is() -> None:
    spec = _hand(EXPECTED)
    assert sources.resolve(spec, {}) == (spec, ())
    assert sources.resolve(spec, {})[0] is spec


# ---- bad input ---------------------------------------------------------------------------------


def test_kueue_rack_names_reused_under_two_rows_stay_apart() -> None:
    nodes = [_node("a", **{ROW: "w1", RACK: "r1"}), _node("b", **{ROW: "w2", RACK: "r1"}),
             _node("c", **{ROW: "w2", RACK: "r2"})]
    resolved, _ = sources.resolve(_fabric({"source": {"kueue": {"topology": "tas"}}}),
                                  {n.name: n for n in nodes}, [KUEUE])
    assert _blocks(resolved) == {"a": "w1,r1", "b": "w2,r1", "c": "r2"}


def test_kueue_missing_level_label_and_missing_topology() -> None:
    cluster = _cluster()
    cluster["e"] = _node("e", **{RACK: "r2"})  # lost its row label
    spec = _fabric({"source": {"kueue": {"topology": "tas"}}})
    first, notes = sources.resolve(spec, cluster, [KUEUE])
    assert "e" not in dict(_nodes(first))
    assert notes == (f"node e: label {ROW} of Kueue Topology tas is missing (left out)",)
    # with a previous good result the node stays in its block
    good, _ = sources.resolve(spec, _cluster(), [KUEUE])
    kept, notes = sources.resolve(spec, cluster, [KUEUE], previous=good)
    assert kept == good
    assert notes == (f"node e: label {ROW} of Kueue Topology tas is missing "
                     "(kept in block r2, as last seen)",)
    gone, notes = sources.resolve(spec, cluster, [], previous=good)
    assert gone == good and notes == ("Kueue Topology tas not found: keeping the last 6 nodes",)
    assert _nodes(sources.resolve(spec, cluster, [])[0]) == ()


def test_volcano_bad_members_are_reported() -> None:
    cluster = _cluster()
    bad = [*HYPERNODES,
           _hn("s3", 1, _exact("d"), _exact("ghost"),
               {"type": "Node", "selector": {"regexMatch": {"pattern": "node-[0-9"}}}),
           _hn("odd", "first")]
    spec = _fabric({"source": {"volcano": {}}})
    resolved, found = sources.resolve(spec, cluster, hypernodes=bad)
    assert "d" not in dict(_nodes(resolved)) and len(_nodes(resolved)) == 5
    notes = "\n".join(found)
    assert "node d is in tier-1 HyperNodes s2, s3 (left out)" in notes
    assert "HyperNode s3: member Node ghost does not exist" in notes
    assert "HyperNode s3: regexMatch pattern 'node-[0-9' is not a valid regular expression" in notes
    assert "HyperNode odd: spec.tier is not an integer" in notes
    good, _ = sources.resolve(spec, cluster, hypernodes=HYPERNODES)
    kept, found = sources.resolve(spec, cluster, hypernodes=bad, previous=good)
    assert kept == good
    assert "node d is in tier-1 HyperNodes s2, s3 (kept in block s2, as last seen)" in found
    none, found = sources.resolve(spec, cluster, hypernodes=[])
    assert _nodes(none) == () and found == ("no tier-1 HyperNode selects a Node of this fabric",)


def test_topograph_block_under_two_spines_is_reported() -> None:
    cluster = _cluster()
    cluster["c"] = _node("c", **{BLOCK: "s1", SPINE: "other"})
    spec = _fabric({"source": {"topograph": {}, "nodeSelector": {
        "matchExpressions": [{"key": "role", "operator": "DoesNotExist"}]}}})
    resolved, notes = sources.resolve(spec, cluster)
    assert "c" not in dict(_nodes(resolved))
    assert notes == (
        f"node c: label {SPINE}=other puts {BLOCK}=s1 under a second {SPINE} "
        "(its other nodes say sp) (left out)",)
    # the note reaches the fabric (and so the FabricTopology's Ready condition)
    assert build_fabric(resolved, {}, notes=notes).notes == notes
    other = _source(spec, topograph=TopographSource(block_label="x/leaf"))
    empty, notes = sources.resolve(other, cluster)
    assert _nodes(empty) == () and "carries label x/leaf" in notes[0]


def test_resolver_remembers_the_last_result_and_caches() -> None:
    resolver = sources.Resolver()
    spec = _fabric({"source": {"volcano": {}}})
    hand = _hand(EXPECTED)
    cluster = _cluster()
    first = resolver.resolve_all([spec, hand], cluster, [], HYPERNODES)
    assert first[1][0] is hand and first[0] == (hand, ())
    assert resolver.resolve_all([spec], cluster, [], HYPERNODES)[0] is first[0]  # cached
    bad = [*HYPERNODES, _hn("s3", 1, _exact("d"))]
    kept, notes = resolver.resolve_all([spec], cluster, [], bad)[0]
    assert _nodes(kept) == _nodes(hand) and notes  # d kept where it was
    # relabelling a node moves it: a new spec, so a new fabric fingerprint
    labels = _fabric({"source": {"topograph": {}}}, name="g")
    before, _ = resolver.resolve_all([labels], cluster)[0]
    cluster["a"] = _node("a", **{BLOCK: "s2", SPINE: "sp"})
    moved, notes = resolver.resolve_all([labels], cluster)[0]
    assert _blocks(moved)["a"] == "s2" and moved != before and not notes
    assert build_fabric(moved, {}).topology.fingerprint() != \
        build_fabric(before, {}).topology.fingerprint()
    assert resolver.resolve_all([], cluster) == [] and not resolver._last
