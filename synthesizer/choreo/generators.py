"""Built-in fabrics, addressed by name: ``<shape>-<size>`` such as ``torus-8x8`` or ``dgx-h100-4``.

Each shape is a plain function with keyword parameters (bandwidths in B/s, alphas in s) so the
Python API, tests and the CLI share one definition. ``build(spec)`` parses a name and accepts
parameter overrides after a colon: ``torus-4x4x4:bandwidth=25e9`` or
``dragonfly-4x5:bandwidth=400e9/200e9`` (``/`` separates per-dimension values).

Conventions shared by every generator:

* NPUs come first, so an NPU's id is its rank; switches follow and are named ``sw...``
  (``node3/sw-nvswitch`` inside a node).
* Grid shapes number ranks with dimension 0 fastest: rank = x + X*y + X*Y*z, and set ``dims``.
* For switch fabrics ``alpha`` is the NPU-to-NPU latency *through* the switch; each of the two
  port links gets half, so a path up and down costs exactly ``alpha`` (as in TACOS, where an
  unwound switch link keeps the switch's alpha).
* A ring or torus dimension of size 2 has one neighbour, joined by a single full-duplex link.
* Defaults follow TACOS' homogeneous studies (alpha 0.5 us, 50 GB/s) unless a shape has a
  published profile (DGX-1, NDv2, DGX-2; see shared notes).
"""

from __future__ import annotations

import inspect
import itertools
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from choreo.errors import InputError
from choreo.topology import MAX_LINKS, MAX_NPUS, Link, NodeKind, Topology

GB = 1e9
# Achievable rates of the H100 presets (what nccl-tests reaches, not the nominal peaks of
# 450 GB/s per GPU into NVSwitch and 50 GB/s per 400 Gb/s NIC).
H100_NVSWITCH_BANDWIDTH = 370 * GB
NDR_NIC_BANDWIDTH = 46 * GB
US = 1e-6
DEFAULT_BANDWIDTH = 50 * GB  # TACOS Fig. 2: 1/beta = 50 GB/s
DEFAULT_ALPHA = 0.5 * US

PerDim = float | Sequence[float]

# SCCL's DGX-1 (hybrid cube-mesh): 6 NVLinks per GPU, double links carry two NVLinks.
DGX1_DOUBLE = ((0, 1), (0, 3), (1, 4), (2, 3), (2, 7), (4, 5), (5, 6), (6, 7))
DGX1_SINGLE = ((0, 2), (0, 5), (1, 2), (1, 3), (3, 6), (4, 6), (4, 7), (5, 7))


# ---- small validated helpers -----------------------------------------------------------------
def _count(field: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InputError(f"{field}: must be an integer >= {minimum}, got {value!r}")
    return value


def _positive(field: str, value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{field}: expected a number, got {value!r}") from None
    if not v > 0 or v == float("inf"):
        raise InputError(f"{field}: must be positive, got {value!r}")
    return v


def _alpha(field: str, value: Any) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{field}: expected a number of seconds, got {value!r}") from None
    if not 0 <= v < float("inf"):
        raise InputError(f"{field}: must be non-negative, got {value!r}")
    return v


def _per_dim(field: str, value: PerDim, ndims: int) -> list[float]:
    """One value for every dimension: a scalar applies to all of them."""
    if isinstance(value, str) or not isinstance(value, Sequence):
        return [_positive(field, value)] * ndims
    if len(value) != ndims:
        raise InputError(f"{field}: expected {ndims} values (one per dimension), got {len(value)}")
    return [_positive(f"{field}[{i}]", v) for i, v in enumerate(value)]


def _per_dim_kind(field: str, value: str | Sequence[str], ndims: int) -> list[str]:
    if isinstance(value, str):
        return [value] * ndims
    if len(value) != ndims:
        raise InputError(f"{field}: expected {ndims} kinds (one per dimension), got {len(value)}")
    return [str(v) for v in value]


def _fits_links(field: str, links: int) -> None:
    if links > MAX_LINKS:
        raise InputError(f"{field}: {links:,} links, more than the {MAX_LINKS:,} a built-in "
                         "fabric may have")


def _dims(field: str, dims: Sequence[int]) -> tuple[int, ...]:
    if not dims:
        raise InputError(f"{field}: at least one dimension is needed")
    return tuple(_count(f"{field}[{i}]", d, 2) for i, d in enumerate(dims))


class _Fabric:
    """Collects nodes and links; all NPUs exist before any switch so NPU ids are ranks."""

    def __init__(self, names: Sequence[str]) -> None:
        self.kinds: list[NodeKind] = [NodeKind.NPU] * len(names)
        self.names: list[str] = list(names)
        self.links: list[Link] = []

    def switch(self, name: str) -> int:
        self.kinds.append(NodeKind.SWITCH)
        self.names.append(name)
        return len(self.kinds) - 1

    def duplex(self, a: int, b: int, alpha: float, bw: float, kind: str, count: int = 1) -> None:
        for _ in range(count):
            self.links.append(Link(a, b, alpha, bw, kind))
            self.links.append(Link(b, a, alpha, bw, kind))

    def simplex(self, a: int, b: int, alpha: float, bw: float, kind: str) -> None:
        self.links.append(Link(a, b, alpha, bw, kind))

    def build(self, name: str, dims: Sequence[int] = (), reducing: Sequence[int] = ()) -> Topology:
        return Topology(
            name=name,
            kinds=tuple(self.kinds),
            links=tuple(self.links),
            names=tuple(self.names),
            dims=tuple(dims),
            reducing=frozenset(reducing),
        )


def _flat_names(n: int) -> list[str]:
    return [f"npu{i}" for i in range(n)]


def _node_names(nodes: int, per_node: int, local: str = "gpu") -> list[str]:
    return [f"node{k}/{local}{i}" for k in range(nodes) for i in range(per_node)]


def _strides(dims: Sequence[int]) -> list[int]:
    strides, s = [], 1
    for d in dims:
        strides.append(s)
        s *= d
    return strides


def _lines(dims: Sequence[int], axis: int) -> list[list[int]]:
    """The ranks of every line along ``axis`` (all other coordinates fixed), in axis order."""
    strides = _strides(dims)
    others = [range(d) for i, d in enumerate(dims) if i != axis]
    other_strides = [s for i, s in enumerate(strides) if i != axis]
    lines = []
    for coord in itertools.product(*others):
        base = sum(c * s for c, s in zip(coord, other_strides, strict=True))
        lines.append([base + j * strides[axis] for j in range(dims[axis])])
    return lines


def _grid_name(shape: str, dims: Sequence[int]) -> str:
    return f"{shape}-{'x'.join(map(str, dims))}"


# ---- point-to-point shapes -------------------------------------------------------------------
def ring(
    n: int,
    *,
    bidirectional: bool = True,
    bandwidth: float = DEFAULT_BANDWIDTH,
    alpha: float = DEFAULT_ALPHA,
    kind: str = "generic",
) -> Topology:
    """A ring of ``n`` NPUs; unidirectional rings only have links i -> i+1."""
    n = _count("ring size", n, 2)
    bw, a = _positive("bandwidth", bandwidth), _alpha("alpha", alpha)
    fab = _Fabric(_flat_names(n))
    for i in range(n if n > 2 or not bidirectional else 1):
        if bidirectional:
            fab.duplex(i, (i + 1) % n, a, bw, kind)
        else:
            fab.simplex(i, (i + 1) % n, a, bw, kind)
    return fab.build(f"{'ring' if bidirectional else 'uniring'}-{n}", (n,))


def uniring(
    n: int,
    *,
    bandwidth: float = DEFAULT_BANDWIDTH,
    alpha: float = DEFAULT_ALPHA,
    kind: str = "generic",
) -> Topology:
    """A unidirectional ring: the topology on which Ring AllGather is optimal (N-1 link times)."""
    return ring(n, bidirectional=False, bandwidth=bandwidth, alpha=alpha, kind=kind)


def fully_connected(
    n: int,
    *,
    bandwidth: float = DEFAULT_BANDWIDTH,
    alpha: float = DEFAULT_ALPHA,
    kind: str = "generic",
) -> Topology:
    """Every NPU has a direct link to every other (Direct's ideal topology)."""
    n = _count("fc size", n, 2)
    _fits_links("fc size", n * (n - 1))
    bw, a = _positive("bandwidth", bandwidth), _alpha("alpha", alpha)
    fab = _Fabric(_flat_names(n))
    fab.links = [Link(i, j, a, bw, kind) for i in range(n) for j in range(n) if i != j]
    return fab.build(f"fc-{n}", (n,))


def mesh(
    dims: Sequence[int],
    *,
    bandwidth: PerDim = DEFAULT_BANDWIDTH,
    alpha: float = DEFAULT_ALPHA,
    kind: str | Sequence[str] = "generic",
) -> Topology:
    """A 2D/3D (any-D) mesh: neighbours along each dimension, no wrap-around."""
    dims = _dims("mesh dims", dims)
    bws = _per_dim("bandwidth", bandwidth, len(dims))
    kinds = _per_dim_kind("kind", kind, len(dims))
    a = _alpha("alpha", alpha)
    n = _prod(dims)
    fab = _Fabric(_flat_names(n))
    for axis in range(len(dims)):
        for line in _lines(dims, axis):
            for u, v in itertools.pairwise(line):
                fab.duplex(u, v, a, bws[axis], kinds[axis])
    return fab.build(_grid_name("mesh", dims), dims)


def torus(
    dims: Sequence[int],
    *,
    bandwidth: PerDim = DEFAULT_BANDWIDTH,
    alpha: float = DEFAULT_ALPHA,
    kind: str | Sequence[str] = "generic",
) -> Topology:
    """A torus: a bidirectional ring along each dimension."""
    dims = _dims("torus dims", dims)
    bws = _per_dim("bandwidth", bandwidth, len(dims))
    kinds = _per_dim_kind("kind", kind, len(dims))
    a = _alpha("alpha", alpha)
    fab = _Fabric(_flat_names(_prod(dims)))
    for axis, size in enumerate(dims):
        for line in _lines(dims, axis):
            for j in range(size if size > 2 else 1):
                fab.duplex(line[j], line[(j + 1) % size], a, bws[axis], kinds[axis])
    return fab.build(_grid_name("torus", dims), dims)


def hypercube(
    dims: Sequence[int],
    *,
    bandwidth: PerDim = DEFAULT_BANDWIDTH,
    alpha: float = DEFAULT_ALPHA,
    kind: str | Sequence[str] = "generic",
) -> Topology:
    """TACOS' generalized hypercube: along each dimension, the NPUs of a line are fully connected.

    ``hypercube-2x2x2`` is the binary 3-cube; ``hypercube-8x8x8`` has 21 out-links per NPU.
    """
    dims = _dims("hypercube dims", dims)
    _fits_links("hypercube dims", _prod(dims) * sum(d - 1 for d in dims))
    bws = _per_dim("bandwidth", bandwidth, len(dims))
    kinds = _per_dim_kind("kind", kind, len(dims))
    a = _alpha("alpha", alpha)
    fab = _Fabric(_flat_names(_prod(dims)))
    for axis in range(len(dims)):
        bw, k = bws[axis], kinds[axis]
        for line in _lines(dims, axis):
            fab.links.extend(Link(u, v, a, bw, k) for u in line for v in line if u != v)
    return fab.build(_grid_name("hypercube", dims), dims)


def dragonfly(
    group_size: int,
    groups: int,
    *,
    bandwidth: PerDim = (400 * GB, 200 * GB),
    alpha: float = DEFAULT_ALPHA,
    kind: str | Sequence[str] = "generic",
) -> Topology:
    """DragonFly ``AxG``: G groups of A fully connected NPUs; one global link per pair of groups.

    Group i's link to group j leaves from NPU ``rank_of_j_among_others(i) mod A``, so global
    links are spread round-robin over a group's NPUs (4x5 and 7x8, TACOS' sizes, are the
    balanced a*h+1 = g case: exactly one global link per NPU). Bandwidths are
    [intra-group, global], TACOS default [400, 200] GB/s.
    """
    a_size = _count("dragonfly group size", group_size, 1)
    g = _count("dragonfly groups", groups, 2)
    bws = _per_dim("bandwidth", bandwidth, 2)
    kinds = _per_dim_kind("kind", kind, 2)
    a = _alpha("alpha", alpha)
    names = [f"group{j}/npu{i}" for j in range(g) for i in range(a_size)]
    fab = _Fabric(names)
    for j in range(g):
        base = j * a_size
        fab.links.extend(
            Link(base + u, base + v, a, bws[0], kinds[0])
            for u in range(a_size)
            for v in range(a_size)
            if u != v
        )

    def port(i: int, j: int) -> int:
        return i * a_size + (j if j < i else j - 1) % a_size

    for i in range(g):
        for j in range(i + 1, g):
            fab.duplex(port(i, j), port(j, i), a, bws[1], kinds[1])
    return fab.build(f"dragonfly-{a_size}x{g}", (a_size, g))


# ---- switch shapes ---------------------------------------------------------------------------
def _attach(fab: _Fabric, sw: int, npus: Sequence[int], alpha: float, bw: float, kind: str) -> None:
    """Full-duplex ports of ``bw`` from each NPU to ``sw``; each port carries half the alpha."""
    for v in npus:
        fab.duplex(v, sw, alpha / 2, bw, kind)


def switch(
    n: int,
    *,
    bandwidth: float = DEFAULT_BANDWIDTH,
    alpha: float = DEFAULT_ALPHA,
    kind: str = "generic",
) -> Topology:
    """``n`` NPUs on one non-blocking switch; ``bandwidth`` is each NPU's port speed."""
    n = _count("switch size", n, 2)
    bw, a = _positive("bandwidth", bandwidth), _alpha("alpha", alpha)
    fab = _Fabric(_flat_names(n))
    _attach(fab, fab.switch("sw0"), range(n), a, bw, kind)
    return fab.build(f"switch-{n}", (n,))


def switch2d(
    local: int,
    nodes: int,
    *,
    bandwidth: PerDim = (300 * GB, 25 * GB),
    alpha: float = DEFAULT_ALPHA,
    kind: str | Sequence[str] = ("nvswitch", "ib"),
) -> Topology:
    """TACOS' 2D Switch ``AxB``: B nodes of A NPUs on a node switch; rail switch r joins NPU r
    of every node (DGX-like, default [300, 25] GB/s)."""
    a_n = _count("switch2d local size", local, 2)
    b_n = _count("switch2d nodes", nodes, 2)
    bws = _per_dim("bandwidth", bandwidth, 2)
    kinds = _per_dim_kind("kind", kind, 2)
    a = _alpha("alpha", alpha)
    fab = _Fabric(_node_names(b_n, a_n, "npu"))
    for k in range(b_n):
        sw = fab.switch(f"node{k}/sw-local")
        _attach(fab, sw, range(k * a_n, (k + 1) * a_n), a, bws[0], kinds[0])
    for r in range(a_n):
        sw = fab.switch(f"sw-rail{r}")
        _attach(fab, sw, range(r, a_n * b_n, a_n), a, bws[1], kinds[1])
    return fab.build(f"switch2d-{a_n}x{b_n}", (a_n, b_n))


def rfs(
    npus: int,
    *,
    ring: int = 2,
    fc: int = 4,
    bandwidth: PerDim = (200 * GB, 100 * GB, 50 * GB),
    alpha: float = DEFAULT_ALPHA,
    kind: str | Sequence[str] = ("nvlink", "nvlink", "ib"),
) -> Topology:
    """TACOS' 3D Ring-FullyConnected-Switch, dims ``ring x fc x nodes`` (2x4xN by default).

    A node is a ``ring`` x ``fc`` block: rings along dimension 0 (200 GB/s; a ring of 2 is one
    duplex link), full connectivity along dimension 1 (100 GB/s). Nodes are joined rail-style:
    switch ``sw-rail{r}`` connects local NPU r of every node with a 50 GB/s port. Per NPU this
    gives 200 + 3*100 + 50 GB/s each way. A single node (``3d-rfs-8``) has no switch dimension.
    """
    per_node = _count("3d-rfs ring", ring, 2) * _count("3d-rfs fc", fc, 2)
    n = _count("3d-rfs NPU count", npus, per_node)
    if n % per_node:
        raise InputError(
            f"3d-rfs NPU count: {n} is not a multiple of the {ring}x{fc} = {per_node} NPUs per node"
        )
    nodes = n // per_node
    bws = _per_dim("bandwidth", bandwidth, 3)
    kinds = _per_dim_kind("kind", kind, 3)
    a = _alpha("alpha", alpha)
    fab = _Fabric(_node_names(nodes, per_node, "npu"))
    local_dims = (ring, fc)
    for k in range(nodes):
        base = k * per_node
        for line in _lines(local_dims, 0):
            for j in range(ring if ring > 2 else 1):
                fab.duplex(base + line[j], base + line[(j + 1) % ring], a, bws[0], kinds[0])
        for line in _lines(local_dims, 1):
            fab.links.extend(
                Link(base + u, base + v, a, bws[1], kinds[1]) for u in line for v in line if u != v
            )
    if nodes > 1:
        for r in range(per_node):
            sw = fab.switch(f"sw-rail{r}")
            _attach(fab, sw, range(r, n, per_node), a, bws[2], kinds[2])
    return fab.build(f"3d-rfs-{n}", (ring, fc, nodes))


# ---- machines --------------------------------------------------------------------------------
def _rails(
    fab: _Fabric, nodes: int, per_node: int, nic_gpus: Sequence[int], alpha: float, bw: float
) -> None:
    """Rail-optimized scale-out: rail switch r joins the NIC of local GPU ``nic_gpus[r]``
    on every node (one NIC = one GPU port; GPUs without a NIC relay over the faster inside)."""
    if nodes < 2:
        return
    for r, g in enumerate(nic_gpus):
        sw = fab.switch(f"sw-rail{r}")
        _attach(fab, sw, [k * per_node + g for k in range(nodes)], alpha, bw, "ib")


def dgx1(
    *, bandwidth: float = 25 * GB, alpha: float = 0.7 * US, merge_double: bool = False
) -> Topology:
    """One DGX-1 (8 V100, hybrid cube-mesh, SCCL's exact link list), 25 GB/s per NVLink.

    A double link is two parallel links, one per physical NVLink, so each can carry its own
    chunk and fail on its own (SCCL counts it as capacity 2); ``merge_double=True`` makes one
    link at twice the bandwidth instead. Alpha is TACCL's profiled NVLink alpha.
    """
    return _dgx1_fabric(1, bandwidth, alpha, merge_double).build("dgx1", (8,))


def _dgx1_fabric(nodes: int, bandwidth: float, alpha: float, merge_double: bool) -> _Fabric:
    bw, a = _positive("bandwidth", bandwidth), _alpha("alpha", alpha)
    fab = _Fabric(_node_names(nodes, 8))
    for k in range(nodes):
        base = 8 * k
        for u, v in DGX1_DOUBLE:
            if merge_double:
                fab.duplex(base + u, base + v, a, 2 * bw, "nvlink")
            else:
                fab.duplex(base + u, base + v, a, bw, "nvlink", count=2)
        for u, v in DGX1_SINGLE:
            fab.duplex(base + u, base + v, a, bw, "nvlink")
    return fab


def ndv2(
    nodes: int = 1,
    *,
    nvlink_bandwidth: float = 1e6 / 46e-6,
    nvlink_alpha: float = 0.7 * US,
    nic_bandwidth: float = 12.5 * GB,
    nic_alpha: float = 1.7 * US,
    nic_gpu: int = 0,
    merge_double: bool = False,
) -> Topology:
    """Azure NDv2 nodes: DGX-1 NVLink inside, one NIC per node on GPU ``nic_gpu``.

    NVLink uses TACCL's profile (alpha 0.7 us, beta 46 us/MB ~ 21.7 GB/s); the NIC is the
    nominal 12.5 GB/s with TACCL's IB alpha 1.7 us (TACCL measured 106 us/MB ~ 9.4 GB/s: pass
    ``nic_bandwidth=9.43e9`` for that). The NICs meet on one IB switch ``sw-rail0``.
    """
    k = _count("ndv2 nodes", nodes, 1)
    g = _count("nic_gpu", nic_gpu, 0)
    if g > 7:
        raise InputError(f"nic_gpu: must be a GPU index 0..7, got {g}")
    fab = _dgx1_fabric(k, nvlink_bandwidth, nvlink_alpha, merge_double)
    _rails(
        fab, k, 8, [g], _alpha("nic_alpha", nic_alpha), _positive("nic_bandwidth", nic_bandwidth)
    )
    return fab.build(f"ndv2-{k}", (8, k))


def dgx2(
    nodes: int = 1,
    *,
    nvswitch_bandwidth: float = 1e6 / 8e-6,
    nvswitch_alpha: float = 0.7 * US,
    nic_bandwidth: float = 12.5 * GB,
    nic_alpha: float = 1.7 * US,
) -> Topology:
    """DGX-2 nodes: 16 V100 on one NVSwitch plane (TACCL profile: 0.7 us, 8 us/MB = 125 GB/s).

    Eight 12.5 GB/s NICs per node, one per GPU pair, modelled as a port of the pair's even GPU
    (the odd GPU reaches it over NVSwitch, ten times faster than the NIC); NIC r of every node
    sits on rail switch r.
    """
    k = _count("dgx2 nodes", nodes, 1)
    bw, a = (
        _positive("nvswitch_bandwidth", nvswitch_bandwidth),
        _alpha("nvswitch_alpha", nvswitch_alpha),
    )
    fab = _Fabric(_node_names(k, 16))
    for node in range(k):
        _attach(
            fab,
            fab.switch(f"node{node}/sw-nvswitch"),
            range(16 * node, 16 * node + 16),
            a,
            bw,
            "nvswitch",
        )
    _rails(
        fab,
        k,
        16,
        range(0, 16, 2),
        _alpha("nic_alpha", nic_alpha),
        _positive("nic_bandwidth", nic_bandwidth),
    )
    return fab.build("dgx2" if k == 1 else f"dgx2-{k}", (16, k))


def _nvswitch_nodes(
    fab: _Fabric, nodes: int, per_node: int, alpha: float, bw: float
) -> list[int]:
    """One NVSwitch plane per node (a full-duplex port of ``bw`` per GPU); the switch ids."""
    switches = []
    for node in range(nodes):
        sw = fab.switch(f"node{node}/sw-nvswitch")
        _attach(fab, sw, range(per_node * node, per_node * node + per_node), alpha, bw,
                "nvswitch")
        switches.append(sw)
    return switches


def dgx_h100(
    nodes: int = 1,
    *,
    nvswitch_bandwidth: float = H100_NVSWITCH_BANDWIDTH,
    nvswitch_alpha: float = 0.7 * US,
    ib_bandwidth: float = NDR_NIC_BANDWIDTH,
    ib_alpha: float = 1.7 * US,
    nvls: bool = True,
) -> Topology:
    """DGX-H100 / HGX-8 nodes: 8 H100 on NVSwitch, 8 NDR rails: rail switch r joins GPU r of
    every node. The NVSwitch reduces in the network (NVLink SHARP) unless ``nvls=False``.

    Rates are achievable, not nominal: 370 GB/s per GPU each way over NVSwitch (18 NVLink4 at
    NCCL's own 20.6 GB/s per link; 450 GB/s nominal; a forced-ring AllReduce measures
    365-370 GB/s busbw) and 46 GB/s per 400 Gb/s NIC (maintainers quote 46-48 GB/s, 50 nominal).
    Alphas are assumptions of the same class as TACCL's V100 profile (0.7 us NVLink, 1.7 us IB).
    """
    k = _count("dgx-h100 nodes", nodes, 1)
    bw = _positive("nvswitch_bandwidth", nvswitch_bandwidth)
    a = _alpha("nvswitch_alpha", nvswitch_alpha)
    if not isinstance(nvls, bool):
        raise InputError(f"nvls: must be true or false, got {nvls!r}")
    fab = _Fabric(_node_names(k, 8))
    switches = _nvswitch_nodes(fab, k, 8, a, bw)
    _rails(
        fab, k, 8, range(8), _alpha("ib_alpha", ib_alpha), _positive("ib_bandwidth", ib_bandwidth)
    )
    return fab.build(f"dgx-h100-{k}", (8, k), switches if nvls else ())


def dgx_h100_spine(
    blocks: int,
    nodes: int,
    *,
    oversubscription: float = 2.0,
    nvswitch_bandwidth: float = H100_NVSWITCH_BANDWIDTH,
    nvswitch_alpha: float = 0.7 * US,
    ib_bandwidth: float = NDR_NIC_BANDWIDTH,
    ib_alpha: float = 1.7 * US,
) -> Topology:
    """``blocks`` blocks of ``nodes`` DGX-H100 nodes: in each block rail leaf ``b/rail<r>``
    joins GPU r of the block's nodes; leaf ``b/rail<r>`` climbs to spine ``spine/rail<r>`` by
    one duplex uplink of the leaf's port bandwidth over ``oversubscription`` (2: 2:1), as
    the operator builds a FabricTopology with blocks. Tenants in different blocks meet on
    the spine."""
    nb = _count("dgx-h100-spine blocks", blocks, 2)
    k = _count("dgx-h100-spine nodes per block", nodes, 1)
    ratio = _positive("oversubscription", oversubscription)
    bw, a = _positive("ib_bandwidth", ib_bandwidth), _alpha("ib_alpha", ib_alpha)
    fab = _Fabric(_node_names(nb * k, 8))
    switches = _nvswitch_nodes(fab, nb * k, 8, _alpha("nvswitch_alpha", nvswitch_alpha),
                               _positive("nvswitch_bandwidth", nvswitch_bandwidth))
    for r in range(8):
        spine = fab.switch(f"spine/rail{r}")
        for b in range(nb):
            leaf = fab.switch(f"block{b}/rail{r}")
            _attach(fab, leaf, [(b * k + i) * 8 + r for i in range(k)], a, bw, "ib")
            fab.duplex(leaf, spine, a / 2, k * bw / ratio, "ib")
    return fab.build(f"dgx-h100-spine-{nb}x{k}", (8, nb * k), switches)


def dgx_a100(
    nodes: int = 1,
    *,
    nvswitch_bandwidth: float = 250 * GB,
    nvswitch_alpha: float = 0.7 * US,
    ib_bandwidth: float = 24 * GB,
    ib_alpha: float = 1.7 * US,
) -> Topology:
    """DGX-A100 nodes: 8 A100 on NVSwitch (12 NVLink3, 300 GB/s nominal each way, no in-switch
    reduction), 8 HDR rails (200 Gb/s = 25 GB/s nominal per GPU): rail switch r joins GPU r.

    Achievable rates: 250 GB/s per GPU over NVSwitch (an 8-GPU AllGather measures 254 GB/s
    busbw, an AllReduce 232) and 24 GB/s per HDR NIC.
    """
    k = _count("dgx-a100 nodes", nodes, 1)
    bw = _positive("nvswitch_bandwidth", nvswitch_bandwidth)
    a = _alpha("nvswitch_alpha", nvswitch_alpha)
    fab = _Fabric(_node_names(k, 8))
    _nvswitch_nodes(fab, k, 8, a, bw)
    _rails(
        fab, k, 8, range(8), _alpha("ib_alpha", ib_alpha), _positive("ib_bandwidth", ib_bandwidth)
    )
    return fab.build(f"dgx-a100-{k}", (8, k))


def mi250(
    *,
    xgmi_bandwidth: float = 50 * GB,
    alpha: float = 0.7 * US,
    in_package_links: int = 4,
) -> Topology:
    """A 16-GCD AMD MI250 node (8 OAM packages of 2 GCDs), xGMI only.

    Approximation: each GCD has 8 Infinity Fabric links of 50 GB/s; ``in_package_links`` (4)
    join the two GCDs of a package, one serves PCIe, and the remaining 3 are external xGMI.
    The external wiring of 8-OAM boards is vendor-specific, so we use a regular stand-in:
    the GCDs on side s of the packages form a binary 3-cube (package p <-> p xor 2^k).
    GCD id = 2*package + side. Each GCD: 4*50 GB/s to its twin + 3*50 GB/s external,
    diameter 4.
    """
    bw, a = _positive("xgmi_bandwidth", xgmi_bandwidth), _alpha("alpha", alpha)
    links = _count("in_package_links", in_package_links, 1)
    fab = _Fabric(_node_names(1, 16, "gcd"))
    for p in range(8):
        fab.duplex(2 * p, 2 * p + 1, a, bw, "xgmi", count=links)
    for p in range(8):
        for bit in (1, 2, 4):
            q = p ^ bit
            if p < q:
                for side in (0, 1):
                    fab.duplex(2 * p + side, 2 * q + side, a, bw, "xgmi")
    return fab.build("mi250", (2, 8))


def _prod(dims: Sequence[int]) -> int:
    out = 1
    for d in dims:
        out *= d
    return out


# ---- registry --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    """A named family: ``make(size_text or None, params)`` builds one member."""

    shape: str
    pattern: str
    description: str
    generator: Callable[..., Topology]
    make: Callable[[str | None, dict[str, Any]], Topology]


def _ints(shape: str, size: str | None, count: int | None) -> list[int]:
    if size is None:
        raise InputError(f"needs a size, e.g. {_SHAPES[shape].pattern}")
    parts = size.split("x")
    if count is not None and len(parts) != count:
        raise InputError(
            f"expected {count} dimension(s) like {_SHAPES[shape].pattern}, got {len(parts)}"
        )
    ints = [int(p) for p in parts]
    # every shape builds at least as many NPUs as its size multiplies to (DGX nodes 8 each)
    if math.prod(ints) > MAX_NPUS:
        raise InputError(f"size {size}: {math.prod(ints):,} NPUs or nodes, more than the "
                         f"{MAX_NPUS:,} a built-in fabric may have")
    return ints


def _one(
    shape: str, fn: Callable[..., Topology], default: int | None = None
) -> Callable[..., Topology]:
    def make(size: str | None, params: dict[str, Any]) -> Topology:
        if size is None and default is not None:
            return fn(default, **params)
        return fn(_ints(shape, size, 1)[0], **params)

    return make


def _grid(shape: str, fn: Callable[..., Topology]) -> Callable[..., Topology]:
    return lambda size, params: fn(_ints(shape, size, None), **params)


def _pair(shape: str, fn: Callable[..., Topology]) -> Callable[..., Topology]:
    def make(size: str | None, params: dict[str, Any]) -> Topology:
        a, b = _ints(shape, size, 2)
        return fn(a, b, **params)

    return make


def _fixed(shape: str, fn: Callable[..., Topology]) -> Callable[..., Topology]:
    def make(size: str | None, params: dict[str, Any]) -> Topology:
        if size is not None:
            raise InputError(f"'{shape}' takes no size")
        return fn(**params)

    return make


_SHAPES: dict[str, Shape] = {}


def _register(
    shape: str, pattern: str, description: str, fn: Callable[..., Topology], kind: str
) -> None:
    make = {
        "one": _one(shape, fn),
        "nodes": _one(shape, fn, default=1),
        "grid": _grid(shape, fn),
        "pair": _pair(shape, fn),
        "fixed": _fixed(shape, fn),
    }[kind]
    _SHAPES[shape] = Shape(shape, pattern, description, fn, make)


_register("ring", "ring-N", "bidirectional ring of N NPUs", ring, "one")
_register("uniring", "uniring-N", "unidirectional ring of N NPUs", uniring, "one")
_register("fc", "fc-N", "N fully connected NPUs", fully_connected, "one")
_register("mesh", "mesh-AxB[xC]", "2D/3D mesh", mesh, "grid")
_register(
    "torus", "torus-AxB[xC]", "2D/3D torus (bidirectional rings per dimension)", torus, "grid"
)
_register(
    "hypercube",
    "hypercube-AxBxC",
    "generalized hypercube: each dimension fully connected",
    hypercube,
    "grid",
)
_register("switch", "switch-N", "N NPUs on one switch", switch, "one")
_register(
    "switch2d",
    "switch2d-AxB",
    "2D switch: B nodes of A NPUs, rail switches [300,25] GB/s",
    switch2d,
    "pair",
)
_register(
    "3d-rfs",
    "3d-rfs-N",
    "TACOS 3D Ring-FC-Switch, N NPUs (multiple of 8), 2x4 per node",
    rfs,
    "one",
)
_register("dragonfly", "dragonfly-AxG", "G groups of A NPUs, [400,200] GB/s", dragonfly, "pair")
_register("dgx1", "dgx1", "DGX-1: 8 V100, SCCL NVLink list (25 GB/s per NVLink)", dgx1, "fixed")
_register("dgx2", "dgx2[-K]", "K DGX-2 nodes: 16 V100 on NVSwitch, 8 NIC rails", dgx2, "nodes")
_register(
    "ndv2", "ndv2-K", "K Azure NDv2 nodes: DGX-1 NVLink, one 12.5 GB/s NIC per node", ndv2, "nodes"
)
_register(
    "dgx-h100",
    "dgx-h100-K",
    "K DGX-H100 nodes: NVSwitch 370 GB/s with NVLink SHARP, 8 IB rails 46 GB/s (achievable)",
    dgx_h100,
    "nodes",
)
_register(
    "dgx-h100-spine",
    "dgx-h100-spine-AxB",
    "A blocks of B DGX-H100 nodes, rail leaves per block under a 2:1 oversubscribed spine",
    dgx_h100_spine,
    "pair",
)
_register(
    "dgx-a100",
    "dgx-a100-K",
    "K DGX-A100 nodes: NVSwitch 250 GB/s, 8 HDR rails 24 GB/s (achievable)",
    dgx_a100,
    "nodes",
)
_register("mi250", "mi250", "AMD MI250 node: 16 GCDs on xGMI", mi250, "fixed")

# Longest first so 'dgx-h100' wins over any shorter prefix.
_BY_LENGTH = sorted(_SHAPES, key=len, reverse=True)
_SIZE = re.compile(r"^\d+(x\d+)*$")


def list_builtins() -> list[tuple[str, str]]:
    """(name pattern, description) for every built-in shape, for ``choreo topologies``."""
    return [(s.pattern, s.description) for s in _SHAPES.values()]


def is_builtin_name(spec: str) -> bool:
    """True if ``spec`` names a built-in shape (its size may still be invalid)."""
    return _split(spec.split(":", 1)[0].strip().lower()) is not None


def _split(name: str) -> tuple[str, str | None] | None:
    for shape in _BY_LENGTH:
        if name == shape:
            return shape, None
        if name.startswith(shape + "-"):
            size = name[len(shape) + 1 :]
            if _SIZE.match(size):
                return shape, size
    return None


def _parse_value(text: str) -> Any:
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if "/" in text:
        return [_parse_value(p) for p in text.split("/")]
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text.strip()


def _parse_params(spec: str, shape: Shape, text: str) -> dict[str, Any]:
    allowed = [
        p.name
        for p in inspect.signature(shape.generator).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    params: dict[str, Any] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not value.strip():
            raise InputError(f"topology '{spec}': parameter '{item}' must look like key=value")
        if key not in allowed:
            raise InputError(
                f"topology '{spec}': unknown parameter '{key}' for {shape.shape} "
                f"(known: {', '.join(allowed)})"
            )
        params[key] = _parse_value(value)
    return params


def build(spec: str, **params: Any) -> Topology:
    """Build a built-in fabric by name, e.g. ``torus-4x4`` or ``dgx-h100-2:ib_bandwidth=25e9``.

    Keyword ``params`` override generator defaults (and win over those in the name).
    """
    text = spec.strip()
    name, _, param_text = text.partition(":")
    name = name.strip().lower()
    found = _split(name)
    if found is None:
        known = ", ".join(s.pattern for s in _SHAPES.values())
        raise InputError(f"unknown topology '{spec}': not a file and not a built-in ({known})")
    shape, size = found
    entry = _SHAPES[shape]
    merged = {**_parse_params(spec, entry, param_text), **params}
    try:
        topo = entry.make(size, merged)
    except TypeError as exc:  # a wrongly typed override reached the generator
        raise InputError(f"topology '{spec}': {exc}") from None
    except InputError as exc:
        raise InputError(f"topology '{spec}': {exc}") from None
    # Overrides given in the name stay in it, so reports show what was actually built.
    return replace(topo, name=f"{topo.name}:{param_text.strip()}") if param_text.strip() else topo
