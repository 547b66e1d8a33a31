"""A FabricTopology's ``spec.source``: its nodes and blocks from a topology the cluster already has.

``resolve`` is a pure function from (FabricTopology, Nodes with labels, Kueue Topologies,
Volcano HyperNodes, the previous result) to an ordinary FabricTopology: nodes numbered
0..n-1 in (block, node name) order with their blocks, ``source`` cleared, and the source's
problems as notes (they reach the FabricTopology's Ready condition through
``fabric.base_fabric``). The same cluster described by hand gives the same FabricTopology, so
the same fabric and fingerprint. Every source honours ``source.nodeSelector`` (matchLabels and
matchExpressions): a node it does not select is not in the fabric, whatever the source says.

Sources, as their public definitions give them (checked against the upstream sources):

- ``topograph``: NVIDIA Topograph's Kubernetes engine labels every node with
  ``network.topology.nvidia.com/{accelerator,block,spine,datacenter}`` (NVIDIA/topograph
  docs/k8s.md; docs/reference/node-labels.md). The nodes are those carrying the block label
  (the leaf switch), the block is its value. Newer Topograph releases can write other keys
  (``network.topology.nvidia.com/leaf``, ``fabric.topograph.run/tier-0``):
  ``source.topograph.blockLabel`` names the one to read. The switch tree must be a tree: a
  block whose nodes name two spines (or a spine under two datacenters) disagrees with itself.
  The accelerator (NVLink domain) label is not used: the node model is ``intraNode``.
- ``kueue``: a Kueue ``Topology`` (kueue.x-k8s.io, cluster-scoped; v1alpha1, v1beta1 and
  v1beta2 share ``spec.levels[].nodeLabel``, highest level first, ``kubernetes.io/hostname``
  only as the lowest: kubernetes-sigs/kueue apis/kueue/*/topology_types.go). Nodes are those
  carrying the label of the lowest level above the hostname (the hostname itself when it is
  the only level); one that lacks another level label is inconsistent. The block is the
  value of that lowest level; Kueue tells domains apart by the values of every level, so
  when one value sits under two parents the block is named by the comma-joined values from
  the top (Kueue's own domain id).
- ``volcano``: Volcano ``HyperNode`` objects (topology.volcano.sh/v1alpha1, cluster-scoped;
  ``spec.tier`` an integer, 1 the lowest (a string in early releases), ``spec.members[]`` of
  ``type`` Node or HyperNode with ``selector.exactMatch.name``, ``.regexMatch.pattern`` or
  ``.labelMatch`` (a LabelSelector): volcano-sh/apis pkg/apis/topology/v1alpha1/
  hypernode_types.go). Blocks are the tier-1 HyperNodes' Node members, named after the
  HyperNode. A pattern matches anywhere in the name, as Volcano's ``regexp.MatchString``
  does (volcano-sh/volcano pkg/scheduler/api/hyper_node_info.go ``GetMembers``); it is
  compiled with Python's ``re``, whose syntax differs from Go's RE2 only at the margins.

Bad input: a node the source places inconsistently (in two tier-1 HyperNodes, missing a Kueue
level label, under two spines) stays where the previous result had it, if it had it, and is
left out otherwise; either way a note names the node and the label or object. The rest of
the cluster keeps following the source. A source that yields no node at all (the Kueue
Topology is gone, every HyperNode deleted, the labels wiped) keeps the previous node list.
A platform team fixing a label typo does not see running jobs lose their nodes, and a node
nobody can place does not join. Problems that name no node (a pattern that does not compile,
a member naming a Node that does not exist) are notes only. Without a previous result (the
operator just started) inconsistent nodes are left out until the source is fixed.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from choreo_api import FabricNode, FabricSource, FabricTopology
from choreo_operator.model import HyperNode, HyperNodeMember, KueueTopology, NodeInfo

HOSTNAME = "kubernetes.io/hostname"
TOPOGRAPH_SPINE = "network.topology.nvidia.com/spine"
TOPOGRAPH_DATACENTER = "network.topology.nvidia.com/datacenter"


@dataclass
class _Found:
    """What a source says: node -> block ("" for none), inconsistent nodes -> why."""

    blocks: dict[str, str] = field(default_factory=dict)
    bad: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    empty: str | None = None  # why the source yields no node at all


Notes = tuple[str, ...]


def resolve(ft: FabricTopology, nodes: Mapping[str, NodeInfo],
            topologies: Iterable[KueueTopology] = (), hypernodes: Iterable[HyperNode] = (),
            previous: FabricTopology | None = None) -> tuple[FabricTopology, Notes]:
    """The FabricTopology ``spec.source`` describes and the source's problems; ``ft`` itself
    if it has no source. ``previous`` is the last result for the same source, if any."""
    src = ft.spec.source
    if src is None:
        return ft, ()
    labels = {name: info.label_map for name, info in nodes.items()}
    selector = src.node_selector
    selected = {n: lab for n, lab in labels.items()
                if selector is None or selector.empty or selector.matches(lab)}
    if src.topograph is not None:
        found = _topograph(src, src.topograph.block_label, selected)
    elif src.kueue is not None:
        found = _kueue(src, src.kueue.topology, selected, topologies)
    else:
        found = _volcano(selected, labels, hypernodes)
    last: dict[str, str] = {}
    if previous is not None:
        last = {n.name: n.block or "" for n in previous.spec.nodes or ()}
    notes = list(found.problems)
    members = dict(found.blocks)
    if found.empty is not None:
        if last:
            members = last
            notes.append(f"{found.empty}: keeping the last {len(last)} nodes")
        else:
            notes.append(found.empty)
    else:
        for node, why in sorted(found.bad.items()):
            if node in last:
                members[node] = last[node]
                where = f"in block {last[node]}" if last[node] else "where it was"
                notes.append(f"{why} (kept {where}, as last seen)")
            else:
                notes.append(f"{why} (left out)")
    order = sorted(members, key=lambda n: (members[n], n))
    spec = ft.spec.model_copy(update={"source": None, "nodes": tuple(
        FabricNode(name=n, position=i, block=members[n] or None) for i, n in enumerate(order))})
    return ft.model_copy(update={"spec": spec}), tuple(notes)


def _selector_text(src: FabricSource) -> str:
    selector = src.node_selector
    return "" if selector is None or selector.empty else " selected by source.nodeSelector"


def _topograph(src: FabricSource, key: str, nodes: Mapping[str, Mapping[str, str]]) -> _Found:
    out = _Found()
    for name, labels in nodes.items():
        if key not in labels:
            continue
        if not labels[key]:
            out.bad[name] = f"node {name}: label {key} is empty"
            continue
        out.blocks[name] = labels[key]
    # the switch tree: one spine per block, one datacenter per spine
    spine = {n: nodes[n][TOPOGRAPH_SPINE] for n in out.blocks if nodes[n].get(TOPOGRAPH_SPINE)}
    _tree(out, dict(out.blocks), spine, key, TOPOGRAPH_SPINE)
    dc = {n: nodes[n][TOPOGRAPH_DATACENTER] for n in spine
          if n in out.blocks and nodes[n].get(TOPOGRAPH_DATACENTER)}
    _tree(out, {n: s for n, s in spine.items() if n in out.blocks}, dc, TOPOGRAPH_SPINE,
          TOPOGRAPH_DATACENTER)
    if not out.blocks and not out.bad:
        out.empty = f"no node{_selector_text(src)} carries label {key}"
    return out


def _tree(out: _Found, child: Mapping[str, str], parent: Mapping[str, str], child_label: str,
          parent_label: str) -> None:
    """Each child switch has one parent: nodes naming another parent than most of their
    child's nodes (the smallest value on a tie) are inconsistent."""
    votes: dict[str, Counter[str]] = {}
    for node, value in parent.items():
        votes.setdefault(child[node], Counter())[value] += 1
    for node, value in sorted(parent.items()):
        counts = votes[child[node]]
        major = min(counts, key=lambda v: (-counts[v], v))
        if value != major and node in out.blocks:
            del out.blocks[node]
            out.bad[node] = (f"node {node}: label {parent_label}={value} puts "
                             f"{child_label}={child[node]} under a second {parent_label} "
                             f"(its other nodes say {major})")


def _kueue(src: FabricSource, name: str, nodes: Mapping[str, Mapping[str, str]],
           topologies: Iterable[KueueTopology]) -> _Found:
    out = _Found()
    topo = next((t for t in topologies if t.name == name), None)
    if topo is None:
        out.empty = f"Kueue Topology {name} not found"
        return out
    levels = list(topo.levels)
    upper = levels[:-1] if levels and levels[-1] == HOSTNAME else levels
    paths: dict[str, tuple[str, ...]] = {}
    lowest = upper[-1] if upper else HOSTNAME
    for name, labels in nodes.items():
        if lowest not in labels:
            continue  # not in this topology (a zone label alone does not make a GPU node)
        missing = [lv for lv in levels if lv not in labels]
        if missing:
            out.bad[name] = (f"node {name}: label {', '.join(missing)} of Kueue Topology "
                             f"{topo.name} is missing")
            continue
        paths[name] = tuple(labels[lv] for lv in upper)
    parents: dict[str, set[tuple[str, ...]]] = {}
    for path in paths.values():
        if path:
            parents.setdefault(path[-1], set()).add(path[:-1])
    for name, path in paths.items():
        if not path:
            out.blocks[name] = ""
        else:
            out.blocks[name] = path[-1] if len(parents[path[-1]]) == 1 else ",".join(path)
    if not out.blocks and not out.bad:
        out.empty = (f"no node{_selector_text(src)} carries the levels of Kueue Topology "
                     f"{topo.name}")
    return out


def _volcano(nodes: Mapping[str, Mapping[str, str]], every: Mapping[str, Mapping[str, str]],
             hypernodes: Iterable[HyperNode]) -> _Found:
    out = _Found()
    homes: dict[str, list[str]] = {}
    for hn in sorted(hypernodes, key=lambda h: h.name):
        if hn.tier is None:
            out.problems.append(f"HyperNode {hn.name}: spec.tier is not an integer")
            continue
        if hn.tier != 1:
            continue
        for m in hn.members:
            if m.type != "Node":
                continue
            for name in _members(hn, m, every, out.problems):
                if name in nodes:
                    homes.setdefault(name, []).append(hn.name)
    for name, homes_of in sorted(homes.items()):
        if len(homes_of) > 1:
            out.bad[name] = f"node {name} is in tier-1 HyperNodes {', '.join(homes_of)}"
        else:
            out.blocks[name] = homes_of[0]
    if not out.blocks and not out.bad:
        out.empty = "no tier-1 HyperNode selects a Node of this fabric"
    return out


def _members(hn: HyperNode, m: HyperNodeMember, every: Mapping[str, Mapping[str, str]],
             problems: list[str]) -> Sequence[str]:
    if m.exact is not None:
        if m.exact not in every:
            problems.append(f"HyperNode {hn.name}: member Node {m.exact} does not exist")
            return ()
        return (m.exact,)
    if m.regex is not None:
        try:
            pattern = re.compile(m.regex)
        except re.error as err:
            problems.append(f"HyperNode {hn.name}: regexMatch pattern {m.regex!r} is not a "
                            f"valid regular expression ({err})")
            return ()
        return [n for n in every if pattern.search(n)]
    if m.labels is not None:
        return [n for n, labels in every.items() if m.labels.matches(labels)]
    problems.append(f"HyperNode {hn.name}: a Node member has no selector")
    return ()


class Resolver:
    """``resolve`` for each FabricTopology of a round, remembering its last result: the
    ``previous`` that keeps inconsistent nodes in place, and a cache while nothing the
    resolution reads has changed (a round re-reads every input)."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[Any, tuple[FabricTopology, Notes]]] = {}

    def resolve_all(self, fabrics: Iterable[FabricTopology], nodes: Mapping[str, NodeInfo],
                    topologies: Iterable[KueueTopology] = (),
                    hypernodes: Iterable[HyperNode] = ()) -> list[tuple[FabricTopology, Notes]]:
        """Each FabricTopology resolved, with its notes."""
        fabrics = list(fabrics)
        inputs: Any = None
        out: list[tuple[FabricTopology, Notes]] = []
        for ft in fabrics:
            if ft.spec.source is None:
                out.append((ft, ()))
                continue
            if inputs is None:
                topologies, hypernodes = list(topologies), list(hypernodes)
                inputs = (tuple(sorted((n.name, n.labels) for n in nodes.values())),
                          tuple(sorted(topologies, key=lambda t: t.name)),
                          tuple(sorted(hypernodes, key=lambda h: h.name)))
            key = (ft, inputs)
            name = ft.metadata.name
            last = self._last.get(name)
            if last is not None and last[0] == key:
                out.append(last[1])
                continue
            same = last is not None and last[0][0].spec.source == ft.spec.source
            previous = last[1][0] if last is not None and same else None
            resolved = resolve(ft, nodes, topologies, hypernodes, previous)
            self._last[name] = (key, resolved)
            out.append(resolved)
        for name in set(self._last) - {f.metadata.name for f in fabrics}:
            del self._last[name]
        return out
