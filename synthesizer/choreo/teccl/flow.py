"""TE-CCL's LP (section 4.1) for collectives that need no copy: AllToAll, Scatter, Gather.

Commodity ``q`` is everything one tenant's origin NPU sends; no chunk identity is tracked, so
all variables are continuous. For ``K`` epochs of a variable length ``T``:

* ``F[q,g,k] >= 0``: chunks of ``q`` started over link group ``g`` (parallel links between
  one NPU pair) in epoch ``k``; they are usable at the receiver ``kappa_g`` epochs later;
* ``H[q,n,k] >= 0``: chunks of ``q`` that ``n`` keeps through epoch ``k`` (store and forward);
* conservation per (q, n, k): kept + sent = kept before + arrived (+ the supply at the
  origin); at the end every NPU holds exactly its demand;
* capacity per (g, k): sum over q of ``F * (alpha + chunk_bytes/bw)`` <= ``|g| * T``, so the
  alpha of every transfer is paid as link time (choreo's contract).

The objective minimizes ``T`` (and, far below, link time, which removes silly flows), so
``K * T`` is the predicted collective time. Only links on fewest-hop routes from each origin
are offered by default, which keeps the model small and loses nothing on the built-in
fabrics, where every fewest-hop route crosses each cut once.

Chunks: flow is fluid but transfers move whole chunks, so each (origin, destination) piece is
cut into ``chunks`` chunks (the schedule's demands carry that count). The flow of each
commodity is decomposed into time-respecting paths, each piece's chunks are dealt to its
paths in proportion to their flow (largest remainder), and the hops are list-scheduled in
epoch order on the least busy parallel link.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from choreo.arrays import concat_ranges
from choreo.bounds import lower_bound
from choreo.collectives import Collective, Demand
from choreo.errors import InfeasibleError, InputError
from choreo.schedule import Op, Schedule
from choreo.synth import check_demands
from choreo.teccl.highs import MAX_ENTRIES, MAX_VARIABLES, Model, check_size
from choreo.teccl.network import mesh_view
from choreo.topology import Topology
from choreo.verify import check

FLOW_COLLECTIVES = (Collective.ALLTOALL, Collective.SCATTER, Collective.GATHER)
EPS = 1e-7


@dataclass(frozen=True)
class LpOptions:
    """``chunks``/``parallel``/``epochs`` of None are chosen per instance; several
    (chunks, parallel) candidates are solved and the fastest schedule is kept."""

    time_limit: float = 60.0
    threads: int = 1
    relay: bool = True
    epochs: int | None = None
    chunks: tuple[int, ...] | None = None
    parallel: tuple[int, ...] | None = None
    shortest_routes: bool = True


@dataclass
class _Groups:
    """Usable links of a view grouped by (src, dst, alpha, bandwidth)."""

    src: np.ndarray
    dst: np.ndarray
    members: list[list[int]]  # view link ids per group
    time: np.ndarray  # (tenant, group): alpha + chunk_bytes / bw

    @property
    def count(self) -> np.ndarray:
        return np.array([len(m) for m in self.members], dtype=float)


def _groups(view: Topology, demands: tuple[Demand, ...]) -> _Groups:
    by: dict[tuple[int, int, float, float], list[int]] = defaultdict(list)
    for i in view.usable_links():
        lk = view.links[i]
        by[(lk.src, lk.dst, lk.alpha, lk.bandwidth)].append(i)
    keys = list(by)
    alpha = np.array([k[2] for k in keys])
    bw = np.array([k[3] for k in keys])
    cb = np.array([d.chunk_bytes for d in demands])
    return _Groups(np.array([k[0] for k in keys], dtype=np.int64),
                   np.array([k[1] for k in keys], dtype=np.int64), [by[k] for k in keys],
                   alpha[None, :] + cb[:, None] / bw[None, :])


def _hops(n: int, src: np.ndarray, dst: np.ndarray, weight: np.ndarray) -> np.ndarray:
    dist = np.full((n, n), np.inf)
    np.fill_diagonal(dist, 0.0)
    np.minimum.at(dist, (src, dst), weight.astype(float))
    for k in range(n):
        dist = np.minimum(dist, dist[:, k : k + 1] + dist[k : k + 1, :])
    return dist


def synthesize_lp(fabric: Topology, demands: Sequence[Demand],
                  options: LpOptions | None = None) -> Schedule:
    """The fastest verified LP schedule over the (chunks, parallel) candidates."""
    opts = options or LpOptions()
    demands = tuple(demands)
    for d in demands:
        if d.collective not in FLOW_COLLECTIVES:
            raise InputError(f"the LP engine needs a collective without copy "
                             f"({', '.join(c.value for c in FLOW_COLLECTIVES)}), not "
                             f"{d.collective.value}: use the MILP engine")
    check_demands(fabric, demands, opts.relay)
    started = time.monotonic()
    deadline = started + opts.time_limit
    chunk_opts = opts.chunks or _auto_chunks(demands)
    par_opts = opts.parallel or ((1, 2, 4) if fabric.switches else (1,))
    jobs = [(c, p) for p in par_opts for c in chunk_opts]
    best: Schedule | None = None
    tried: list[dict[str, object]] = []
    for i, (c, p) in enumerate(jobs):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            sched = _solve(fabric, demands, c, p, opts, left / (len(jobs) - i))
        except InfeasibleError as err:
            tried.append({"chunks": c, "parallel": p, "error": str(err)})
            continue
        tried.append({"chunks": c, "parallel": p, "time": sched.makespan})
        if best is None or sched.makespan < best.makespan:
            best = sched
    if best is None:
        raise InfeasibleError(f"LP found no schedule in {opts.time_limit:g} s: {tried}")
    best.meta["candidates"] = tried
    best.meta["synthesis_seconds"] = time.monotonic() - started
    return best


def _auto_chunks(demands: tuple[Demand, ...]) -> tuple[int, ...]:
    """Chunks per piece: the given count and a finer one, so rounding flow to chunks can
    follow the LP's split over several routes."""
    given = max(d.chunks for d in demands)
    return tuple(sorted({given, max(2, given)}))


def _solve(fabric: Topology, demands: tuple[Demand, ...], chunks: int, parallel: int,
           opts: LpOptions, time_limit: float) -> Schedule:
    demands = tuple(replace(d, chunks=chunks) for d in demands)
    view = mesh_view(fabric, demands, opts.relay, parallel)
    groups = _groups(view, demands)
    n = view.num_nodes
    bound = max(lower_bound(fabric, d, [x for x in demands if x is not d]).value_s
                for d in demands)
    hop = _hops(n, groups.src, groups.dst, np.ones(len(groups.src)))
    diam = int(np.nanmax(np.where(np.isfinite(hop), hop, 0)))
    # epochs: enough to cut the collective into ~K slices, never shorter than the fastest
    # transfer, and enough of them for the farthest destination
    K = opts.epochs or max(8, 3 * diam + 2)
    tau0 = max(float(groups.time.min()), bound * 1.05 / K)
    epochs = np.maximum(1, np.ceil(groups.time / tau0 - 1e-9))
    longest = float(epochs.max())
    if not longest <= MAX_ENTRIES:  # each epoch of a link is a capacity entry; NaN too
        raise InputError(
            f"engine lp: a send on its slowest link lasts {longest:.3g} epochs of "
            f"{tau0:.3g} s (its link costs are that far apart), above its limit of "
            f"{MAX_ENTRIES:,} (memory and time); use engine greedy or auto")
    kappa = epochs.astype(np.int64).max(axis=0)
    far = _hops(n, groups.src, groups.dst, kappa)  # within each tenant: views may not join them
    K = max(K, 1 + max(int(far[np.ix_(d.ranks, d.ranks)].max()) for d in demands))
    supply, want, origin_of = _commodities(n, demands)
    lp = _build(groups, hop, kappa, supply, want, origin_of, K, tau0, opts.shortest_routes)
    sol = lp.model.solve(time_limit=time_limit, threads=opts.threads)
    if sol.x is None:
        raise InfeasibleError(f"LP {sol.status} with {K} epochs")
    paths = _decompose(lp, sol.x, K)
    sched = _schedule(fabric, view, demands, groups, paths, origin_of)
    check(sched)
    sched.meta.update({"view": view.name, "epochs": K, "parallel": parallel, "chunks": chunks,
                       "lp_status": sol.status, "lp_seconds": sol.seconds,
                       "lp_time": float(sol.x[lp.tau]) * tau0 * K, "variables": lp.model.num_vars,
                       "lower_bound": bound})
    return sched


def _commodities(n: int, demands: tuple[Demand, ...]
                 ) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]]]:
    """Per commodity (tenant, origin NPU): supply and per-node demand, in chunks."""
    index: dict[tuple[int, int], int] = {}
    rows: list[np.ndarray] = []
    for t, d in enumerate(demands):
        so, sd = d.single_origin, d.single_destination
        assert so is not None and sd is not None
        ranks = np.asarray(d.ranks)
        for o, r in zip(ranks[so].tolist(), ranks[sd].tolist(), strict=True):
            q = index.setdefault((t, o), len(index))
            if q == len(rows):
                rows.append(np.zeros(n))
            rows[q][r] += 1
    want = np.vstack(rows)
    supply = want.sum(axis=1)
    return supply, want, list(index)


@dataclass
class _Lp:
    model: Model
    tau: int
    f_q: np.ndarray
    f_g: np.ndarray
    f_k: np.ndarray
    fvar: np.ndarray
    h_q: np.ndarray
    h_n: np.ndarray
    h_k: np.ndarray
    hvar: np.ndarray
    kappa: np.ndarray
    groups: _Groups
    want: np.ndarray
    origin: np.ndarray


def _build(groups: _Groups, hop: np.ndarray, kappa: np.ndarray, supply: np.ndarray,
           want: np.ndarray, origin_of: list[tuple[int, int]], K: int, tau0: float,
           shortest: bool) -> _Lp:
    Q, N = want.shape
    origin = np.array([o for _t, o in origin_of], dtype=np.int64)
    tenant = np.array([t for t, _o in origin_of], dtype=np.int64)
    edist = _hops(N, groups.src, groups.dst, kappa)
    early = edist[origin]  # (Q, N) epochs until q can be at n
    allowed = np.isfinite(early[:, groups.src])
    if shortest:
        allowed &= hop[origin][:, groups.dst] == hop[origin][:, groups.src] + 1
    lo = np.where(allowed, early[:, groups.src], 0).astype(np.int64)
    cnt = np.where(allowed, np.maximum(0, K - kappa[None, :] - lo + 1), 0)
    # every array below is sized by these: flows, holdings H[q, n, k], conservation rows
    # per (q, n, k) and the epochs each flow occupies its link
    first = np.where(np.isfinite(early), early, K).astype(np.int64)
    where = f"a flow of {K} epochs for {Q} origins over {len(groups.src)} link groups"
    check_size(int(cnt.sum()) + int(np.maximum(K - first, 0).sum()), MAX_VARIABLES, "lp",
               where, "variables")
    check_size(Q * N * (K + 1) + int((cnt * kappa[None, :]).sum()), MAX_ENTRIES, "lp", where,
               "rows and capacity entries")
    fq, fg = np.nonzero(cnt)
    reps = cnt[fq, fg]
    f_q, f_g = np.repeat(fq, reps), np.repeat(fg, reps)
    f_k = concat_ranges(lo[fq, fg], reps)
    m = Model()
    t_f = groups.time[tenant[f_q], f_g] / tau0
    tau = int(m.add_vars(1, 0.0, cost=1.0)[0])
    fvar = m.add_vars(len(f_q), 0.0, cost=1e-6 * t_f)
    # H[q, n, k] for k from the first epoch q can be at n to K-1
    hq, hn = np.nonzero(first < K)
    hreps = K - first[hq, hn]
    h_q, h_n = np.repeat(hq, hreps), np.repeat(hn, hreps)
    h_k = concat_ranges(first[hq, hn], hreps)
    hvar = m.add_vars(len(h_q))
    # conservation per (q, n, k): kept(k) + sent(k) - kept(k-1) - arrived(k) = supply at
    # (origin, 0); row k = K closes it: -kept(K-1) - arrived(K) = -demand
    def row(q: np.ndarray, n: np.ndarray, k: np.ndarray) -> np.ndarray:
        return (q * N + n) * (K + 1) + k

    nrows = Q * N * (K + 1)
    rhs = np.zeros(nrows)
    rhs[row(np.arange(Q), origin, np.zeros(Q, dtype=np.int64))] += supply
    rhs[row(np.repeat(np.arange(Q), N), np.tile(np.arange(N), Q), np.full(Q * N, K))] -= \
        want.ravel()
    m.add_rows(np.concatenate([row(h_q, h_n, h_k), row(h_q, h_n, h_k + 1),
                               row(f_q, groups.src[f_g], f_k),
                               row(f_q, groups.dst[f_g], f_k + kappa[f_g])]),
               np.concatenate([hvar, hvar, fvar, fvar]),
               np.concatenate([np.ones(len(hvar)), -np.ones(len(hvar)), np.ones(len(fvar)),
                               -np.ones(len(fvar))]), rhs, rhs, nrows)
    # capacity per (g, k): link time of the transfers in flight during epoch k (a transfer
    # longer than an epoch occupies kappa of them; a whole chunk may start at once)
    occ = kappa[f_g]
    o_idx = np.repeat(np.arange(len(f_q)), occ)
    o_k = concat_ranges(f_k, occ)
    ck = f_g[o_idx] * K + o_k
    uk, crow = np.unique(ck, return_inverse=True)
    gk = uk // K
    m.add_rows(np.concatenate([crow, np.arange(len(uk))]),
               np.concatenate([fvar[o_idx], np.full(len(uk), tau)]),
               np.concatenate([t_f[o_idx], -groups.count[gk] * kappa[gk]]), -np.inf, 0.0,
               len(uk))
    return _Lp(m, tau, f_q, f_g, f_k, fvar, h_q, h_n, h_k, hvar, kappa, groups, want, origin)


@dataclass
class _Path:
    q: int
    dest: int
    weight: float
    hops: list[tuple[int, int]]  # (group, epoch)


def _decompose(lp: _Lp, x: np.ndarray, K: int) -> list[_Path]:
    """Split each commodity's flow into time-respecting paths from its origin."""
    fl = x[lp.fvar]
    hl = x[lp.hvar]
    keep_f = fl > EPS
    keep_h = hl > EPS
    arcs: dict[tuple[int, int, int], list[list]] = defaultdict(list)  # [flow, group, to, at]
    g_src, g_dst = lp.groups.src, lp.groups.dst
    for q, g, k, v in zip(lp.f_q[keep_f].tolist(), lp.f_g[keep_f].tolist(),
                          lp.f_k[keep_f].tolist(), fl[keep_f].tolist(), strict=True):
        arcs[(q, int(g_src[g]), k)].append([v, g, int(g_dst[g]), k + int(lp.kappa[g]), k])
    for q, n, k, v in zip(lp.h_q[keep_h].tolist(), lp.h_n[keep_h].tolist(),
                          lp.h_k[keep_h].tolist(), hl[keep_h].tolist(), strict=True):
        arcs[(q, n, k)].append([v, -1, n, k + 1, k])
    paths: list[_Path] = []
    for q in range(lp.want.shape[0]):
        o = int(lp.origin[q])
        left = lp.want[q].astype(float).copy()
        while left.sum() > 1e-6:
            node, k = o, 0
            trail: list[list] = []
            while k < K:
                out = arcs.get((q, node, k))
                best = max(out, key=lambda a: a[0]) if out else None
                if best is None or best[0] <= EPS:
                    break
                trail.append(best)
                node, k = best[2], best[3]
            if k < K:  # numerical leftovers only
                break
            w = min([a[0] for a in trail] + [float(left[node])])
            if w <= EPS:  # the walk ends where nothing more is owed: retire its thinnest arc
                if not trail:
                    break
                min(trail, key=lambda a: a[0])[0] = 0.0
                continue
            for a in trail:
                a[0] -= w
            left[node] -= w
            paths.append(_Path(q, node, w, [(a[1], a[4]) for a in trail if a[1] >= 0]))
    return paths


def _schedule(fabric: Topology, view: Topology, demands: tuple[Demand, ...], groups: _Groups,
              paths: list[_Path], origin_of: list[tuple[int, int]]) -> Schedule:
    # chunk ids per (tenant, origin NPU, destination NPU)
    ids: dict[tuple[int, int, int], list[int]] = defaultdict(list)
    for t, d in enumerate(demands):
        so, sd = d.single_origin, d.single_destination
        assert so is not None and sd is not None
        ranks = np.asarray(d.ranks)
        for c, (o, r) in enumerate(zip(ranks[so].tolist(), ranks[sd].tolist(), strict=True)):
            ids[(t, o, r)].append(c)
    by_pair: dict[tuple[int, int], list[_Path]] = defaultdict(list)
    for p in paths:
        by_pair[(p.q, p.dest)].append(p)
    # deal each piece's chunks to its paths (largest remainder)
    items: list[tuple[int, int, int, list[tuple[int, int]]]] = []  # tenant, chunk, o, hops
    for (q, dest), ps in by_pair.items():
        t, o = origin_of[q]
        chunk_ids = ids[(t, o, dest)]
        if o == dest or not chunk_ids:
            continue
        w = np.array([p.weight for p in ps])
        share = w / w.sum() * len(chunk_ids)
        count = np.floor(share).astype(int)
        for i in np.argsort(-(share - count))[: len(chunk_ids) - int(count.sum())]:
            count[i] += 1
        it = iter(chunk_ids)
        for p, cnt in zip(ps, count.tolist(), strict=True):
            for _ in range(cnt):
                items.append((t, next(it), o, p.hops))
    missing = sum(len(v) for (t, o, r), v in ids.items() if o != r) - len(items)
    if missing:
        raise InfeasibleError(f"flow decomposition left {missing} chunk(s) without a route")
    # list-schedule hops in epoch order; longer remaining routes first within an epoch
    hop_list = [(k, -(len(hops) - h), i, h) for i, (_t, _c, _o, hops) in enumerate(items)
                for h, (_g, k) in enumerate(hops)]
    hop_list.sort()
    free: defaultdict[int, float] = defaultdict(float)
    ready = [0.0] * len(items)
    cols: dict[str, list] = {c: [] for c in ("tenant", "chunk", "src", "dst", "link", "start",
                                             "end")}
    for _k, _r, i, h in hop_list:
        t, c, _o, hops = items[i]
        g = hops[h][0]
        link = min(groups.members[g], key=lambda li: max(free[li], ready[i]))
        s = max(free[link], ready[i])
        e = s + float(groups.time[t, g])
        free[link] = e
        ready[i] = e
        for key, v in (("tenant", t), ("chunk", c), ("src", int(groups.src[g])),
                       ("dst", int(groups.dst[g])), ("link", link), ("start", s), ("end", e)):
            cols[key].append(v)
    m = len(cols["tenant"])
    a = {k: np.asarray(v) for k, v in cols.items()}
    return Schedule(fabric, view, demands, a["tenant"], a["chunk"], a["src"], a["dst"],
                    a["link"], a["start"], a["end"], np.full(m, int(Op.COPY), dtype=np.int8),
                    engine="lp").sorted()
