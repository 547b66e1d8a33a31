"""TE-CCL's copy MILP over a window of epochs (all of time, or one A*-style round).

Variables, for commodity (chunk) ``c``, usable link ``e``, node ``n`` and epoch ``k``:

* ``F[c,e,k]`` binary: ``c`` starts over ``e`` in epoch ``k``;
* ``B[c,n,k]`` in [0, 1]: ``n`` holds ``c`` at the start of epoch ``k`` (integral whenever it
  matters, because it is bounded by integer arrivals).

Constraints: a node sends only what it holds (copy: one held chunk may leave on every link
in the same epoch); it holds what it held before plus what arrived, a transfer's chunk being
usable ``delay`` epochs after it starts; per link and epoch the occupied shares add up to at
most one; in a complete window every destination holds its chunks at the end. Buffers are
unlimited (an NPU keeps what it received, as AllGather needs anyway).

Variables that cannot matter are never created: a transfer before the chunk can possibly be
at the sender (fewest-epoch distance from its holders), one into a node that already holds
the chunk, or (complete windows) one that would arrive after the window.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from choreo.arrays import concat_ranges
from choreo.teccl.epochs import Grid
from choreo.teccl.highs import MAX_ENTRIES, MAX_VARIABLES, Model, Solution, check_size
from choreo.teccl.network import Net

ROUND_GAMMA = 0.5  # a chunk one step from a needy destination is worth half a delivery


@dataclass(frozen=True)
class Spread:
    """A copy problem: ``have[c, n]`` where chunk ``c`` starts, ``want[c, n]`` where it must
    end; ``tenant[c]`` selects the chunk's transfer costs in the grid."""

    tenant: np.ndarray
    have: np.ndarray
    want: np.ndarray

    @property
    def num(self) -> int:
        return len(self.tenant)


@dataclass
class Window:
    """State at a window's start: holders, arrivals still in flight (``pending[c, n]`` = the
    epoch, counted from this window's start, when ``c`` becomes usable at ``n``; 0 = none),
    and link shares already taken in the first epochs (``busy[e, k]``)."""

    have: np.ndarray
    pending: np.ndarray
    busy: np.ndarray

    @classmethod
    def initial(cls, spread: Spread, net: Net, horizon: int) -> Window:
        return cls(spread.have.copy(), np.zeros(spread.have.shape, dtype=np.int64),
                   np.zeros((net.num_links, horizon)))


@dataclass
class Result:
    """Chosen transfers (commodity, usable-link position, epoch within the window)."""

    c: np.ndarray
    e: np.ndarray
    k: np.ndarray
    solution: Solution
    size: int


def earliest(net: Net, grid: Grid, spread: Spread, window: Window,
             dist: np.ndarray) -> np.ndarray:
    """Fewest epochs until each chunk can be usable at each node (inf if never)."""
    start = np.where(window.have, 0.0, np.inf)
    start = np.where(window.pending > 0, np.minimum(start, window.pending), start)
    # (C, N) x (N, N) min-plus product; dist is per tenant-independent epoch distances
    return np.min(start[:, :, None] + dist[None, :, :], axis=1)


def solve_window(net: Net, grid: Grid, spread: Spread, window: Window, epochs: int,
                 dist: np.ndarray, complete: bool, *, time_limit: float, gap: float,
                 threads: int, first_solution: bool = False) -> Result | None:
    """Build and solve one window; None if it is provably infeasible or no point was found."""
    K = epochs
    C, N = spread.have.shape
    E = net.num_links
    early = earliest(net, grid, spread, window, dist)
    holds = window.have
    delay = grid.delay[spread.tenant]  # (C, E)
    kappa = grid.kappa[spread.tenant]
    load = grid.load[spread.tenant]
    if complete:
        need = spread.want & ~holds
        if np.any(early[need] > K):
            return None

    # ---- transfer variables F[c, e, k] --------------------------------------------------------
    lo = early[:, net.src]  # (C, E)
    hi = (K - delay) if complete else np.full((C, E), K - 1)
    ok = np.isfinite(lo) & ~holds[:, net.dst] & (window.pending[:, net.dst] == 0)
    lo_i = np.where(ok, lo, 0).astype(np.int64)
    count = np.where(ok, np.maximum(0, hi - lo_i + 1), 0)
    check_size(int(count.sum()), MAX_VARIABLES, "milp", f"a window of {K} epochs over {C} "
               f"chunks and {E} links", "variables")
    fc, fe = np.nonzero(count)
    reps = count[fc, fe]
    f_c, f_e = np.repeat(fc, reps), np.repeat(fe, reps)
    f_k = concat_ranges(lo_i[fc, fe], reps)
    nf = len(f_c)
    m = Model()
    fvar = m.add_vars(nf, 0.0, 1.0, integer=True)

    # ---- holding variables B[c, n, k], k = 1..K ----------------------------------------------
    first = np.where(np.isfinite(early), np.maximum(early, 1), K + 1).astype(np.int64)
    first = np.where(holds, K + 1, first)
    bidx = np.full((C, N, K + 1), -1, dtype=np.int64)
    bc, bn = np.nonzero(first <= K)
    breps = K - first[bc, bn] + 1
    b_c, b_n = np.repeat(bc, breps), np.repeat(bn, breps)
    b_k = concat_ranges(first[bc, bn], breps)
    bvar = m.add_vars(len(b_c), 0.0, 1.0)
    bidx[b_c, b_n, b_k] = bvar

    # a node sends only what it holds
    src_holds = holds[f_c, net.src[f_e]]
    sel = ~src_holds
    bsrc = bidx[f_c[sel], net.src[f_e[sel]], f_k[sel]]
    assert np.all(bsrc >= 0), "a transfer before its chunk can be there"
    r = np.arange(int(sel.sum()))
    m.add_rows(np.concatenate([r, r]), np.concatenate([fvar[sel], bsrc]),
               np.concatenate([np.ones(len(r)), -np.ones(len(r))]), -np.inf, 0.0, len(r))

    # holdings: B[k] <= B[k-1] + arrivals at k (+1 when an arrival from before is due then)
    nb = len(bvar)
    prev = bidx[b_c, b_n, b_k - 1]
    has_prev = prev >= 0
    arrive = f_k + delay[f_c, f_e]
    into = arrive <= K
    brow = bidx[f_c[into], net.dst[f_e[into]], arrive[into]]
    valid = brow >= 0
    row_of = np.full(m.num_vars, -1, dtype=np.int64)
    row_of[bvar] = np.arange(nb)
    due = window.pending[b_c, b_n]
    upper = np.where((due > 0) & (due <= b_k), 1.0, 0.0)
    rows = np.concatenate([np.arange(nb), np.flatnonzero(has_prev), row_of[brow[valid]]])
    cols = np.concatenate([bvar, prev[has_prev], fvar[into][valid]])
    vals = np.concatenate([np.ones(nb), -np.ones(int(has_prev.sum())),
                           -np.ones(int(valid.sum()))])
    m.add_rows(rows, cols, vals, -np.inf, upper, nb)

    # link capacity per epoch: occupied shares add up to at most one
    occ = kappa[f_c, f_e]
    check_size(int(occ.sum()), MAX_ENTRIES, "milp", f"the link capacity of a window of {K} "
               "epochs", "matrix entries")
    o_idx = np.repeat(np.arange(nf), occ)
    o_k = concat_ranges(f_k, occ)
    inside = o_k < K
    o_idx, o_k = o_idx[inside], o_k[inside]
    key = f_e[o_idx] * K + o_k
    ukeys, crow = np.unique(key, return_inverse=True)
    busy = np.zeros(len(ukeys))
    ke, kk = ukeys // K, ukeys % K
    in_busy = kk < window.busy.shape[1]
    busy[in_busy] = window.busy[ke[in_busy], kk[in_busy]]
    m.add_rows(crow, fvar[o_idx], load[f_c[o_idx], f_e[o_idx]], -np.inf,
               np.maximum(1.0 - busy, 0.0) + 1e-9, len(ukeys))

    # ---- objective -----------------------------------------------------------------------------
    wanted = spread.want[b_c, b_n]
    cost = np.zeros(m.num_vars)
    if complete:
        need_c, need_n = np.nonzero(spread.want & ~holds)
        m.raise_lower(bidx[need_c, need_n, K], 1.0)
        cost[fvar] = 1.0 + f_k / (10.0 * K)  # fewest transfers, earlier ones preferred
        minimize = True
    else:
        cost[fvar] = -1e-3
        cost[bvar[wanted]] = 1.0 / K
        final_sel = b_k == K
        cost[bvar[wanted & final_sel]] += 1.0
        cost[bvar[~wanted & final_sel]] += ROUND_GAMMA * _potential(
            spread, window, dist)[b_c[~wanted & final_sel], b_n[~wanted & final_sel]]
        minimize = False
    m.set_cost(np.arange(m.num_vars), cost)
    sol = m.solve(minimize=minimize, time_limit=time_limit, gap=gap, threads=threads,
                  first_solution=first_solution)
    if sol.x is None:
        return None
    chosen = sol.x[fvar] > 0.5
    return Result(f_c[chosen], f_e[chosen], f_k[chosen], sol, nf)


def _potential(spread: Spread, window: Window, dist: np.ndarray) -> np.ndarray:
    """Per (chunk, node): 1/(1 + epochs to the nearest destination still lacking it)."""
    lacking = spread.want & ~window.have & (window.pending == 0)
    d = np.where(lacking[:, None, :], dist[None, :, :], np.inf).min(axis=2)
    return np.where(np.isfinite(d), 1.0 / (1.0 + d), 0.0)
