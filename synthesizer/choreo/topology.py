"""The one fabric type of choreo: NPUs, switches and directed links with alpha-beta costs.

Every engine, the verifier, the simulator, the MSCCL lowering, the gRPC service and the
operator speak this type. Node ids are dense integers; an NPU's id is its global rank in
the fabric. A link may be *logical* (built by unwinding a switch): its ``via`` names the
physical links, in the parent topology, that it rides on.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields, replace
from enum import StrEnum
from functools import cached_property
from typing import Any

import numpy as np

from choreo.arrays import concat_ranges
from choreo.collector import collector_paused
from choreo.errors import InputError

# The largest fabric choreo builds, from a generator or a file: anything larger is refused before
# it is allocated (a link is about 200 B, so MAX_LINKS is about 3 GiB).
MAX_NPUS = 1 << 20  # NPUs, or nodes of a generator's shape
MAX_LINKS = 1 << 24
LINK_KINDS = ("nvlink", "nvswitch", "pcie", "ib", "roce", "ethernet", "optical", "xgmi", "generic")


class NodeKind(StrEnum):
    NPU = "npu"
    SWITCH = "switch"


@dataclass(frozen=True, slots=True)
class Link:
    """A directed link. ``alpha`` in seconds, ``bandwidth`` in bytes per second."""

    src: int
    dst: int
    alpha: float
    bandwidth: float
    kind: str = "generic"
    healthy: bool = True
    via: tuple[int, ...] = ()

    @property
    def beta(self) -> float:
        """Inverse bandwidth, seconds per byte."""
        return 1.0 / self.bandwidth

    def cost(self, nbytes: float) -> float:
        """Time to move ``nbytes`` over this link alone: alpha + beta * n."""
        return self.alpha + nbytes / self.bandwidth


@dataclass(frozen=True)
class LinkColumns:
    """A topology's links as arrays, one entry per link: what the hot paths read whole
    (routing costs, a simulation's durations, usable links) instead of a Link at a time."""

    src: np.ndarray
    dst: np.ndarray
    alpha: np.ndarray
    bandwidth: np.ndarray
    usable: np.ndarray  # healthy, both ends alive


@dataclass(frozen=True)
class ViaColumns:
    """Every link's ``via`` as CSR: link ``i`` rides ``links[ptr[i]:ptr[i + 1]]`` (none for
    a link without one)."""

    ptr: np.ndarray
    links: np.ndarray


@dataclass(frozen=True)
class Topology:
    """A fabric: ``kinds[i]`` says whether node ``i`` is an NPU or a switch.

    ``failed`` holds nodes that are present but dead; no schedule may touch them.
    ``names`` optionally labels nodes (for example ``node-3/gpu5``) for operators and agents.
    ``reducing`` holds the switches that can reduce in the network (NVLink SHARP on H100-class
    NVSwitches): data sent up to such a switch can come back summed, so an AllReduce over it
    needs each NPU to send its buffer once and receive the result once. The lower bounds and
    the NCCL model (NVLS) use it; choreo's own engines do not.
    """

    name: str
    kinds: tuple[NodeKind, ...]
    links: tuple[Link, ...]
    failed: frozenset[int] = frozenset()
    names: tuple[str, ...] = ()
    dims: tuple[int, ...] = ()
    reducing: frozenset[int] = frozenset()

    @cached_property
    def _adjacency(self) -> tuple[tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]:
        """Per node, its out-links and in-links, built on first use: a 16,384-GPU plan's
        routed topology (295 K circuits) is read only through its columns, and building
        these for it takes 0.13-0.28 s."""
        with collector_paused():  # a list and a tuple per node, acyclic
            out: list[list[int]] = [[] for _ in self.kinds]
            inc: list[list[int]] = [[] for _ in self.kinds]
            for i, link in enumerate(self.links):
                out[link.src].append(i)
                inc[link.dst].append(i)
            return tuple(tuple(x) for x in out), tuple(tuple(x) for x in inc)

    @property
    def _out(self) -> tuple[tuple[int, ...], ...]:
        return self._adjacency[0]

    @property
    def _in(self) -> tuple[tuple[int, ...], ...]:
        return self._adjacency[1]

    # ---- queries -------------------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return len(self.kinds)

    @property
    def npus(self) -> list[int]:
        """Live NPUs in id order."""
        return [i for i, k in enumerate(self.kinds) if k is NodeKind.NPU and i not in self.failed]

    @property
    def all_npus(self) -> list[int]:
        return [i for i, k in enumerate(self.kinds) if k is NodeKind.NPU]

    @property
    def switches(self) -> list[int]:
        return [i for i, k in enumerate(self.kinds) if k is NodeKind.SWITCH]

    def with_health(self, failed: frozenset[int], down: Iterable[int]) -> Topology:
        """This fabric with ``failed`` as its failed nodes and the ``down`` links unhealthy
        (the others as they are). The structure is the same, so the adjacency is shared, not
        rebuilt: a failure on a fabric of thousands of links costs one pass over them."""
        bad = {i for i in down if self.links[i].healthy}
        links = list(self.links)
        for i in bad:
            links[i] = replace(links[i], healthy=False)
        new = object.__new__(Topology)
        for f in fields(self):
            object.__setattr__(new, f.name, getattr(self, f.name))
        object.__setattr__(new, "links", tuple(links))
        object.__setattr__(new, "failed", failed)
        new.__dict__["trunk_links"] = self.trunk_links  # made once per structure
        new.__dict__["_adjacency"] = self._adjacency
        if "vias" in self.__dict__:
            new.__dict__["vias"] = self.vias
        new.__dict__["broken_links"] = self.broken_links | bad
        return new

    @cached_property
    def broken_links(self) -> frozenset[int]:
        """Indices of the links that are not healthy."""
        return frozenset(i for i, lk in enumerate(self.links) if not lk.healthy)

    @cached_property
    def trunk_links(self) -> tuple[tuple[int, ...], ...]:
        """Per node, the links (either direction) joining it to another switch; empty for
        NPUs. Walking switch to switch this way skips a rail switch's thousand NPU ports."""
        out: list[list[int]] = [[] for _ in self.kinds]
        for i, link in enumerate(self.links):
            if not self.is_npu(link.src) and not self.is_npu(link.dst):
                out[link.src].append(i)
                if link.dst != link.src:
                    out[link.dst].append(i)
        return tuple(tuple(x) for x in out)

    @cached_property
    def columns(self) -> LinkColumns:
        """The links as arrays, built once per topology (and per health: ``with_health``
        makes a new one)."""
        links = self.links
        src = np.fromiter((lk.src for lk in links), dtype=np.int64, count=len(links))
        dst = np.fromiter((lk.dst for lk in links), dtype=np.int64, count=len(links))
        dead = np.zeros(len(self.kinds), dtype=bool)
        dead[list(self.failed)] = True
        healthy = np.fromiter((lk.healthy for lk in links), dtype=bool, count=len(links))
        return LinkColumns(
            src, dst, np.fromiter((lk.alpha for lk in links), dtype=np.float64, count=len(links)),
            np.fromiter((lk.bandwidth for lk in links), dtype=np.float64, count=len(links)),
            healthy & ~dead[src] & ~dead[dst])

    @cached_property
    def vias(self) -> ViaColumns:
        """The links' vias as arrays, built once (a routed topology gets them from its
        paths, without a pass over its circuits)."""
        lens = np.fromiter((len(lk.via) for lk in self.links), dtype=np.int64,
                           count=len(self.links))
        ptr = np.zeros(len(self.links) + 1, dtype=np.int64)
        np.cumsum(lens, out=ptr[1:])
        hops = np.fromiter((h for lk in self.links for h in lk.via), dtype=np.int64,
                           count=int(ptr[-1]))
        return ViaColumns(ptr, hops)

    def is_npu(self, node: int) -> bool:
        return self.kinds[node] is NodeKind.NPU

    def usable(self, link_index: int) -> bool:
        """A link carries traffic only if it is healthy and both ends are alive."""
        link = self.links[link_index]
        return link.healthy and link.src not in self.failed and link.dst not in self.failed

    def out_links(self, node: int) -> tuple[int, ...]:
        return self._out[node]

    def in_links(self, node: int) -> tuple[int, ...]:
        return self._in[node]

    def usable_links(self) -> list[int]:
        return [i for i in range(len(self.links)) if self.usable(i)]

    def ingress_bandwidth(self, node: int) -> float:
        return sum(self.links[i].bandwidth for i in self._in[node] if self.usable(i))

    def egress_bandwidth(self, node: int) -> float:
        return sum(self.links[i].bandwidth for i in self._out[node] if self.usable(i))

    def node_name(self, node: int) -> str:
        return self.names[node] if self.names else f"{self.kinds[node].value}{node}"

    def fingerprint(self) -> str:
        """Content hash: equal fabrics give equal fingerprints (used for caching)."""
        return self._fingerprint

    @cached_property
    def _fingerprint(self) -> str:
        """What ``to_dict`` holds, hashed from the link columns: the JSON document of a
        1,024-GPU fabric's 16,000 links took 0.03-0.08 s, twice on every failure's path (the
        operator's cut and the service's cache key)."""
        cols = self.columns
        kinds, kind, healthy = self._link_codes()
        h = hashlib.sha256()
        for part in (self.name, [k.value for k in self.kinds], self.names, kinds,
                     sorted(self.failed), self.dims, sorted(self.reducing)):
            h.update(json.dumps(part, separators=(",", ":")).encode() + b"\0")
        for column in (cols.src, cols.dst, cols.alpha, cols.bandwidth, kind.astype(np.int64),
                       healthy):
            h.update(column.tobytes())
        return h.hexdigest()

    def _link_codes(self) -> tuple[list[str], np.ndarray, np.ndarray]:
        """The link kinds in use (sorted), each link's index among them, and its health:
        what the link columns leave out, as arrays."""
        links = self.links
        kinds = sorted({lk.kind for lk in links})
        index = {k: i for i, k in enumerate(kinds)}
        kind = np.fromiter((index[lk.kind] for lk in links), dtype=np.int16, count=len(links))
        healthy = np.fromiter((lk.healthy for lk in links), dtype=bool, count=len(links))
        return kinds, kind, healthy

    # ---- (de)serialization ---------------------------------------------------------------
    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as columns: a routed topology's tens of thousands of Link objects take
        0.05 s each way one at a time (a service worker hands schedules to its helper
        process and back). The caches that are columns or small travel along; the
        per-node ones are rebuilt where needed."""
        kinds, kind, healthy = self._link_codes()
        cols, vias = self.columns, self.vias
        arrays = (cols.src, cols.dst, cols.alpha, cols.bandwidth, kind, healthy,
                  vias.ptr, vias.links)
        plain = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "links"}
        cached = {k: v for k, v in self.__dict__.items() if k in _PICKLED_CACHES}
        return _unpickle, (plain, tuple(kinds), arrays, cached)

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "name": self.name,
            "nodes": [
                {"kind": k.value, **({"name": self.names[i]} if self.names else {})}
                for i, k in enumerate(self.kinds)
            ],
            "links": [_link_to_dict(link) for link in self.links],
        }
        if self.failed:
            doc["failed"] = sorted(self.failed)
        if self.dims:
            doc["dims"] = list(self.dims)
        if self.reducing:
            doc["reducing"] = sorted(self.reducing)
        return doc

    @classmethod
    def from_dict(cls, doc: dict[str, Any], where: str = "topology") -> Topology:
        """Build from the documented format; the JSON Schema check lives in ``topofile``."""
        nodes = doc["nodes"]
        kinds = tuple(NodeKind(n.get("kind", "npu")) for n in nodes)
        names = tuple(n["name"] for n in nodes) if nodes and all("name" in n for n in nodes) else ()
        links = tuple(_link_from_dict(x) for x in doc["links"])
        topo = cls(
            name=doc.get("name", "custom"),
            kinds=kinds,
            links=links,
            failed=frozenset(doc.get("failed", ())),
            names=names,
            dims=tuple(doc.get("dims", ())),
            reducing=frozenset(doc.get("reducing", ())),
        )
        topo.validate(where)
        return topo

    # ---- validation ----------------------------------------------------------------------
    def validate(self, where: str = "topology") -> None:
        """Reject fabrics no engine can work with, naming the offending field."""
        n = self.num_nodes
        if n == 0:
            raise InputError(f"{where}.nodes: the fabric has no nodes")
        if self.names and len(self.names) != n:
            raise InputError(f"{where}.nodes: {len(self.names)} names for {n} nodes")
        for i, link in enumerate(self.links):
            at = f"{where}.links[{i}]"
            for end in ("src", "dst"):
                v = getattr(link, end)
                if not 0 <= v < n:
                    raise InputError(f"{at}.{end}: node {v} does not exist (0..{n - 1})")
            if link.src == link.dst:
                raise InputError(f"{at}: a link from node {link.src} to itself")
            if not link.bandwidth > 0:
                raise InputError(f"{at}.bandwidth: must be positive, got {link.bandwidth}")
            if not link.alpha >= 0:
                raise InputError(f"{at}.alpha: must be non-negative, got {link.alpha}")
        for v in self.failed:
            if not 0 <= v < n:
                raise InputError(f"{where}.failed: node {v} does not exist")
        for v in self.reducing:
            if not 0 <= v < n:
                raise InputError(f"{where}.reducing: node {v} does not exist")
            if self.kinds[v] is not NodeKind.SWITCH:
                raise InputError(f"{where}.reducing: node {v} is an NPU, only switches reduce")

    def check_connected(self, npus: Sequence[int], where: str = "topology") -> None:
        """Every NPU in ``npus`` must reach every other over usable links (relays allowed).
        Read from the link columns: at 16,384 GPUs a walk a Link at a time took 0.1 s."""
        cols = self.columns
        live_src, live_dst = cols.src[cols.usable], cols.dst[cols.usable]
        sends = np.zeros(self.num_nodes, dtype=bool)
        sends[live_src] = True
        takes = np.zeros(self.num_nodes, dtype=bool)
        takes[live_dst] = True
        for v in npus:
            if v in self.failed:
                raise InputError(f"{where}: NPU {self.node_name(v)} has failed")
            if not (sends[v] and takes[v]):
                raise InputError(f"{where}: NPU {self.node_name(v)} has no usable links")
        if not npus:
            return
        ranks = np.asarray(npus, dtype=np.int64)
        for reach in (_reach(self.num_nodes, live_src, live_dst, npus[0]),
                      _reach(self.num_nodes, live_dst, live_src, npus[0])):
            missing = ranks[~reach[ranks]].tolist()
            if missing:
                shown = ", ".join(self.node_name(v) for v in missing[:8])
                raise InputError(
                    f"{where}: disconnected: NPU {self.node_name(npus[0])} cannot exchange data "
                    f"with {len(missing)} NPU(s) ({shown}{', ...' if len(missing) > 8 else ''})"
                )

    # ---- construction helpers ------------------------------------------------------------
    def with_links(self, links: Iterable[Link], name: str | None = None) -> Topology:
        return replace(self, links=tuple(links), name=name or self.name)


def _reach(nodes: int, src: np.ndarray, dst: np.ndarray, start: int) -> np.ndarray:
    """Which nodes ``start`` reaches along the links ``src[i] -> dst[i]``: a breadth-first
    search a level at a time over the links as CSR."""
    order = np.argsort(src, kind="stable")
    heads = dst[order]
    ptr = np.searchsorted(src[order], np.arange(nodes + 1))
    seen = np.zeros(nodes, dtype=bool)
    seen[start] = True
    frontier = np.array([start], dtype=np.int64)
    while len(frontier):
        out = heads[concat_ranges(ptr[frontier], ptr[frontier + 1] - ptr[frontier])]
        frontier = np.unique(out[~seen[out]])
        seen[frontier] = True
    return seen


_PICKLED_CACHES = ("columns", "vias", "broken_links", "_fingerprint")


def _unpickle(plain: dict[str, Any], kinds: tuple[str, ...], arrays: tuple[np.ndarray, ...],
              cached: dict[str, Any]) -> Topology:
    """``Topology.__reduce__``'s columns back into a topology, its caches as they were."""
    src, dst, alpha, bandwidth, kind, healthy, ptr, hops = (a.tolist() for a in arrays)
    with collector_paused():  # tens of thousands of small acyclic objects
        links = tuple(Link(s, d, a, b, kinds[k], h, tuple(hops[ptr[i]:ptr[i + 1]]))
                      for i, (s, d, a, b, k, h) in enumerate(
                          zip(src, dst, alpha, bandwidth, kind, healthy, strict=True)))
    topo = Topology(links=links, **plain)
    topo.__dict__.update(cached)
    return topo


def _link_to_dict(link: Link) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "src": link.src,
        "dst": link.dst,
        "alpha": link.alpha,
        "bandwidth": link.bandwidth,
        "kind": link.kind,
    }
    if not link.healthy:
        doc["healthy"] = False
    if link.via:
        doc["via"] = list(link.via)
    return doc


def _link_from_dict(doc: dict[str, Any]) -> Link:
    return Link(
        src=int(doc["src"]),
        dst=int(doc["dst"]),
        alpha=float(doc.get("alpha", 0.0)),
        bandwidth=float(doc["bandwidth"]),
        kind=str(doc.get("kind", "generic")),
        healthy=bool(doc.get("healthy", True)),
        via=tuple(doc.get("via", ())),
    )


def duplex(
    a: int, b: int, alpha: float, bandwidth: float, kind: str = "generic"
) -> tuple[Link, Link]:
    """Both directions of a full-duplex cable."""
    return Link(a, b, alpha, bandwidth, kind), Link(b, a, alpha, bandwidth, kind)
