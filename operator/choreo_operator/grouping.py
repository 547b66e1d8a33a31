"""Which tenants must be synthesized together: Joint tenants whose traffic can share a link.

With relaying limited to a tenant's own GPUs (MSCCL programs name only the tenant's ranks), a
tenant's traffic can use the links touching its GPUs and the switch-to-switch links of the
switches its GPUs plug into (a NIC's uplink to its rail, a leaf's uplink). Two Joint tenants
whose footprints intersect are one group; Partitioned tenants are always alone. Tenants that
differ in dialect, instances or protocol cannot share a request, so they never group.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass

from choreo.topology import Topology


@dataclass(frozen=True)
class Member:
    key: str  # namespace/name
    npus: tuple[int, ...]
    joint: bool
    options: tuple[str, int, str]  # dialect, instances, protocol


@dataclass(frozen=True)
class Group:
    members: tuple[str, ...]  # sorted tenant keys

    @property
    def scope(self) -> str:
        """Stable id of the group, used as the synthesizer's idempotency scope."""
        return hashlib.sha256("\n".join(self.members).encode()).hexdigest()[:16]


def footprint(topo: Topology, npus: Iterable[int]) -> set[int]:
    """Indices of the links the tenant on ``npus`` may use."""
    mine = set(npus)
    links = topo.links
    out: set[int] = set()
    attached: set[int] = set()
    for v in mine:
        for i in (*topo.out_links(v), *topo.in_links(v)):
            lk = links[i]
            other = lk.dst if lk.src == v else lk.src
            if other in mine:
                out.add(i)
            elif not topo.is_npu(other):
                out.add(i)
                attached.add(other)
    for s in attached:
        out.update(topo.trunk_links[s])
    return out


def groups(topo: Topology, members: Sequence[Member],
           footprints: Callable[[Topology, tuple[int, ...]], Set[int]] = footprint,
           ) -> list[Group]:
    """Partition tenants into synthesis groups (deterministic order). ``footprints``: the
    footprint of a tenant's NPUs (a cache of ``footprint``)."""
    parent = {m.key: m.key for m in members}

    def find(k: str) -> str:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    owner: dict[tuple[tuple[str, int, str], int], str] = {}
    for m in sorted(members, key=lambda m: m.key):
        if not m.joint:
            continue
        for i in footprints(topo, m.npus):
            other = owner.setdefault((m.options, i), m.key)
            if other != m.key:
                parent[find(m.key)] = find(other)
    out: dict[str, list[str]] = {}
    for m in members:
        out.setdefault(find(m.key), []).append(m.key)
    return sorted((Group(tuple(sorted(v))) for v in out.values()), key=lambda g: g.members)


def group_of(groups_: Iterable[Group]) -> Mapping[str, Group]:
    return {k: g for g in groups_ for k in g.members}
