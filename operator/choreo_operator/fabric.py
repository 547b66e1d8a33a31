"""FabricTopology + NodeFabric - DeviceFailure - NotReady nodes -> one ``choreo.topology.Topology``.

The operator's fabric graph is the same type every other part of choreo uses, so the request
it sends is exactly what the synthesizer verifies against. Node models come from
``choreo.generators`` (a preset is built once and copied per node) unless the node's agent has
reported a NodeFabric. GPU ``g`` of node ``n`` is named ``n/gpu<g>``; NPUs get the ids
0..N-1 in fabric-position order, switches follow.

Inter-node shapes:
- ``rail``: rail switch ``rail<r>`` joins NIC ``r`` of every node. A NIC is a switch node
  ``<node>/nic<r>`` shared by the GPUs ``g`` with ``g * rails // gpus == r`` (or as the agent
  reported); with one rail per GPU, GPU ``r`` plugs into rail ``r`` directly, as in
  ``generators.dgx_h100``.
- ``switch``: the same NICs, all on one switch ``fabric-switch``.
- blocks (``rail`` and ``switch``): a node in block ``b`` plugs into the block's own leaf
  switches ``b/rail<r>`` (``b/fabric-switch``) instead; nodes in no block share the plain
  ``rail<r>``. Every leaf of a rail joins the rail's spine switch ``spine/rail<r>``
  (``spine/fabric-switch``) by one duplex uplink carrying the leaf's port bandwidth over
  ``interNode.spineOversubscription`` (1: non-blocking; 2: 2:1), with the same per-hop alpha
  as a port. A rail with a single leaf gets no spine, so a fabric without blocks is exactly
  the flat one.
- ``torus``: nodes on a torus over ``dims`` by position; GPU ``g`` links to GPU ``g`` of each
  neighbour node.
- ``none``: nodes are islands.

References to nodes, GPUs, links or NICs the fabric does not have never raise: they are
reported per DeviceFailure in ``Fabric.problems`` so the operator can set a condition.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from choreo import generators
from choreo.errors import ChoreoError, InputError
from choreo.topology import Link, NodeKind, Topology
from choreo_api import DeviceFailure, FabricNode, FabricTopology, IntraNode, NodeFabricSpec
from choreo_operator.grouping import Group, Member, footprint, groups

Ref = tuple[str, int | str]  # ("gpu", local index) or ("sw", local switch name)


@dataclass
class LocalModel:
    """One node's GPUs, switches and directed links, in node-local references."""

    gpus: tuple[int, ...]
    switches: list[str] = field(default_factory=list)
    links: list[tuple[Ref, Ref, float, float, str, bool]] = field(default_factory=list)
    failed_gpus: set[int] = field(default_factory=set)
    # rail -> (attach point, port bandwidth or None for the fabric default)
    rails: dict[int, tuple[Ref, float | None]] = field(default_factory=dict)
    nic_names: dict[str, int] = field(default_factory=dict)  # NIC name -> rail
    down_rails: set[int] = field(default_factory=set)  # rails whose port is down


@dataclass(frozen=True)
class Fabric:
    """The fabric graph and how Kubernetes names map onto it."""

    topology: Topology
    gpu_ids: Mapping[tuple[str, int], int]
    node_gpus: Mapping[str, tuple[int, ...]]
    problems: Mapping[str, str]
    notes: tuple[str, ...] = ()

    def gpu(self, node: str, index: int) -> int | None:
        return self.gpu_ids.get((node, index))


# ---- node models -------------------------------------------------------------------------------


@functools.lru_cache(maxsize=32)
def _preset_topology(preset: str, gpus: int, bandwidth: float | None,
                     alpha: float | None) -> Topology:
    default_alpha = 0.7e-6 if alpha is None else alpha
    if preset in ("dgx-h100", "hgx-8"):
        return generators.dgx_h100(1, nvswitch_bandwidth=bandwidth
                                   or generators.H100_NVSWITCH_BANDWIDTH,
                                   nvswitch_alpha=default_alpha)
    if preset == "dgx2":
        return generators.dgx2(1, nvswitch_bandwidth=bandwidth or 1e6 / 8e-6,
                               nvswitch_alpha=default_alpha)
    if preset == "dgx1":
        return generators.dgx1(bandwidth=bandwidth or 25e9, alpha=default_alpha)
    if preset == "mi250":
        return generators.mi250(xgmi_bandwidth=bandwidth or 50e9, alpha=default_alpha)
    if gpus < 2:
        return Topology(name="generic-1", kinds=(NodeKind.NPU,), links=(), names=("gpu0",))
    return generators.switch(gpus, bandwidth=bandwidth or generators.H100_NVSWITCH_BANDWIDTH,
                             alpha=default_alpha,
                             kind="nvswitch")


def _local_name(name: str) -> str:
    return name.split("/", 1)[1] if "/" in name else name


def preset_model(ft: FabricTopology) -> LocalModel:
    """The node model of ``spec.intraNode``, built by the matching generator."""
    intra = ft.spec.intra_node or IntraNode()
    topo = _preset_topology(intra.preset, intra.gpus, intra.bandwidth, intra.alpha)
    npus = topo.all_npus
    model = LocalModel(gpus=tuple(range(len(npus))))
    refs: dict[int, Ref] = {v: ("gpu", i) for i, v in enumerate(npus)}
    for v in topo.switches:
        name = _local_name(topo.node_name(v))
        model.switches.append(name)
        refs[v] = ("sw", name)
    for lk in topo.links:
        model.links.append((refs[lk.src], refs[lk.dst], lk.alpha, lk.bandwidth, lk.kind, True))
    return model


PCIE_SLACK = 0.9  # a PCIe hop measured within 10% of the NIC's rate is not its bottleneck


def _dedicated_nics(nf: NodeFabricSpec, known: set[int]) -> dict[str, int]:
    """NIC name -> the one GPU it serves, for NICs no other GPU uses (rail-optimized nodes)."""
    users: dict[str, set[int]] = {}
    for lk in nf.links:
        if lk.dst_nic is not None and lk.src in known:
            users.setdefault(lk.dst_nic, set()).add(lk.src)
    out = {name: next(iter(gpus)) for name, gpus in users.items() if len(gpus) == 1}
    for nic in nf.nics:
        if nic.name not in users and nic.nearest_gpu is not None and nic.nearest_gpu in known:
            out[nic.name] = nic.nearest_gpu
    return out


def agent_model(nf: NodeFabricSpec) -> LocalModel:
    """The node model its agent measured: GPUs, links (switch and NIC ports are duplex).

    A NIC that serves a single GPU is that GPU's own port into its rail, as in the presets
    (``generators.dgx_h100``): the GPU links to the rail directly at the NIC's line rate
    (or the measured PCIe rate when that is clearly lower), and the port is down when either
    is. Measurement noise on the PCIe hop is kept out of the rail ports on purpose: the
    synthesizer's switch unwinding does much worse on rail switches whose ports differ by a
    fraction of a percent (6x lower bus bandwidth on 4 DGX-H100 nodes), as it does with a
    two-port NIC switch on every inter-node path.
    """
    model = LocalModel(gpus=tuple(g.index for g in nf.gpus))
    model.failed_gpus = {g.index for g in nf.gpus if not g.healthy}
    known = set(model.gpus)
    nic_health = {n.name: n.healthy for n in nf.nics}
    dedicated = _dedicated_nics(nf, known)
    port: dict[str, tuple[float, bool]] = {}  # dedicated NIC -> (PCIe bandwidth, healthy)
    linked_nics: set[str] = set()
    for lk in nf.links:
        if lk.src not in known:
            continue
        src: Ref = ("gpu", lk.src)
        alpha = lk.alpha or 0.0
        if lk.dst_gpu is not None:
            if lk.dst_gpu not in known:
                continue
            for _ in range(lk.count):
                model.links.append((src, ("gpu", lk.dst_gpu), alpha, lk.bandwidth, lk.kind,
                                    lk.healthy))
            continue
        name = lk.dst_switch if lk.dst_switch is not None else lk.dst_nic
        if name is None:
            continue
        if lk.dst_nic is not None and name in dedicated:
            bw, ok = port.get(name, (0.0, True))
            port[name] = (bw + lk.bandwidth * lk.count, ok and lk.healthy)
            continue
        if name not in model.switches:
            model.switches.append(name)
        if lk.dst_nic is not None:
            linked_nics.add(name)
        healthy = lk.healthy and nic_health.get(name, True)
        for _ in range(lk.count):
            model.links.append((src, ("sw", name), alpha / 2, lk.bandwidth, lk.kind, healthy))
            model.links.append((("sw", name), src, alpha / 2, lk.bandwidth, lk.kind, healthy))
    for r, nic in enumerate(nf.nics):
        rail = nic.rail if nic.rail is not None else r
        model.nic_names[nic.name] = rail
        if nic.name in dedicated:
            pcie, ok = port.get(nic.name, (nic.bandwidth or 25e9, True))
            bw = nic.bandwidth if nic.bandwidth and pcie >= PCIE_SLACK * nic.bandwidth else pcie
            model.rails[rail] = (("gpu", dedicated[nic.name]), bw)
            if not (ok and nic.healthy):
                model.down_rails.add(rail)
            continue
        if nic.name not in model.switches:
            model.switches.append(nic.name)
        if nic.name not in linked_nics and nic.nearest_gpu is not None \
                and nic.nearest_gpu in known:
            bw = nic.bandwidth or 25e9
            g: Ref = ("gpu", nic.nearest_gpu)
            model.links.append((g, ("sw", nic.name), 0.0, bw, "pcie", nic.healthy))
            model.links.append((("sw", nic.name), g, 0.0, bw, "pcie", nic.healthy))
        model.rails[rail] = (("sw", nic.name), nic.bandwidth if nic.healthy else None)
    return model


def _default_rails(model: LocalModel, rails: int, bandwidth: float) -> None:
    """NICs for a node whose agent did not report any: per GPU, or shared by neighbours."""
    gpus = model.gpus
    if not gpus or model.rails:
        return
    if rails >= len(gpus):
        for r, g in enumerate(gpus):
            model.rails[r] = (("gpu", g), None)
            model.nic_names[f"nic{r}"] = r
        return
    for r in range(rails):
        name = f"nic{r}"
        model.switches.append(name)
        model.rails[r] = (("sw", name), None)
        model.nic_names[name] = r
    for i, g in enumerate(gpus):
        nic: Ref = ("sw", f"nic{i * rails // len(gpus)}")
        model.links.append((("gpu", g), nic, 0.0, bandwidth, "pcie", True))
        model.links.append((nic, ("gpu", g), 0.0, bandwidth, "pcie", True))


# ---- assembly ----------------------------------------------------------------------------------


class _Builder:
    def __init__(self) -> None:
        self.names: list[str] = []
        self.kinds: list[NodeKind] = []
        self.links: list[Link] = []
        self.ids: dict[str, int] = {}

    def node(self, name: str, kind: NodeKind) -> int:
        self.ids[name] = len(self.names)
        self.names.append(name)
        self.kinds.append(kind)
        return self.ids[name]

    def duplex(self, a: int, b: int, alpha: float, bw: float, kind: str) -> None:
        self.links.append(Link(a, b, alpha, bw, kind))
        self.links.append(Link(b, a, alpha, bw, kind))


def _ref_name(node: str, ref: Ref) -> str:
    return f"{node}/gpu{ref[1]}" if ref[0] == "gpu" else f"{node}/{ref[1]}"


def _coords(position: int, dims: Sequence[int]) -> tuple[int, ...]:
    out = []
    for d in reversed(dims):
        out.append(position % d)
        position //= d
    return tuple(reversed(out))


@dataclass(frozen=True)
class BaseFabric:
    """The fabric before failures and down nodes: rebuilt only when the FabricTopology or a
    NodeFabric changes, so a DeviceFailure costs one pass over the links, not a rebuild."""

    topology: Topology
    ids: Mapping[str, int]
    models: Mapping[str, LocalModel]
    gpu_ids: Mapping[tuple[str, int], int]
    node_gpus: Mapping[str, tuple[int, ...]]
    failed: frozenset[int]  # GPUs the agents report unhealthy
    notes: tuple[str, ...]
    blocks: Mapping[str, str] = field(default_factory=dict)  # node -> block


def build_fabric(ft: FabricTopology, node_fabrics: Mapping[str, NodeFabricSpec],
                 failures: Iterable[DeviceFailure] = (), down_nodes: Iterable[str] = (),
                 notes: Sequence[str] = ()) -> Fabric:
    """The live fabric: every unresolved failure and every down node applied."""
    return apply_failures(base_fabric(ft, node_fabrics, notes), failures, down_nodes)


def fabric_nodes(ft: FabricTopology) -> tuple[FabricNode, ...]:
    """The nodes in fabric order (``model.fabric_topology`` sorts them by position)."""
    return ft.spec.nodes or ()


def base_fabric(ft: FabricTopology, node_fabrics: Mapping[str, NodeFabricSpec],
                notes: Sequence[str] = ()) -> BaseFabric:
    """``notes``: what is wrong with the inputs (a source's inconsistencies), for the Ready
    condition with the problems found here."""
    problems: list[str] = list(notes)
    nodes = fabric_nodes(ft)
    inter = ft.spec.inter_node
    seen_positions: dict[int, str] = {}
    for n in nodes:
        if n.position in seen_positions:
            problems.append(f"nodes {seen_positions[n.position]} and {n.name} share position "
                            f"{n.position}")
        seen_positions.setdefault(n.position, n.name)
    preset = preset_model(ft)
    models: dict[str, LocalModel] = {}
    for n in nodes:
        nf = node_fabrics.get(n.name)
        model = agent_model(nf) if nf is not None and nf.gpus else _copy(preset)
        if inter.type in ("rail", "switch"):
            rails = inter.rails or (len(model.gpus) if inter.type == "switch" else 1)
            _default_rails(model, rails, inter.bandwidth)
        models[n.name] = model

    b = _Builder()
    gpu_ids: dict[tuple[str, int], int] = {}
    node_gpus: dict[str, tuple[int, ...]] = {}
    names = [n.name for n in nodes]
    for name in names:
        ids = []
        for g in models[name].gpus:
            gpu_ids[(name, g)] = b.node(f"{name}/gpu{g}", NodeKind.NPU)
            ids.append(gpu_ids[(name, g)])
        node_gpus[name] = tuple(ids)
    for name in names:
        for sw in models[name].switches:
            b.node(f"{name}/{sw}", NodeKind.SWITCH)
    for name in names:
        for src, dst, alpha, bw, kind, healthy in models[name].links:
            b.links.append(Link(b.ids[_ref_name(name, src)], b.ids[_ref_name(name, dst)], alpha,
                                bw, kind, healthy))
    _inter_node(ft, models, b, problems)
    if len(b.ids) != len(b.names):
        clash = sorted({n for n in b.names if b.names.count(n) > 1})
        problems.append(f"fabric names used twice (a block named like a node or 'spine'?): "
                        f"{', '.join(clash[:5])}")
    failed = frozenset(gpu_ids[(name, g)] for name in names
                       for g in models[name].failed_gpus if (name, g) in gpu_ids)
    topo = Topology(name=ft.metadata.name, kinds=tuple(b.kinds), links=tuple(b.links),
                    failed=frozenset(), names=tuple(b.names))
    try:
        topo.validate("fabric")  # failures change health only, so the live fabric is valid too
    except InputError as err:
        problems.append(str(err))
    return BaseFabric(topo, b.ids, models, gpu_ids, node_gpus, failed, tuple(problems),
                      {n.name: n.block for n in nodes if n.block})


def apply_failures(base: BaseFabric, failures: Iterable[DeviceFailure] = (),
                   down_nodes: Iterable[str] = ()) -> Fabric:
    topo = base.topology
    failed = set(base.failed)
    for name in set(down_nodes):
        failed.update(base.node_gpus.get(name, ()))
    problems: dict[str, str] = {}
    bad_links: set[int] = set()
    for f in failures:
        if f.spec.resolved:
            continue
        found = _apply_failure(f, topo, base.ids, base.models, failed, bad_links,
                               base.blocks.get(f.spec.node, ""))
        if found:
            problems[f.metadata.name] = found
    final = topo.with_health(frozenset(failed), bad_links)
    return Fabric(final, base.gpu_ids, base.node_gpus, problems, base.notes)


def _copy(model: LocalModel) -> LocalModel:
    return LocalModel(model.gpus, list(model.switches), list(model.links), set(model.failed_gpus),
                      dict(model.rails), dict(model.nic_names), set(model.down_rails))


def _inter_node(ft: FabricTopology, models: Mapping[str, LocalModel], b: _Builder,
                notes: list[str]) -> None:
    nodes = fabric_nodes(ft)
    inter = ft.spec.inter_node
    names = [n.name for n in nodes]
    if inter.type == "none" or len(names) < 2:
        return
    alpha, bw = inter.alpha, inter.bandwidth
    if inter.type == "torus":
        dims = inter.dims or (len(names),)
        size = 1
        for d in dims:
            size *= d
        at = {n.position: n.name for n in nodes if n.position < size}
        for name, pos in ((n.name, n.position) for n in nodes):
            if pos >= size:
                notes.append(f"node {name}: position {pos} is outside the torus {dims}")
                continue
            coords = _coords(pos, dims)
            for axis, d in enumerate(dims):
                if d < 2 or (d == 2 and coords[axis] == 1):
                    continue
                nxt = list(coords)
                nxt[axis] = (coords[axis] + 1) % d
                npos = 0
                for c, dd in zip(nxt, dims, strict=True):
                    npos = npos * dd + c
                other = at.get(npos)
                if other is None:
                    continue
                for g in set(models[name].gpus) & set(models[other].gpus):
                    b.duplex(b.ids[f"{name}/gpu{g}"], b.ids[f"{other}/gpu{g}"], alpha, bw,
                             "optical")
        return
    blocks = {n.name: n.block for n in nodes if n.block}
    leaves: dict[tuple[int, str], int] = {}  # (rail or 0, block) -> leaf switch
    labels: dict[int, str] = {}
    ports: dict[tuple[int, str], float] = {}  # the bandwidth of a leaf's node ports
    for name in names:
        block = blocks.get(name, "")
        for rail, (ref, port_bw) in sorted(models[name].rails.items()):
            key = 0 if inter.type == "switch" else rail
            label = labels.setdefault(key, "fabric-switch" if inter.type == "switch"
                                      else f"rail{rail}")
            leaf = leaves.get((key, block))
            if leaf is None:
                leaf = leaves[(key, block)] = b.node(_leaf_name(block, label), NodeKind.SWITCH)
            end, up = b.ids[_ref_name(name, ref)], rail not in models[name].down_rails
            b.links.append(Link(end, leaf, alpha / 2, port_bw or bw, "ib", up))
            b.links.append(Link(leaf, end, alpha / 2, port_bw or bw, "ib", up))
            ports[(key, block)] = ports.get((key, block), 0.0) + (port_bw or bw)
    ratio = inter.spine_oversubscription or 1.0
    for key, label in labels.items():
        under = [(block, leaf) for (k, block), leaf in leaves.items() if k == key]
        if len(under) < 2:
            continue
        spine = b.node(f"spine/{label}", NodeKind.SWITCH)
        for block, leaf in under:
            b.duplex(leaf, spine, alpha / 2, ports[(key, block)] / ratio, "ib")


def _leaf_name(block: str, label: str) -> str:
    """The switch of ``block`` for rail ``label`` (``rail<r>`` or ``fabric-switch``)."""
    return f"{block}/{label}" if block else label


def _apply_failure(f: DeviceFailure, topo: Topology, ids: Mapping[str, int],
                   models: Mapping[str, LocalModel], failed: set[int],
                   bad_links: set[int], block: str = "") -> str | None:
    """Mark what ``f`` names as failed; return why it names nothing, or None. ``block`` is
    the node's block: its NICs plug into that block's leaf switches."""
    node, dev = f.spec.node, f.spec.device
    model = models.get(node)
    if model is None:
        return f"node {node} is not in FabricTopology {topo.name}"
    gid = ids.get(f"{node}/gpu{dev.gpu}") if dev.gpu is not None else None
    if dev.type == "gpu":
        if gid is None:
            return f"node {node} has no GPU {dev.gpu}"
        failed.add(gid)
        return None
    if dev.nic is not None:  # a NIC, or a GPU's link to one
        rail = model.nic_names.get(dev.nic)
        if rail is None:
            return f"node {node} has no NIC {dev.nic}"
        ref = model.rails[rail][0]
        end = ids[_ref_name(node, ref)]
        uplink = ids.get(_leaf_name(block, f"rail{rail}"),
                         ids.get(_leaf_name(block, "fabric-switch")))
        if ref[0] == "gpu":  # the NIC is the GPU's own port into the rail
            if dev.type == "link" and ref[1] != dev.gpu:
                return f"node {node}: NIC {dev.nic} belongs to GPU {ref[1]}, not {dev.gpu}"
            bad_links.update(_between(topo, end, uplink) if uplink is not None else ())
            return None
        if dev.type == "nic":
            bad_links.update((*topo.out_links(end), *topo.in_links(end)))
            return None
        if gid is None:
            return f"node {node} has no GPU {dev.gpu}"
        return _take_down(topo, gid, end, bad_links,
                          f"node {node}: GPU {dev.gpu} has no link to NIC {dev.nic}")
    if gid is None:
        return f"node {node} has no GPU {dev.gpu}"
    if dev.switch is not None:
        sw = ids.get(f"{node}/{dev.switch}")
        if sw is None:
            return f"node {node} has no switch {dev.switch}"
        return _take_down(topo, gid, sw, bad_links,
                          f"node {node}: GPU {dev.gpu} has no link to switch {dev.switch}")
    peer = ids.get(f"{node}/gpu{dev.peer_gpu}")
    if peer is None:
        return f"node {node} has no GPU {dev.peer_gpu}"
    return _take_down(topo, gid, peer, bad_links,
                      f"node {node}: GPUs {dev.gpu} and {dev.peer_gpu} have no direct link")


def _take_down(topo: Topology, a: int, b: int, bad_links: set[int], missing: str) -> str | None:
    """Mark the links between ``a`` and ``b`` failed; ``missing`` when there are none."""
    found = _between(topo, a, b)
    bad_links.update(found)
    return None if found else missing


def _between(topo: Topology, a: int, b: int) -> list[int]:
    """Indices of the links a->b and b->a."""
    return [i for i in (*topo.out_links(a), *topo.out_links(b))
            if {topo.links[i].src, topo.links[i].dst} == {a, b}]


@dataclass
class _Cut:
    sub: Topology
    ids: dict[int, int]
    held: tuple[int, ...]  # the fabric links it holds, in the order of its own
    health: tuple[frozenset[int], frozenset[int]]  # its broken links and failed nodes
    checked: bool = False  # whether its live NPUs were checked to be connected
    disconnected: str | None = None  # why they are not

    @cached_property
    def links(self) -> frozenset[int]:
        return frozenset(self.held)

    def with_health(self, health: tuple[frozenset[int], frozenset[int]]) -> _Cut | None:
        """This cut with other broken links and failed nodes, without cutting again (its
        GPUs and switches do not depend on health); None where a link it has broken is
        whole again, which ``Topology.with_health`` cannot undo."""
        broken, failed = health
        if not self.health[0] <= broken:
            return None
        at = {link: i for i, link in enumerate(self.held)}
        sub = self.sub.with_health(frozenset(self.ids[v] for v in failed),
                                   (at[i] for i in broken))
        return _Cut(sub, self.ids, self.held, health)


class Subfabrics:
    """``subfabric`` results, reused while the links and nodes they hold keep their health.

    Every round cuts a sub-fabric per tenant group out of the live fabric, and a failure
    rebuilds that fabric; most groups do not touch the failed device, so their cut is still
    right, and so is what was learned from it (whether its NPUs are connected). Tenants'
    footprints, and so the grouping of tenants placed where they were, depend on the wiring
    alone; a group's inputs hash on what it holds. Valid for one base fabric: ``clear`` when
    the FabricTopology or a NodeFabric changes (link ids and attributes come from it)."""

    def __init__(self) -> None:
        self._cuts: dict[tuple[str, tuple[int, ...]], _Cut] = {}
        self._footprints: dict[tuple[int, ...], frozenset[int]] = {}
        self._used: set[tuple[str, tuple[int, ...]]] = set()
        self._used_footprints: set[tuple[int, ...]] = set()
        self._groups: tuple[tuple[Member, ...], list[Group], set[tuple[int, ...]]] | None = None
        self._hashes: dict[Hashable, str] = {}
        self._used_hashes: set[Hashable] = set()

    def clear(self) -> None:
        self._cuts.clear()
        self._footprints.clear()
        self._groups = None

    def keep_used(self) -> None:
        """Forget the cuts, footprints and hashes nobody asked for since the last call
        (groups that changed)."""
        for key in set(self._cuts) - self._used:
            del self._cuts[key]
        for npus in set(self._footprints) - self._used_footprints:
            del self._footprints[npus]
        for h in set(self._hashes) - self._used_hashes:
            del self._hashes[h]
        self._used.clear()
        self._used_footprints.clear()
        self._used_hashes.clear()

    def groups(self, topo: Topology, members: Sequence[Member]) -> list[Group]:
        """``grouping.groups``: the last answer again while the members are the same (a
        failure changes none: members are grouped by the GPUs they were placed on)."""
        key = tuple(members)
        if self._groups is not None and self._groups[0] == key:
            self._used_footprints.update(self._groups[2])
            return self._groups[1]
        asked: set[tuple[int, ...]] = set()

        def footprint(t: Topology, npus: tuple[int, ...]) -> frozenset[int]:
            asked.add(_ids(npus))
            return self.footprint(t, npus)

        found = groups(topo, key, footprint)
        self._groups = (key, found, asked)
        return found

    def hashed(self, key: Hashable, compute: Callable[[], str]) -> str:
        """``compute()``, once while ``key`` is asked for every round."""
        self._used_hashes.add(key)
        found = self._hashes.get(key)
        if found is None:
            found = self._hashes[key] = compute()
        return found

    def get(self, topo: Topology, npus: Iterable[int],
            name: str = "") -> tuple[Topology, dict[int, int]]:
        cut = self._cut(topo, npus, name)
        return cut.sub, cut.ids

    def disconnected(self, topo: Topology, npus: Sequence[int]) -> str | None:
        """Why the tenant placed on ``npus`` cannot run on its own live GPUs, or None. Its
        sub-fabric holds exactly what its data may cross (its GPUs and the switches between
        them); a failed GPU stays in it, as failed, so a failure changes only its health."""
        cut = self._cut(topo, npus, "")
        if not cut.checked:
            live = [cut.ids[v] for v in npus if v not in topo.failed]
            try:
                cut.sub.check_connected(live, "tenant")
            except ChoreoError as err:
                cut.disconnected = str(err)
            cut.checked = True
        return cut.disconnected

    def footprint(self, topo: Topology, npus: tuple[int, ...]) -> frozenset[int]:
        """``grouping.footprint``, once per tenant while the wiring stays."""
        key = _ids(npus)
        self._used_footprints.add(key)
        found = self._footprints.get(key)
        if found is None:
            found = self._footprints[key] = frozenset(footprint(topo, key))
        return found

    def _cut(self, topo: Topology, npus: Iterable[int], name: str) -> _Cut:
        key = (name, _ids(npus))
        self._used.add(key)
        cut = self._cuts.get(key)
        if cut is not None:
            health = self._health(topo, cut.links, cut.ids)
            if health != cut.health:
                cut = cut.with_health(health)
        if cut is None:
            sub, ids, held = _cut(topo, key[1], name)
            cut = _Cut(sub, ids, held, self._health(topo, frozenset(held), ids))
        self._cuts[key] = cut
        return cut

    def _health(self, topo: Topology, links: frozenset[int],
                ids: Mapping[int, int]) -> tuple[frozenset[int], frozenset[int]]:
        """The broken links among ``links`` and the failed nodes among ``ids``: a few set
        intersections, not a look at every link a 1000-GPU tenant's cut holds."""
        return topo.broken_links & links, frozenset(v for v in topo.failed if v in ids)


def _ids(npus: Iterable[int]) -> tuple[int, ...]:
    return tuple(sorted(set(npus)))


def subfabric(topo: Topology, npus: Iterable[int],
              name: str = "") -> tuple[Topology, dict[int, int]]:
    """The part of ``topo`` a group's traffic can use, renumbered densely.

    Keeps the given NPUs and the switches on switch-only paths between them (switches that
    would hang off by a single neighbour are pruned), so a request for a 64-GPU tenant stays
    small on a 8000-GPU fabric and its fingerprint changes only when something it can use
    changes. Returns the topology and the map from fabric ids to its ids.
    """
    sub, ids, _ = _cut(topo, npus, name)
    return sub, ids


def _cut(topo: Topology, npus: Iterable[int],
         name: str) -> tuple[Topology, dict[int, int], tuple[int, ...]]:
    """``subfabric``, and the fabric links it holds."""
    keep_npus = sorted(set(npus))
    links, trunks = topo.links, topo.trunk_links
    switches: set[int] = set()
    stack: list[int] = []
    for v in keep_npus:
        for i in topo.out_links(v):
            w = links[i].dst
            if not topo.is_npu(w) and w not in switches:
                switches.add(w)
                stack.append(w)
    while stack:
        s = stack.pop()
        for i in trunks[s]:
            w = links[i].dst
            if links[i].src == s and w not in switches:
                switches.add(w)
                stack.append(w)
    neighbours: dict[int, set[int]] = {s: set() for s in switches}
    for v in keep_npus:
        for i in (*topo.out_links(v), *topo.in_links(v)):
            lk = links[i]
            other = lk.dst if lk.src == v else lk.src
            if other in switches:
                neighbours[other].add(v)
    for s in switches:
        for i in trunks[s]:
            lk = links[i]
            other = lk.dst if lk.src == s else lk.src
            if other in switches:
                neighbours[s].add(other)
    leaves = [s for s, n in neighbours.items() if len(n) < 2]
    while leaves:
        s = leaves.pop()
        if s not in switches:
            continue
        switches.discard(s)
        for other in neighbours.pop(s):
            if other in neighbours:
                neighbours[other].discard(s)
                if len(neighbours[other]) < 2:
                    leaves.append(other)
    order = keep_npus + sorted(switches)
    ids = {old: new for new, old in enumerate(order)}
    touching = {i for v in keep_npus for i in (*topo.out_links(v), *topo.in_links(v))}
    touching.update(i for s in switches for i in trunks[s])
    held = tuple(i for i in sorted(touching) if links[i].src in ids and links[i].dst in ids)
    sub_links = tuple(Link(ids[lk.src], ids[lk.dst], lk.alpha, lk.bandwidth, lk.kind, lk.healthy)
                      for lk in (links[i] for i in held))
    sub = Topology(name=name or topo.name, kinds=tuple(topo.kinds[v] for v in order),
                   links=sub_links,
                   failed=frozenset(ids[v] for v in topo.failed if v in ids),
                   names=tuple(topo.node_name(v) for v in order))
    return sub, ids, held
