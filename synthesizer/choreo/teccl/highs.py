"""A small columnar model builder over HiGHS, so formulations are written as numpy blocks.

Time-expanded models have 10^4..10^6 variables; adding them one call at a time through the
Python API costs more than solving. Variables and constraint rows are appended in blocks of
index arrays and the whole model is handed to HiGHS once, row-wise.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from choreo.errors import InputError

INF = float("inf")
# A time-expanded model's memory grows with its variables and matrix entries (a MILP with
# windows of 571,000 binaries grew its process to 3.2 GiB), and HiGHS closes none this large
# within a request's deadline: refuse it before it is built.
MAX_VARIABLES = 300_000
MAX_ENTRIES = 3_000_000


_scheduler = threading.Lock()
_threads: int | None = None  # what HiGHS's process-wide scheduler was started with
_running = 0  # HiGHS instances in use


@contextlib.contextmanager
def solver(threads: int = 1) -> Iterator[Any]:
    """A quiet HiGHS instance on ``threads`` threads, every HiGHS run of choreo's goes
    through. HiGHS starts one scheduler per process, with the thread count of its first
    run, and fails every later run that asks for another count (a service worker whose
    tree packing ran first then failed every MILP). So the scheduler is started again when
    no run is in flight; a run that overlaps one with another count takes that count."""
    import highspy

    global _threads, _running
    with _scheduler:
        if threads != _threads and not _running:
            if _threads is not None:
                highspy.Highs.resetGlobalScheduler(True)
            _threads = threads
        use = threads if _threads is None else _threads
        _running += 1
    try:
        h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("threads", use)
        yield h
    finally:
        with _scheduler:
            _running -= 1


def check_size(count: int, limit: int, engine: str, what: str, unit: str) -> None:
    """InputError naming the size and the limit where ``count`` ``unit`` pass ``limit``."""
    if count > limit:
        raise InputError(
            f"engine {engine}: {what} needs {count:,} {unit}, above its limit of {limit:,} "
            "(memory and time); use fewer ranks or chunks, or engine greedy or auto")


@dataclass
class Solution:
    """``status`` is HiGHS' model status text; ``x`` is None when no feasible point is known."""

    status: str
    x: np.ndarray | None
    objective: float
    gap: float
    seconds: float

    @property
    def feasible(self) -> bool:
        return self.x is not None

    @property
    def optimal(self) -> bool:
        return self.status == "Optimal"


class Model:
    """Variables and rows appended in blocks; ``solve`` builds the HiGHS model once."""

    def __init__(self) -> None:
        self._cost: list[np.ndarray] = []
        self._lo: list[np.ndarray] = []
        self._hi: list[np.ndarray] = []
        self._int: list[np.ndarray] = []
        self.num_vars = 0
        self._rows: list[np.ndarray] = []
        self._cols: list[np.ndarray] = []
        self._vals: list[np.ndarray] = []
        self._rlo: list[np.ndarray] = []
        self._rhi: list[np.ndarray] = []
        self.num_rows = 0

    def add_vars(self, n: int, lo: float | np.ndarray = 0.0, hi: float | np.ndarray = INF,
                 cost: float | np.ndarray = 0.0, integer: bool = False) -> np.ndarray:
        """Append ``n`` variables and return their indices."""
        self._cost.append(np.broadcast_to(np.asarray(cost, dtype=float), (n,)).copy())
        self._lo.append(np.broadcast_to(np.asarray(lo, dtype=float), (n,)).copy())
        self._hi.append(np.broadcast_to(np.asarray(hi, dtype=float), (n,)).copy())
        self._int.append(np.full(n, integer, dtype=bool))
        idx = np.arange(self.num_vars, self.num_vars + n, dtype=np.int64)
        self.num_vars += n
        return idx

    def add_rows(self, row: np.ndarray, col: np.ndarray, val: np.ndarray | float,
                 lo: np.ndarray | float, hi: np.ndarray | float, count: int | None = None) -> None:
        """Append rows ``lo <= sum(val * x[col]) <= hi``; ``row`` numbers them from 0 locally."""
        row = np.asarray(row, dtype=np.int64)
        m = int(row.max()) + 1 if count is None and len(row) else (count or 0)
        self._rows.append(row + self.num_rows)
        self._cols.append(np.asarray(col, dtype=np.int64))
        self._vals.append(np.broadcast_to(np.asarray(val, dtype=float), row.shape).copy())
        self._rlo.append(np.broadcast_to(np.asarray(lo, dtype=float), (m,)).copy())
        self._rhi.append(np.broadcast_to(np.asarray(hi, dtype=float), (m,)).copy())
        self.num_rows += m

    def raise_lower(self, idx: np.ndarray, value: float) -> None:
        """Raise the lower bound of existing variables (fixing demands after the fact)."""
        full = np.concatenate(self._lo) if self._lo else np.zeros(0)
        full[idx] = np.maximum(full[idx], value)
        self._lo = [full]

    def set_cost(self, idx: np.ndarray, cost: np.ndarray | float) -> None:
        """Overwrite objective coefficients of existing variables."""
        full = np.concatenate(self._cost) if self._cost else np.zeros(0)
        full[idx] = cost
        self._cost = [full]

    def solve(self, *, minimize: bool = True, time_limit: float = 60.0, gap: float = 1e-4,
              threads: int = 1, first_solution: bool = False) -> Solution:
        """Solve; ``first_solution`` stops a MIP at its first feasible point (a probe)."""
        import highspy

        started = time.perf_counter()
        lp = highspy.HighsLp()
        lp.num_col_ = self.num_vars
        lp.num_row_ = self.num_rows
        lp.col_cost_ = _cat(self._cost)
        lp.col_lower_ = _cat(self._lo)
        lp.col_upper_ = _cat(self._hi)
        lp.row_lower_ = _cat(self._rlo)
        lp.row_upper_ = _cat(self._rhi)
        rows, cols, vals = _cat(self._rows, np.int64), _cat(self._cols, np.int64), _cat(self._vals)
        order = np.lexsort((cols, rows))
        rows, cols, vals = rows[order], cols[order], vals[order]
        start = np.searchsorted(rows, np.arange(self.num_rows + 1)).astype(np.int32)
        lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
        lp.a_matrix_.num_col_ = self.num_vars
        lp.a_matrix_.num_row_ = self.num_rows
        lp.a_matrix_.start_ = start
        lp.a_matrix_.index_ = cols.astype(np.int32)
        lp.a_matrix_.value_ = vals
        lp.sense_ = highspy.ObjSense.kMinimize if minimize else highspy.ObjSense.kMaximize
        integer = _cat(self._int, bool)
        if integer.any():
            lp.integrality_ = [highspy.HighsVarType.kInteger if b else
                               highspy.HighsVarType.kContinuous for b in integer.tolist()]
        with solver(int(threads)) as h:
            h.setOptionValue("time_limit", max(float(time_limit), 0.01))
            h.setOptionValue("mip_rel_gap", float(gap))
            h.setOptionValue("random_seed", 0)
            if first_solution:
                h.setOptionValue("mip_max_improving_sols", 1)
            h.passModel(lp)
            h.run()
            status = h.modelStatusToString(h.getModelStatus())
            info = h.getInfo()
            has_point = info.primal_solution_status == 2  # kSolutionStatusFeasible
            x = np.asarray(h.getSolution().col_value) if has_point else None
            gap_value = float(info.mip_gap) if integer.any() else 0.0
            obj = float(info.objective_function_value) if has_point else float("nan")
            return Solution(status, x, obj, gap_value, time.perf_counter() - started)


def _cat(parts: list[np.ndarray], dtype: type = float) -> np.ndarray:
    return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype=dtype)
