"""Choosing how many epochs: a complete window found by search, or A*-style rounds.

Complete window (TE-CCL section 5): start at a lower bound on the epochs (bandwidth bound
and fewest-epoch distances), probe with "first feasible point" solves while growing the
window, then bisect down between the last infeasible and the first feasible count; the best
count is re-solved for the fewest transfers within the time left. When the window below the
result was proven infeasible, the epoch count is optimal for this epoch length.

Rounds (TE-CCL appendix D): when a complete window would be too large, time is cut into
rounds of a few epochs. Each round maximizes deliveries (earlier is better) plus half a
delivery's worth for chunks held close to destinations still lacking them; transfers still
in flight and link time still taken at a round's end carry into the next round.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from choreo.errors import InfeasibleError
from choreo.teccl.epochs import Grid
from choreo.teccl.milp import Result, Spread, Window, solve_window
from choreo.teccl.network import Net, hop_epochs


@dataclass
class Plan:
    """Chosen transfers of a whole phase (epochs counted from time 0) and how they were found."""

    c: np.ndarray
    e: np.ndarray
    k: np.ndarray
    epochs: int
    info: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Budget:
    deadline: float
    gap: float
    threads: int

    def left(self) -> float:
        return self.deadline - time.monotonic()


def window_size(net: Net, grid: Grid, spread: Spread, epochs: int, dist: np.ndarray) -> int:
    """Binary variables a complete window of ``epochs`` would need (to pick the method)."""
    window = Window.initial(spread, net, 1)
    early = np.min(np.where(window.have, 0.0, np.inf)[:, :, None] + dist[None], axis=1)
    lo = early[:, net.src]
    hi = epochs - grid.delay[spread.tenant]
    n = np.where(np.isfinite(lo) & ~spread.have[:, net.dst], np.maximum(0, hi - lo + 1), 0)
    return int(n.sum())


def complete(net: Net, grid: Grid, spread: Spread, lower: int, budget: Budget,
             max_epochs: int, polish: bool = True) -> Plan:
    """Fewest epochs with every destination served (see the module docstring)."""
    dist = hop_epochs(net, grid.delay.min(axis=0))
    window = Window.initial(spread, net, 1)
    need = spread.want & ~spread.have
    early = np.min(np.where(spread.have, 0.0, np.inf)[:, :, None] + dist[None], axis=1)
    if np.any(~np.isfinite(early[need])):
        raise InfeasibleError("a destination cannot be reached from its chunk's holders")
    lo = max(lower, int(early[need].max()) if need.any() else 0) - 1  # lo: known infeasible
    best: tuple[int, Result] | None = None
    proven = True
    k = lo + 1
    while best is None:
        if k > max_epochs or budget.left() <= 0:
            raise InfeasibleError(f"no schedule within {min(k, max_epochs)} epochs in time")
        res, sure = _probe(net, grid, spread, window, k, dist, budget)
        if res is None:
            proven = proven and sure
            lo = k
            k = k + 1 if k < lo + 2 else math.ceil(k * 1.25)
        else:
            best = (k, res)
    hi = best[0]
    while hi - lo > 1 and budget.left() > 0:
        mid = (lo + hi) // 2
        res, sure = _probe(net, grid, spread, window, mid, dist, budget)
        if res is None:
            proven = proven and sure
            lo = mid
        else:
            best, hi = (mid, res), mid
    k, res = best
    if polish and budget.left() > 0:
        final = solve_window(net, grid, spread, window, k, dist, True,
                             time_limit=budget.left(), gap=budget.gap, threads=budget.threads)
        if final is not None:
            res = final
    info = {"method": "complete", "epochs": k, "epochs_optimal": proven and hi - lo <= 1,
            "status": res.solution.status, "gap": res.solution.gap, "binaries": res.size}
    return Plan(res.c, res.e, res.k, k, info)


def _probe(net: Net, grid: Grid, spread: Spread, window: Window, k: int, dist: np.ndarray,
           budget: Budget) -> tuple[Result | None, bool]:
    """A first-feasible-point solve; the flag says a "no" was proven, not a time-out."""
    res = solve_window(net, grid, spread, window, k, dist, True, time_limit=budget.left(),
                       gap=1.0, threads=budget.threads, first_solution=True)
    return res, res is not None or budget.left() > 0


def rounds(net: Net, grid: Grid, spread: Spread, round_epochs: int, budget: Budget,
           max_rounds: int = 200) -> Plan:
    """Solve round after round until every destination is served (see the docstring)."""
    dist = hop_epochs(net, grid.delay.min(axis=0))
    K = max(round_epochs, 2 * grid.max_delay)
    horizon = int(grid.kappa.max()) + K
    window = Window.initial(spread, net, horizon)
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    offset = 0
    for r in range(max_rounds):
        if not np.any(spread.want & ~window.have & (window.pending == 0)) and not np.any(
                window.pending):
            break
        if budget.left() <= 0:
            raise InfeasibleError(f"time limit reached after {r} rounds")
        per_round = budget.left() / 2
        res = solve_window(net, grid, spread, window, K, dist, False, time_limit=per_round,
                           gap=max(budget.gap, 0.02), threads=budget.threads)
        if res is None or (len(res.c) == 0 and not np.any(window.pending)):
            raise InfeasibleError(f"round {r} made no progress")
        parts.append((res.c, res.e, res.k + offset))
        window = _advance(net, grid, spread, window, res, K, horizon)
        offset += K
    else:
        raise InfeasibleError(f"not done after {max_rounds} rounds")
    c, e, k = (np.concatenate(x) if parts else np.zeros(0, dtype=np.int64) for x in zip(*parts,
                                                                                      strict=True))
    return Plan(c, e, k, offset, {"method": "rounds", "rounds": len(parts), "round_epochs": K,
                                  "epochs": offset})


def _advance(net: Net, grid: Grid, spread: Spread, window: Window, res: Result, K: int,
             horizon: int) -> Window:
    have = window.have.copy()
    pending = window.pending.copy()
    due = (pending > 0) & (pending <= K)
    have |= due
    pending = np.where(due, 0, np.where(pending > 0, pending - K, 0))
    arrive = res.k + grid.delay[spread.tenant[res.c], res.e]
    dst = net.dst[res.e]
    now = arrive <= K
    have[res.c[now], dst[now]] = True
    later = ~now & ~have[res.c, dst]
    for ci, ni, a in zip(res.c[later].tolist(), dst[later].tolist(),
                         (arrive[later] - K).tolist(), strict=True):
        if pending[ci, ni] == 0 or a < pending[ci, ni]:
            pending[ci, ni] = a
    pending[have] = 0
    busy = np.zeros((net.num_links, horizon))
    busy[:, : horizon - K] = window.busy[:, K:]
    kap = grid.kappa[spread.tenant[res.c], res.e]
    load = grid.load[spread.tenant[res.c], res.e]
    for ei, ki, ka, ld in zip(res.e.tolist(), res.k.tolist(), kap.tolist(), load.tolist(),
                              strict=True):
        for t in range(max(ki, K), ki + ka):
            busy[ei, t - K] += ld
    return Window(have, pending, busy)
