"""The one place where protobuf messages become choreo types and back.

Every check names the offending field by its protobuf path (``tenants[1].npus[3]``) so a
client sees exactly what to fix; defaults are filled in here so that the cache key and the
worker see one normalized request whatever the client left unset.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields

import grpc

from choreo.collectives import MAX_SIZE, Collective, Demand
from choreo.errors import InfeasibleError, InputError
from choreo.msccl.packed import Codec
from choreo.service.api import pb
from choreo.service.status import RequestError, invalid
from choreo.topology import LINK_KINDS, Link, NodeKind, Topology

ENGINES = ("greedy", "auto", "milp", "lp")  # as choreo.portfolio has them
DEFAULT_ENGINE_SECONDS = 10.0  # budget of a request's exact/portfolio solves without a hint
DIALECTS = ("executor", "rccl", "legacy")  # as the MSCCL lowering has them (a test checks)
PROTOCOLS = ("Simple", "LL", "LL128")
DEFAULT_RESTARTS = 4
MAX_RESTARTS = 64
MAX_INSTANCES = 32
DEFAULT_BUCKETS = 4
MAX_BUCKETS = 16
MAX_CHUNKS = 1024
CODEC_OF_ENCODING: dict[pb.Options.XmlEncoding, Codec | None] = {
    pb.Options.XML_PLAIN: None, pb.Options.XML_GZIP: "gzip", pb.Options.XML_ZSTD: "zstd"}


@dataclass(frozen=True)
class CollectiveSpec:
    collective: Collective
    min_bytes: int
    max_bytes: int
    chunks: int | None
    root: int
    max_buckets: int = 0  # 0: the request's options say


@dataclass(frozen=True)
class TenantSpec:
    name: str
    npus: tuple[int, ...]
    collectives: tuple[CollectiveSpec, ...]
    weight: float
    part_ends: tuple[int, ...] = ()  # a large compressed file's members: per rank if empty


@dataclass(frozen=True)
class OptionsSpec:
    engine: str
    restarts: int
    seed: int
    dialect: str
    instances: int
    proto: str
    max_buckets: int
    codec: Codec | None  # how XML files are compressed; None: plain text
    ship_slower_than_nccl: bool
    # Time budget of the whole request's solves for the anytime engines (auto, milp, lp),
    # whose results depend on it; 0 for greedy, whose results do not.
    engine_seconds: float = 0.0


@dataclass(frozen=True)
class Work:
    """A normalized, validated request: everything a worker needs and nothing else."""

    fabric: Topology
    tenants: tuple[TenantSpec, ...]
    options: OptionsSpec
    result_id: str = ""


# ---- fabric ----------------------------------------------------------------------------------


def fabric_from_proto(msg: pb.FabricSnapshot) -> Topology:
    """Build and validate the fabric; errors name ``fabric.<field>``."""
    if not msg.nodes:
        raise invalid("fabric.nodes", "the fabric has no nodes")
    n = len(msg.nodes)
    kinds = []
    for i, node in enumerate(msg.nodes):
        if node.kind == pb.Node.SWITCH:
            kinds.append(NodeKind.SWITCH)
        elif node.kind in (pb.Node.NPU, pb.Node.KIND_UNSPECIFIED):
            kinds.append(NodeKind.NPU)
        else:
            raise invalid(f"fabric.nodes[{i}].kind", f"unknown node kind {node.kind}")
    named = [bool(node.name) for node in msg.nodes]
    if any(named) and not all(named):
        raise invalid(f"fabric.nodes[{named.index(False)}].name",
                      "either every node has a name or none does")
    names = tuple(node.name for node in msg.nodes) if all(named) else ()
    if names and len(set(names)) != n:
        raise invalid("fabric.nodes", "node names must be unique")
    links = []
    for i, lk in enumerate(msg.links):
        at = f"fabric.links[{i}]"
        for end in ("src", "dst"):
            v = getattr(lk, end)
            if v >= n:
                raise invalid(f"{at}.{end}", f"node {v} does not exist (0..{n - 1})")
        if lk.src == lk.dst:
            raise invalid(at, f"a link from node {lk.src} to itself")
        bw = lk.bandwidth_bytes_per_second
        if not (math.isfinite(bw) and bw > 0):
            raise invalid(f"{at}.bandwidth_bytes_per_second", f"must be positive, got {bw}")
        if not (math.isfinite(lk.alpha_seconds) and lk.alpha_seconds >= 0):
            raise invalid(f"{at}.alpha_seconds", f"must be non-negative, got {lk.alpha_seconds}")
        kind = lk.kind or "generic"
        if kind not in LINK_KINDS:
            raise invalid(f"{at}.kind", f"unknown link kind {kind!r} (known: "
                          f"{', '.join(LINK_KINDS)})")
        healthy = lk.healthy if lk.HasField("healthy") else True
        links.append(Link(lk.src, lk.dst, lk.alpha_seconds, bw, kind, healthy))
    for i, v in enumerate(msg.failed_nodes):
        if v >= n:
            raise invalid(f"fabric.failed_nodes[{i}]", f"node {v} does not exist (0..{n - 1})")
    if any(d < 1 for d in msg.dims):
        raise invalid("fabric.dims", "every dimension must be at least 1")
    topo = Topology(name=msg.name or "fabric", kinds=tuple(kinds), links=tuple(links),
                    failed=frozenset(msg.failed_nodes), names=names, dims=tuple(msg.dims),
                    reducing=frozenset(i for i, node in enumerate(msg.nodes) if node.reduces))
    try:
        topo.validate("fabric")
    except InputError as err:
        raise _as_invalid(err) from None
    return topo


def fabric_to_proto(topo: Topology) -> pb.FabricSnapshot:
    msg = pb.FabricSnapshot(name=topo.name, failed_nodes=sorted(topo.failed), dims=topo.dims)
    for i, kind in enumerate(topo.kinds):
        msg.nodes.add(kind=pb.Node.SWITCH if kind is NodeKind.SWITCH else pb.Node.NPU,
                      name=topo.names[i] if topo.names else "", reduces=i in topo.reducing)
    for lk in topo.links:
        out = msg.links.add(src=lk.src, dst=lk.dst, alpha_seconds=lk.alpha,
                            bandwidth_bytes_per_second=lk.bandwidth, kind=lk.kind)
        if not lk.healthy:
            out.healthy = False
    return msg


# ---- tenants and options ---------------------------------------------------------------------


def tenants_from_proto(tenants: Sequence[pb.Tenant]) -> tuple[TenantSpec, ...]:
    """Normalize and check what can be checked without the fabric."""
    if not tenants:
        raise invalid("tenants", "at least one tenant is required")
    out = []
    seen: dict[str, int] = {}
    for i, t in enumerate(tenants):
        at = f"tenants[{i}]"
        if not t.name:
            raise invalid(f"{at}.name", "every tenant needs a name")
        if t.name in seen:
            raise invalid(f"{at}.name", f"{t.name!r} is also tenants[{seen[t.name]}]")
        seen[t.name] = i
        if len(t.npus) < 2:
            raise invalid(f"{at}.npus", f"a collective needs at least 2 NPUs, got {len(t.npus)}")
        first: dict[int, int] = {}
        for j, v in enumerate(t.npus):
            if v in first:
                raise invalid(f"{at}.npus[{j}]", f"NPU {v} is also npus[{first[v]}]")
            first[v] = j
        if t.relay == pb.Tenant.RELAY_THROUGH_OTHERS:
            raise invalid(f"{at}.relay", "MSCCL programs may involve only the tenant's own "
                          "NPUs; use OWN_NPUS_ONLY")
        if t.relay not in (pb.Tenant.RELAY_POLICY_UNSPECIFIED, pb.Tenant.OWN_NPUS_ONLY):
            raise invalid(f"{at}.relay", f"unknown relay policy {t.relay}")
        weight = t.weight or 1.0
        if not (math.isfinite(weight) and weight > 0):
            raise invalid(f"{at}.weight", f"must be positive, got {t.weight}")
        if not t.collectives:
            raise invalid(f"{at}.collectives", "at least one collective is required")
        colls = tuple(_collective(c, f"{at}.collectives[{k}]", len(t.npus))
                      for k, c in enumerate(t.collectives))
        out.append(TenantSpec(t.name, tuple(t.npus), colls, weight,
                              _part_ends(t.part_ends, f"{at}.part_ends", len(t.npus))))
    return tuple(out)


def _part_ends(ends: Sequence[int], at: str, n: int) -> tuple[int, ...]:
    if not ends:
        return ()
    for k, (a, b) in enumerate(itertools.pairwise([0, *ends])):
        if b <= a:
            raise invalid(f"{at}[{k}]", f"must increase, got {b} after {a}")
    if ends[-1] != n:
        raise invalid(f"{at}[{len(ends) - 1}]", f"the last part must end at {n} (len(npus)), "
                      f"got {ends[-1]}")
    return tuple(ends)


def _collective(c: pb.CollectiveSpec, at: str, n: int) -> CollectiveSpec:
    try:
        coll = Collective.parse(c.collective, f"{at}.collective")
    except InputError as err:
        raise _as_invalid(err) from None
    lo, hi = c.min_bytes, c.max_bytes or c.min_bytes
    for name, value in (("min_bytes", lo), ("max_bytes", hi)):
        if not 0 < value <= MAX_SIZE:
            raise invalid(f"{at}.{name}", f"must be in 1 B .. 1 TiB, got {value}")
    if hi < lo:
        raise invalid(f"{at}.max_bytes", f"{hi} is below min_bytes {lo}")
    chunks = c.chunks if c.HasField("chunks") else None
    if chunks is not None and not 1 <= chunks <= MAX_CHUNKS:
        raise invalid(f"{at}.chunks", f"must be in 1..{MAX_CHUNKS}, got {chunks}")
    if coll.rooted and c.root >= n:
        raise invalid(f"{at}.root", f"rank {c.root} is not in 0..{n - 1}")
    if c.max_buckets > MAX_BUCKETS:
        raise invalid(f"{at}.max_buckets", f"at most {MAX_BUCKETS}, got {c.max_buckets}")
    return CollectiveSpec(coll, lo, hi, chunks, c.root if coll.rooted else 0, c.max_buckets)


def options_from_proto(o: pb.Options) -> tuple[OptionsSpec, float]:
    """Normalized options and the server-side deadline hint in seconds (0: none)."""
    engine = o.engine or ENGINES[0]
    if engine not in ENGINES:
        raise invalid("options.engine", f"unknown engine {o.engine!r} (known: "
                      f"{', '.join(ENGINES)})")
    restarts = o.restarts or DEFAULT_RESTARTS
    if restarts > MAX_RESTARTS:
        raise invalid("options.restarts", f"at most {MAX_RESTARTS}, got {restarts}")
    dialect = o.dialect or "executor"
    if dialect not in DIALECTS:
        raise invalid("options.dialect", f"unknown dialect {o.dialect!r} (known: "
                      f"{', '.join(DIALECTS)})")
    instances = o.instances or 1
    if instances > MAX_INSTANCES:
        raise invalid("options.instances", f"at most {MAX_INSTANCES}, got {instances}")
    proto = o.proto or "Simple"
    if proto not in PROTOCOLS:
        raise invalid("options.proto", f"unknown protocol {o.proto!r} (known: "
                      f"{', '.join(PROTOCOLS)})")
    buckets = o.max_buckets or DEFAULT_BUCKETS
    if buckets > MAX_BUCKETS:
        raise invalid("options.max_buckets", f"at most {MAX_BUCKETS}, got {buckets}")
    if not (math.isfinite(o.deadline_seconds) and o.deadline_seconds >= 0):
        raise invalid("options.deadline_seconds", f"must be >= 0, got {o.deadline_seconds}")
    if o.xml_encoding not in CODEC_OF_ENCODING:
        raise invalid("options.xml_encoding", f"unknown encoding {o.xml_encoding}")
    budget = 0.0 if engine == "greedy" else (o.deadline_seconds or DEFAULT_ENGINE_SECONDS)
    spec = OptionsSpec(engine, restarts, o.seed, dialect, instances, proto, buckets,
                       CODEC_OF_ENCODING[o.xml_encoding], o.ship_slower_than_nccl, budget)
    return spec, o.deadline_seconds


def spec_key(tenants: tuple[TenantSpec, ...], options: OptionsSpec) -> bytes:
    """Canonical bytes of the normalized tenants and options (part of the cache key).

    Spelled out field by field rather than with ``dataclasses.asdict``, whose deep copies
    would cost more than the rest of a cache hit.
    """
    doc = [
        [[t.name, t.npus, t.weight, t.part_ends,
          [[c.collective.value, c.min_bytes, c.max_bytes, c.chunks, c.root, c.max_buckets]
           for c in t.collectives]] for t in tenants],
        [getattr(options, f.name) for f in fields(OptionsSpec)],
    ]
    return json.dumps(doc, separators=(",", ":")).encode()


# ---- tenants against the fabric --------------------------------------------------------------


def check_against(fabric: Topology, tenants: tuple[TenantSpec, ...]) -> None:
    """NPUs must exist in the fabric (INVALID_ARGUMENT), be alive and connected using only
    the tenant's own NPUs (FAILED_PRECONDITION)."""
    from choreo.synth import check_demands

    n = fabric.num_nodes
    for i, t in enumerate(tenants):
        for j, v in enumerate(t.npus):
            if v >= n:
                raise invalid(f"tenants[{i}].npus[{j}]",
                              f"node {v} is not in fabric {fabric.name!r} (0..{n - 1})")
            if not fabric.is_npu(v):
                raise invalid(f"tenants[{i}].npus[{j}]", f"node {v} is a switch, not an NPU")
    for i, t in enumerate(tenants):
        for v in t.npus:
            if v in fabric.failed:
                raise _precondition(i, t, "NPU_FAILED",
                                    f"tenants[{i}] ({t.name}): NPU {fabric.node_name(v)} has "
                                    "failed", npu=fabric.node_name(v))
        demand = Demand(Collective.ALLGATHER, t.npus, 1, name=t.name)
        try:
            check_demands(fabric, [demand], relay=False)
        except InfeasibleError as err:
            text = str(err).replace("tenants[0]", f"tenants[{i}]", 1)
            raise _precondition(i, t, "TENANT_DISCONNECTED", text) from None


def _precondition(i: int, t: TenantSpec, reason: str, text: str, **meta: str) -> RequestError:
    return RequestError(
        grpc.StatusCode.FAILED_PRECONDITION, text, reason=reason,
        metadata={"tenant": t.name, **meta},
        preconditions=[("TOPOLOGY", f"tenants[{i}]", text)],
    )


def _as_invalid(err: InputError) -> RequestError:
    """choreo's messages start with the field path; keep it as the violation's field."""
    text = str(err)
    path, sep, rest = text.partition(": ")
    return invalid(path, rest) if sep and " " not in path else invalid("request", text)
