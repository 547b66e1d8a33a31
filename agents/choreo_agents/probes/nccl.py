"""Parse and run nccl-tests (``sendrecv_perf``, ``alltoall_perf``) for link timings.

nccl-tests prints one table row per message size, interleaved with ``#`` comment lines,
``NCCL INFO``/``WARN`` log lines and a trailing ``# Avg bus bandwidth`` summary. Column
layouts differ between versions (``redop``/``root`` columns, ``#wrong`` vs ``error``), so
columns are located from the header row, and any row that does not fit is dropped with a
count, not guessed at. A row whose data check failed (``#wrong`` > 0) is not a timing.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from choreo_agents.probes import ProbeError, Samples

log = logging.getLogger(__name__)

TOOLS = ("sendrecv_perf", "alltoall_perf")


@dataclass(frozen=True, slots=True)
class NcclRow:
    size: int
    time_us: float
    in_place_time_us: float | None


@dataclass(slots=True)
class NcclResult:
    """The usable rows of one nccl-tests run plus what was thrown away and why."""

    rows: list[NcclRow] = field(default_factory=list)
    avg_bus_bandwidth_gbs: float | None = None
    dropped: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def samples(self, bytes_per_size: float = 1.0, in_place: bool = True) -> Samples:
        """Timings in seconds; ``bytes_per_size`` scales the message size to bytes per link."""
        sizes: list[float] = []
        times: list[float] = []
        for row in self.rows:
            for t in (row.time_us, row.in_place_time_us if in_place else None):
                if t is not None:
                    sizes.append(row.size * bytes_per_size)
                    times.append(t * 1e-6)
        return Samples(np.array(sizes), np.array(times))


_ERROR_MARKERS = ("NCCL WARN", "Test NCCL failure", "Test CUDA failure", "Test failure")


def parse(text: str) -> NcclResult:
    """Parse nccl-tests stdout; raises ``ProbeError`` if no usable row was found."""
    result = NcclResult()
    columns: list[str] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if any(marker in line for marker in _ERROR_MARKERS):
            result.errors.append(line)
            continue
        if line.startswith("#"):
            body = line.lstrip("#").strip()
            tokens = body.split()
            if "size" in tokens and "time" in tokens:
                columns = tokens
            elif body.startswith("Avg bus bandwidth"):
                result.avg_bus_bandwidth_gbs = _number(body.partition(":")[2])
            continue
        if columns is None or not line[0].isdigit():
            continue  # log lines (NCCL INFO, hostnames) and rows before any header
        row = _row(line.split(), columns)
        if isinstance(row, str):
            result.dropped.append(f"{row}: {line[:120]}")
        else:
            result.rows.append(row)
    if not result.rows:
        detail = "; ".join((result.errors or result.dropped)[:3]) or "no result table"
        raise ProbeError(f"nccl-tests output has no usable rows ({detail})")
    return result


def _row(tokens: list[str], columns: list[str]) -> NcclRow | str:
    """One table row, or a short reason why it is unusable."""
    if len(tokens) != len(columns):
        return f"expected {len(columns)} columns, got {len(tokens)}"
    times = [i for i, c in enumerate(columns) if c == "time"]
    checks = [i for i, c in enumerate(columns) if c in ("#wrong", "error")]
    try:
        size = int(tokens[columns.index("size")])
    except ValueError:
        return "size is not an integer"
    if size <= 0:
        return "size is not positive"
    values: list[float | None] = []
    for k, i in enumerate(times):
        t = _number(tokens[i])
        wrong = _number(tokens[checks[k]]) if k < len(checks) else 0.0
        if t is None or t <= 0 or (wrong is not None and wrong > 0):
            values.append(None)
        else:
            values.append(t)
    if not values or values[0] is None:
        if len(values) > 1 and values[1] is not None:
            return NcclRow(size, values[1], None)
        return "no valid time (bad number or failed data check)"
    return NcclRow(size, values[0], values[1] if len(values) > 1 else None)


def _number(text: str) -> float | None:
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def find_tool(name: str, search: Sequence[str] = ()) -> str | None:
    """The path of an nccl-tests binary in ``search`` dirs or on PATH, if any."""
    for directory in search:
        candidate = os.path.join(directory, name)
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which(name)


def run(
    tool: str,
    gpus: Sequence[int],
    *,
    min_bytes: int = 1024,
    max_bytes: int = 256 << 20,
    factor: int = 4,
    iters: int = 20,
    timeout: float = 120.0,
) -> NcclResult:
    """Run one nccl-tests binary on ``gpus`` (one process, one thread per GPU) and parse it."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=",".join(str(g) for g in gpus))
    cmd = [
        tool,
        "-b", str(min_bytes), "-e", str(max_bytes), "-f", str(factor),
        "-g", str(len(gpus)), "-n", str(iters), "-w", "5", "-c", "1",
    ]  # fmt: skip
    try:
        proc = subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ProbeError(f"{os.path.basename(tool)} on GPUs {list(gpus)}: {exc}") from exc
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise ProbeError(
            f"{os.path.basename(tool)} on GPUs {list(gpus)} exited {proc.returncode}: "
            + " | ".join(tail)
        )
    result = parse(proc.stdout)
    if result.dropped:
        log.warning(
            "%s: dropped %d unusable rows, first: %s", tool, len(result.dropped), result.dropped[0]
        )
    return result
