"""Greedy synthesis of one or more tenants' collectives on one fabric (the TACOS method).

Non-combining collectives (AllGather, Broadcast, Gather, Scatter, AllToAll) are matched
directly. Combining ones are synthesized as their non-combining inverse on the reversed
links and then inverted in time (SCCL/TACOS): ReduceScatter from AllGather, Reduce from
Broadcast; AllReduce is that ReduceScatter followed by an AllGather whose chunks start as
soon as their reduction is complete. All tenants are matched jointly in each phase, so no
link is booked twice. Fabrics with switches are unwound into point-to-point links for a few
degrees and the fastest result is kept. AllReduce tenants larger than ``large_tenant`` ranks
on multi-GPU hosts get the rail-aligned hierarchical plan instead (``choreo.hierarchy``),
whose schedule stays linear in the ranks where chunk matching would be quadratic, or the
block-doubling plan's ReduceScatter and AllGather where that is estimated faster (a wide
rail level, or thousands of hosts). AllGather, ReduceScatter and smaller AllReduce tenants
on such hosts also get the rail-aligned plan (``choreo.railgather``): the faster of it and
the greedy result is kept, and above ``large_tenant`` ranks (AllGather and ReduceScatter) it
or the block-doubling plan (``choreo.blockgather``), whichever is faster, the block plan
alone where the rail plan's transfers would not fit (thousands of hosts).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np
import psutil

from choreo.blockgather import block_gather, block_layout, block_transfers
from choreo.blockgather import estimate as block_estimate
from choreo.collectives import Collective, Demand, volume
from choreo.errors import InfeasibleError, InputError
from choreo.hierarchy import (
    LARGE_TENANT,
    MAX_HOST_STEPS,
    applies,
    busiest_host_steps,
    hierarchical,
    shaped,
)
from choreo.msccl.lower import lowerable
from choreo.planes import plane_gather
from choreo.railgather import hops, plans, rail_gather, rail_layout
from choreo.rates import planned_costs
from choreo.schedule import Op, Schedule
from choreo.simulate import simulate
from choreo.topology import Link, Topology
from choreo.transforms import restrict
from choreo.treepack import tree_packing

# Each chunk should be large against alpha * bandwidth, or per-transfer latency dominates.
CHUNK_ALPHA_FACTOR = 50.0
MAX_TOTAL_CHUNKS = 8192
MAX_CHUNKS_PER_PIECE = 8
MAX_CHUNKS_ROOTED = 64
LARGE_FABRIC = 256  # NPUs; above this only the sparsest switch unwindings are tried
# What one transfer costs at its peak: the engine's state and the Schedule's columns
# (measured: torus-64x64 AllGather, 16.8 M transfers, 2.3 GiB).
BYTES_PER_TRANSFER = 150
# What the engine keeps per (node, chunk) of a view while it matches: four bit matrices, and
# with chunk replacement an arrival time (f64) and a carrier (u32) (greedy.rs, ``State``).
BYTES_PER_CELL = 12.5
# AllToAll chunks each have one destination, so a link's scan for one to send finds few
# and relays fill the rest: the engine's work grows much faster than its transfers
# (measured on dgx-h100-16 and -32, 1 chunk: 128 ranks 2.1 M cells, about 10 s per
# unwinding; 256 ranks 16.8 M, about 400 s). Larger AllToAll tenants are refused.
MAX_ALLTOALL_CELLS = 1 << 22
# The rail plan is laid out where its estimate is within this of greedy's time: the estimate
# plans at the slowest link, so on measured (noisy) links it runs a little faster than that.
RAIL_MARGIN = 1.1
# The block plan is laid out where its estimate is within this of the rail plan's: its
# estimate waits for each level to end, which the simulated plan does not (dgx-h100-128:
# 3.30 ms estimated, 3.10 ms simulated).
BLOCK_MARGIN = 1.1
# The block AllReduce is laid out where its estimate is this far below the hierarchical
# plan's: where its levels overlap little its estimate can fall under its simulated time by
# up to 1% (dgx-h100-35, 1 GiB: 6.094 ms estimated, 6.105 ms simulated).
BLOCK_ALLREDUCE_EDGE = 0.98
# ... and laid out first where its estimate is at most this far above, the hierarchical plan
# then only where the block plan simulates slower than that plan's estimate, the faster kept:
# where its levels overlap, its estimate lies 11-17% above its simulated time
# (dgx-h100-128, 256 MiB: 1.890 ms estimated, 1.654 ms simulated, the hierarchical plan
# 1.677 ms; dgx-h100-512, 1 GiB: 7.136 / 6.303 ms, against 6.586 ms).
BLOCK_ALLREDUCE_TRY = 1.15


@dataclass(frozen=True)
class SynthOptions:
    """Knobs of the greedy engine; the defaults suit interactive use."""

    restarts: int = 4
    seed: int = 0
    replacement: bool = True
    relay: bool = True
    degrees: tuple[int, ...] | None = None
    large_tenant: int = LARGE_TENANT  # ranks above which AllReduce is planned hierarchically
    rail_gather: bool = True  # also try the rail-aligned plan (choreo.railgather)
    tree_packing: bool = True  # also try packed broadcast trees (choreo.treepack)
    # also try each plane's collective handed over to group mates (choreo.planes); its
    # transfers move chunk ranges, so only where rail_gather (which moves them too) is on
    plane_gather: bool = True
    # Whether a packed-tree or plane plan may replace greedy's result ("" where it may, else
    # why not): a caller that lowers the result passes ``lowerable`` for its runtime. None:
    # whatever the default runtime (the executor) can run.
    accept: Callable[[Schedule], str] | None = None


def auto_chunks(topology: Topology, collective: Collective, size: int, n: int) -> int:
    """Chunks per rank piece: as many as keep each chunk >> alpha * bandwidth, within bounds.

    Rooted one-to-all collectives (Broadcast, Reduce) have a single piece and need many
    chunks to pipeline; the others already have ``n`` pieces in flight.
    """
    links = [topology.links[i] for i in topology.usable_links()]
    latency_bytes = max((lk.alpha * lk.bandwidth for lk in links), default=0.0)
    pieces = {Collective.BROADCAST: 1, Collective.REDUCE: 1, Collective.ALLTOALL: n * n}
    count = pieces.get(collective, n)
    piece = volume(collective, size, n) / count
    wanted = 64 if latency_bytes <= 0 else int(piece // (CHUNK_ALPHA_FACTOR * latency_bytes))
    cap = MAX_CHUNKS_ROOTED if count == 1 else MAX_CHUNKS_PER_PIECE
    return max(1, min(wanted, cap, MAX_TOTAL_CHUNKS // count))


def check_demands(fabric: Topology, demands: Sequence[Demand], relay: bool) -> None:
    """Every tenant's NPUs must exist, be alive NPUs and be mutually reachable."""
    if not demands:
        raise InputError("tenants: at least one collective is needed")
    for t, d in enumerate(demands):
        where = f"tenants[{t}]" + (f" ({d.name})" if d.name else "")
        for r in d.ranks:
            if not 0 <= r < fabric.num_nodes or not fabric.is_npu(r):
                raise InputError(f"{where}.ranks: {r} is not an NPU of fabric {fabric.name!r}")
            if r in fabric.failed:
                raise InfeasibleError(f"{where}.ranks: NPU {fabric.node_name(r)} has failed")
        view = restrict(fabric, d.ranks, relay)
        try:
            view.check_connected(list(d.ranks), where)
        except InputError as err:
            raise InfeasibleError(str(err)) from None


def fewest_transfers(d: Demand) -> int:
    """Transfers no schedule of ``d`` can do without: each chunk lands once on every rank
    that needs it (twice over for AllReduce)."""
    from choreo.bounds import min_transfers_bytes

    return round(min_transfers_bytes(d) / d.chunk_bytes) if d.size else 0


def check_fits(demands: Sequence[Demand], available: int | None = None) -> None:
    """Refuse, before anything large is allocated, work whose transfers alone would not fit
    in this machine's free memory; name the tenant's ranks and chunks and the limit."""
    free = available if available is not None else _available_memory()
    transfers = sum(fewest_transfers(d) for d in demands)
    if transfers * BYTES_PER_TRANSFER <= free:
        return
    worst = max(range(len(demands)), key=lambda t: fewest_transfers(demands[t]))
    d = demands[worst]
    where = f"tenants[{worst}]" + (f" ({d.name})" if d.name else "")
    raise InputError(
        f"{where}: {d.n} ranks x {d.chunks} chunk(s) per piece need at least {transfers:,} "
        f"transfers, about {transfers * BYTES_PER_TRANSFER / 2**30:.1f} GiB, and "
        f"{free / 2**30:.1f} GiB is free here; use fewer chunks (--chunks) or ranks")


def engine_cells(view: Topology, demands: Sequence[Demand]) -> int:
    """(node, chunk) pairs the engine tracks on ``view``: every node of the view (switches
    included) by every chunk of every tenant."""
    return view.num_nodes * sum(d.num_chunks for d in demands)


def check_alltoall_work(demands: Sequence[Demand]) -> None:
    """Refuse AllToAll tenants past what the greedy engine finishes in minutes."""
    for t, d in enumerate(demands):
        cells = d.n * d.num_chunks
        if d.collective is Collective.ALLTOALL and cells > MAX_ALLTOALL_CELLS:
            where = f"tenants[{t}]" + (f" ({d.name})" if d.name else "")
            raise InputError(
                f"{where}: an AllToAll of {d.n} ranks x {d.chunks} chunk(s) per piece is "
                f"{cells:,} (rank, chunk) pairs for the greedy engine, above its limit of "
                f"{MAX_ALLTOALL_CELLS:,}; use fewer ranks or chunks, or --engine lp")


def parallel_views(views: Sequence[Topology], demands: Sequence[Demand],
                   available: int | None = None) -> int:
    """How many views the engine may match at once within free memory (at least one), or
    an InputError naming the limit when even one view's state does not fit."""
    free = available if available is not None else _available_memory()
    transfers = sum(fewest_transfers(d) for d in demands) * BYTES_PER_TRANSFER
    each = max(engine_cells(v, demands) for v in views) * BYTES_PER_CELL + transfers
    if each > free:
        worst = max(range(len(demands)), key=lambda t: demands[t].num_chunks)
        d = demands[worst]
        where = f"tenants[{worst}]" + (f" ({d.name})" if d.name else "")
        raise InputError(
            f"{where}: {d.n} ranks x {d.chunks} chunk(s) per piece need the engine to track "
            f"{max(engine_cells(v, demands) for v in views):,} (node, chunk) pairs, about "
            f"{each / 2**30:.1f} GiB, and {free / 2**30:.1f} GiB is free here; use fewer "
            "chunks (--chunks) or ranks")
    return max(1, min(len(views), os.cpu_count() or 1, int(free // each)))


def _available_memory() -> int:
    """Free memory now (what the kernel could hand out without swapping)."""
    return int(psutil.virtual_memory().available)


def synthesize(
    fabric: Topology, demands: Sequence[Demand], options: SynthOptions | None = None
) -> Schedule:
    """Jointly synthesize every demand on ``fabric``; the best of several tries is returned."""
    opts = options or SynthOptions()
    demands = tuple(demands)
    check_demands(fabric, demands, opts.relay)
    if all(applies(fabric, d, opts.large_tenant) for d in demands):
        return _hierarchical_or_block(fabric, demands, opts)
    if opts.rail_gather and any(d.n > opts.large_tenant for d in demands):
        layouts = _block_layouts(fabric, demands)
        if layouts is not None:
            return _rail_or_block(fabric, demands, layouts)
    check_fits(demands)
    found = [rail_layout(fabric, d) for d in demands] if opts.rail_gather else [None]
    railed = all(f is not None for f in found)
    if railed and any(d.n > opts.large_tenant for d in demands):
        # Under a spine the plan loses to greedy where a block's hosts cross together
        # faster than its uplink's lanes take them (4.60 against 3.13 ms on
        # dgx-h100-spine-32x2); there greedy is tried beside it.
        shaped = plans(fabric, demands)
        if all(p.queued == 1.0 for p in shaped):
            return rail_gather(fabric, demands, shaped)
    check_alltoall_work(demands)
    views = logical_views(fabric, demands, opts)
    # The engine releases the GIL, so the unwinding candidates run side by side, as many
    # at once as their state fits in memory, smallest first. Each starts with the best end
    # found so far as its bar and stops when it cannot beat it (None), so the first view
    # always finishes and the pick is the same as if every view had.
    bar = _Bar()
    with ThreadPoolExecutor(max_workers=parallel_views(views, demands)) as pool:
        results = list(pool.map(
            lambda view: bar.lower(_synthesize_on(fabric, view, demands, opts, bar.seconds)),
            views))
    best = min((s for s in results if s is not None), key=lambda s: s.makespan)
    if railed:
        return _against_rail_plan(fabric, demands, best)
    accept = opts.accept or lowerable
    if opts.tree_packing:  # the trees are skipped where they cannot beat greedy's plan
        best = _faster(best, tree_packing(fabric, demands, beat=best.makespan, accept=accept))
    if opts.plane_gather and opts.rail_gather:
        best = _faster(best, plane_gather(fabric, demands, accept))
    return best


def _hierarchical_or_block(fabric: Topology, demands: tuple[Demand, ...],
                           opts: SynthOptions) -> Schedule:
    """Large AllReduce tenants: the hierarchical plan, or the block plan's ReduceScatter then
    AllGather where every tenant has its layout and its transfers fit in memory. The block
    estimate waits for each level to end (near or above its simulated time), the
    hierarchical one is the simulator's own where hosts are alike. So the block plan alone
    is laid out where its estimate beats the hierarchical plan's by
    ``BLOCK_ALLREDUCE_EDGE``, first where it is within ``BLOCK_ALLREDUCE_TRY`` above (the
    hierarchical plan too where the block plan simulates slower than its estimate, the
    faster kept), and the hierarchical plan alone elsewhere: at thousands of hosts each
    takes seconds. The block plan wins where the hierarchical plan's rail phase has a wide
    level (a prime factor such as 11 or 17 of the host count: dgx-h100-34, 1 GiB, 6.16
    against 6.75 ms) or many levels with too few slices to hide its host phases (16,384
    GPUs, 1 GiB: 7.29 against 10.96 ms; 4,096 GPUs: 6.30 against 6.59 ms)."""
    planned = shaped(fabric, demands, opts.relay)
    layouts = _block_layouts(fabric, demands) if opts.rail_gather else None
    if layouts is not None:
        need = sum(block_transfers(d, hosts)
                   for d, hosts in zip(demands, layouts, strict=True))
        costs = [hops(fabric, d.ranks) for d in demands]
        block_s = max(block_estimate(fabric, d, hosts, c)
                      for d, hosts, c in zip(demands, layouts, costs, strict=True))
        hier_s = max(p.estimate for p in planned)
        if (block_s < BLOCK_ALLREDUCE_TRY * hier_s
                and need * BYTES_PER_TRANSFER <= _available_memory()):
            block = block_gather(fabric, demands, layouts, costs)  # simulated already
            # The hierarchical plan can take no less than its estimate (its simulated time
            # alone here, hosts alike; sharing links only adds): it is laid out only where
            # the block plan might lose to it.
            if block_s < BLOCK_ALLREDUCE_EDGE * hier_s or block.makespan < hier_s:
                return block
            hier = hierarchical(fabric, demands, opts.relay, planned)
            return block if block.makespan < hier.makespan else hier
    return hierarchical(fabric, demands, opts.relay, planned)


def _block_layouts(fabric: Topology, demands: tuple[Demand, ...]
                   ) -> list[list[list[int]]] | None:
    """Every demand's ``block_layout``, or None where some demand has none."""
    found = [block_layout(fabric, d) for d in demands]
    layouts = [hosts for hosts in found if hosts is not None]
    return layouts if len(layouts) == len(demands) else None


def _rail_or_block(fabric: Topology, demands: tuple[Demand, ...],
                   layouts: Sequence[list[list[int]]]) -> Schedule:
    """Large AllGather and ReduceScatter tenants: the rail plan, or the block plan where the
    rail plan's transfers do not fit in memory (thousands of hosts) or the block plan is
    faster. The rail plan's estimate is its simulated time on links alike; the block plan's
    is above its simulated one (its levels overlap), so it is laid out wherever it may win
    and kept where the simulator says it does."""
    try:
        check_fits(demands)
    except InputError as err:
        need = sum(block_transfers(d, hosts) for d, hosts in zip(demands, layouts, strict=True))
        free = _available_memory()
        if need * BYTES_PER_TRANSFER > free:
            raise InputError(
                f"{err}; the block plan, which needs fewer, needs {need:,} transfers, about "
                f"{need * BYTES_PER_TRANSFER / 2**30:.1f} GiB, and {free / 2**30:.1f} GiB "
                "is free here") from None
        return block_gather(fabric, demands, layouts)
    shaped = plans(fabric, demands)
    rail_s = max(p.estimate for p in shaped)
    block_s = max(block_estimate(fabric, d, hosts)
                  for d, hosts in zip(demands, layouts, strict=True))
    if block_s > rail_s * BLOCK_MARGIN:
        return rail_gather(fabric, demands, shaped)
    block = block_gather(fabric, demands, layouts)  # its times are the simulator's already
    if block.makespan <= rail_s:
        return block
    rail = rail_gather(fabric, demands, shaped)
    return min((block, rail), key=lambda s: s.makespan)


def _against_rail_plan(fabric: Topology, demands: tuple[Demand, ...], greedy: Schedule
                       ) -> Schedule:
    """The faster of ``greedy`` and the rail plan among those whose node files fit a
    ConfigMap, else the one with the smaller files. The plan's estimate is its simulated
    time on fabrics whose links are alike (and above it where they are not), so the plan is
    laid out only where that estimate may win."""
    greedy_s = simulate(greedy).makespan
    shaped = plans(fabric, demands)
    if max(p.estimate for p in shaped) > greedy_s * RAIL_MARGIN:
        return greedy
    rail = rail_gather(fabric, demands, shaped)  # its times are the simulator's already
    steps = {id(s): busiest_host_steps(s) for s in (rail, greedy)}
    fits = [s for s in (rail, greedy) if steps[id(s)] <= MAX_HOST_STEPS]
    if not fits:
        return min((rail, greedy), key=lambda s: steps[id(s)])
    return min(fits, key=lambda s: greedy_s if s is greedy else s.makespan)


def _faster(best: Schedule, fixed: Schedule | None) -> Schedule:
    """``fixed`` (a packed-tree or plane plan the caller's runtime accepted, its times the
    simulator's already) where it simulates faster than ``best``. ``best`` is simulated
    only where ``fixed`` beats its planned time, which the simulated one never exceeds."""
    if fixed is None or fixed.makespan >= best.makespan:
        return best
    return fixed if fixed.makespan < simulate(best).makespan else best


_VIEWS: OrderedDict[Hashable, list[Topology]] = OrderedDict()
_VIEWS_LOCK = threading.Lock()
VIEWS_KEPT = 8  # a request's size buckets share their views


def logical_views(fabric: Topology, demands: tuple[Demand, ...],
                  opts: SynthOptions) -> list[Topology]:
    """Switch-free graphs to match on: the fabric, or its unwindings for a few degrees (the
    greedy engine's and the exact solvers', ``choreo.teccl.network``).

    Without relaying each tenant's switch ports are unwound among its own NPUs (when tenants
    do not share NPUs), so no logical link of one tenant leads through another's NPUs. They
    depend on who sends, not on how much: the last few are kept for the next size bucket.
    """
    key = (fabric.fingerprint(), tuple(d.ranks for d in demands), opts.relay, opts.degrees)
    with _VIEWS_LOCK:
        views = _VIEWS.get(key)
        if views is not None:
            _VIEWS.move_to_end(key)
            return views
    views = _unwound_views(fabric, demands, opts)
    with _VIEWS_LOCK:
        _VIEWS[key] = views
        while len(_VIEWS) > VIEWS_KEPT:
            _VIEWS.popitem(last=False)
    return views


def _unwound_views(fabric: Topology, demands: tuple[Demand, ...],
                   opts: SynthOptions) -> list[Topology]:
    members = {r for d in demands for r in d.ranks}
    if not fabric.switches:
        return [restrict(fabric, members, opts.relay)]
    from choreo.unwind import candidate_degrees, unwind

    ports = max(
        sum(1 for i in fabric.out_links(s) if fabric.is_npu(fabric.links[i].dst))
        for s in fabric.switches
    )
    degrees = opts.degrees or tuple(candidate_degrees(max(ports, 2)))
    if not opts.degrees and len(fabric.npus) > LARGE_FABRIC:
        # Each try is a full synthesis; on large fabrics the sparse unwindings always win.
        degrees = tuple(d for d in degrees if d <= 2) or degrees[:1]
    disjoint = sum(d.n for d in demands) == len(members)
    if opts.relay or not disjoint or len(demands) == 1:
        restricted = restrict(fabric, members, opts.relay)
        return [unwind(restricted, d) for d in degrees]
    return [_per_tenant_unwinding(fabric, demands, d, unwind) for d in degrees]


def _per_tenant_unwinding(fabric: Topology, demands: tuple[Demand, ...], degree: int,
                          unwind: Callable[[Topology, int], Topology]) -> Topology:
    """Each tenant's own unwinding, merged; physical links that several tenants' logical links
    ride on (a NIC uplink shared by two jobs' GPUs) are split between them so that no physical
    link carries more than its bandwidth, and a logical link on such a link is a share, never
    a circuit that would hold it exclusively (``choreo.unwind.SHARED_GAP``)."""
    from choreo.unwind import SHARED_GAP

    links: list[Link] = []
    seen: set[tuple[int, int, tuple[int, ...]]] = set()
    name = fabric.name
    for d in demands:
        view = unwind(restrict(fabric, d.ranks, relay=False), degree)
        name = view.name
        for link in view.links:
            key = (link.src, link.dst, link.via)
            if link.healthy and key not in seen:
                seen.add(key)
                links.append(link)
    load = np.zeros(len(fabric.links))
    riders = np.zeros(len(fabric.links), dtype=np.int64)
    for link in links:
        for p in link.via:
            load[p] += link.bandwidth
            riders[p] += 1
    capacity = np.array([lk.bandwidth for lk in fabric.links])
    factor = np.minimum(1.0, np.divide(capacity, load, out=np.ones_like(load), where=load > 0))

    def fitted(link: Link) -> Link:
        if not link.via:
            return link
        bw = link.bandwidth * float(min(factor[p] for p in link.via))
        if any(riders[p] > 1 for p in link.via):
            bw = min(bw, float(min(capacity[p] for p in link.via)) * (1 - SHARED_GAP))
        return replace(link, bandwidth=bw)

    return fabric.with_links([fitted(link) for link in links], name=f"{name}/per-tenant")


# ---- one synthesis on a switch-free logical topology --------------------------------------


class _Bar:
    """The earliest planned end among the views finished so far."""

    def __init__(self) -> None:
        self.seconds = float("inf")
        self._lock = threading.Lock()

    def lower(self, schedule: Schedule | None) -> Schedule | None:
        if schedule is not None:
            with self._lock:
                self.seconds = min(self.seconds, schedule.makespan)
        return schedule


class _Phase:
    """The chunks of one matching phase, flattened across tenants as engine columns."""

    def __init__(self) -> None:
        self.blocks: list[tuple[np.ndarray, ...]] = []

    def add(self, tenant: int, d: Demand, holder: np.ndarray | None, targets: np.ndarray | None,
            ready: np.ndarray | None = None) -> None:
        """``holder``/``targets``: one rank per chunk, or None for every rank of the tenant."""
        ranks, k = np.asarray(d.ranks, dtype=np.uint32), d.num_chunks
        h_count, h_node = _expand(ranks, k, holder)
        t_count, t_node = _expand(ranks, k, targets)
        h_time = np.repeat(np.zeros(k) if ready is None else ready, h_count)
        self.blocks.append((np.full(k, tenant, dtype=np.uint32), np.arange(k, dtype=np.int32),
                            h_count, h_node, h_time, t_count, t_node))

    def column(self, i: int) -> np.ndarray:
        return np.concatenate([b[i] for b in self.blocks])

    def __len__(self) -> int:
        return sum(len(b[0]) for b in self.blocks)


def _expand(ranks: np.ndarray, k: int, single: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    if single is None:
        return np.full(k, len(ranks), dtype=np.int64), np.tile(ranks, k)
    return np.ones(k, dtype=np.int64), ranks[single]


def _synthesize_on(
    fabric: Topology, topology: Topology, demands: tuple[Demand, ...], opts: SynthOptions,
    cutoff: float = float("inf"),
) -> Schedule | None:
    """Greedy on one logical topology, or None when it cannot end by ``cutoff`` seconds."""
    usable = np.array(topology.usable_links(), dtype=np.int64)
    order = _tenant_order(demands)
    # Phase 1: combining tenants as the inverse non-combining collective on reversed links.
    reversed_phase = _Phase()
    for t in order:
        d = demands[t]
        if d.collective is Collective.ALLREDUCE:
            reversed_phase.add(t, d, _owners(d), None)
        elif d.collective.combining:
            reversed_phase.add(t, d, d.single_destination, None)
    parts: list[Schedule] = []
    link_free = np.zeros(len(topology.links))
    reduced: Schedule | None = None
    if len(reversed_phase):
        plan = _run(topology, usable, demands, reversed_phase, link_free, True, opts, cutoff)
        if plan is None:  # the reduction alone already runs past the cutoff
            return None
        span = plan["makespan"]
        reduced = _to_schedule(fabric, topology, demands, reversed_phase, plan, Op.REDUCE,
                               start=span - plan["end"], end=span - plan["start"])
        parts.append(reduced)
        np.maximum.at(link_free, reduced.link, reduced.end)
    # Phase 2: non-combining tenants and the all-gather half of AllReduce.
    forward = _Phase()
    for t in order:
        d = demands[t]
        if d.collective is Collective.ALLREDUCE:
            forward.add(t, d, _owners(d), None, ready=_reduced_at(reduced, t, d))
        elif not d.collective.combining:
            forward.add(t, d, d.single_origin, d.single_destination)
    if len(forward):
        plan = _run(topology, usable, demands, forward, link_free, False, opts, cutoff)
        if plan is None:
            return None
        parts.append(_to_schedule(fabric, topology, demands, forward, plan, Op.COPY))
    sched = Schedule.concat(parts, engine="greedy").sorted()
    sched.meta.update({"restarts": opts.restarts, "seed": opts.seed,
                       "topology": topology.name, "links": len(topology.links)})
    return sched


def _owners(d: Demand) -> np.ndarray:
    """AllReduce: the rank that completes each chunk's reduction and starts its all-gather."""
    return np.arange(d.num_chunks) // d.chunks


def _reduced_at(reduced: Schedule | None, tenant: int, d: Demand) -> np.ndarray:
    """When each chunk's reduction completes at its owner (its all-gather may start then)."""
    ready = np.zeros(d.num_chunks)
    if reduced is None:
        return ready
    mine = reduced.tenant == tenant
    chunk, dst, end = reduced.chunk[mine], reduced.dst[mine], reduced.end[mine]
    owner_npu = np.asarray(d.ranks)[_owners(d)[chunk]]
    at_owner = dst == owner_npu
    np.maximum.at(ready, chunk[at_owner], end[at_owner])
    return ready


def _tenant_order(demands: tuple[Demand, ...]) -> list[int]:
    """Higher weight first; the engine matches earlier priority classes first."""
    return sorted(range(len(demands)), key=lambda t: (-demands[t].weight, t))


def _run(topology: Topology, usable: np.ndarray, demands: tuple[Demand, ...], chunks: _Phase,
         link_free: np.ndarray, reverse: bool, opts: SynthOptions,
         cutoff: float = float("inf")) -> dict | None:
    """One engine phase; None when every seed's plan runs past ``cutoff`` seconds (absolute
    time: a reversed phase's own span is part of the whole, so it can only be longer)."""
    import choreo_engine

    links = topology.links
    src = np.array([links[i].src for i in usable], dtype=np.uint32)
    dst = np.array([links[i].dst for i in usable], dtype=np.uint32)
    if reverse:
        src, dst = dst, src
    weights = sorted({d.weight for d in demands}, reverse=True)
    holder_ptr = np.concatenate([[0], np.cumsum(chunks.column(2))]).astype(np.uint64)
    target_ptr = np.concatenate([[0], np.cumsum(chunks.column(5))]).astype(np.uint64)
    seeds = [opts.seed * 1000003 + i for i in range(max(1, opts.restarts))]
    alpha, bandwidth = planned_costs(topology, usable)
    try:
        plan: dict | None = choreo_engine.greedy(
            topology.num_nodes, src, dst, alpha, bandwidth,
            np.ascontiguousarray(link_free[usable], dtype=np.float64),
            np.array([d.chunk_bytes for d in demands], dtype=np.float64),
            np.array([weights.index(d.weight) for d in demands], dtype=np.uint32),
            chunks.column(0), holder_ptr, chunks.column(3), chunks.column(4),
            target_ptr, chunks.column(6), seeds, opts.replacement,
            **({} if opts.relay else _members(demands)), cutoff=cutoff,
        )
    except ValueError as err:
        raise InfeasibleError(f"synthesis on {topology.name}: {err}") from None
    if plan is None:
        return None
    plan["link"] = usable[plan["link"]]
    if reverse:
        plan["src"], plan["dst"] = plan["dst"], plan["src"]
    return plan


def _members(demands: tuple[Demand, ...]) -> dict[str, np.ndarray]:
    """Per tenant, the only NPUs that may forward its chunks (relaying disabled)."""
    ptr = np.concatenate([[0], np.cumsum([d.n for d in demands])]).astype(np.uint64)
    nodes = np.concatenate([np.asarray(d.ranks, dtype=np.uint32) for d in demands])
    return {"member_ptr": ptr, "member_node": nodes}


def _to_schedule(fabric: Topology, topology: Topology, demands: tuple[Demand, ...],
                 chunks: _Phase, plan: dict, op: Op,
                 start: np.ndarray | None = None, end: np.ndarray | None = None) -> Schedule:
    idx = plan["chunk"].astype(np.int64)
    return Schedule(
        fabric, topology, demands,
        tenant=chunks.column(0)[idx], chunk=chunks.column(1)[idx],
        src=plan["src"], dst=plan["dst"], link=plan["link"],
        start=plan["start"] if start is None else start,
        end=plan["end"] if end is None else end,
        op=np.full(len(idx), int(op), dtype=np.int8),
    )
