"""``choreo bench --calibration``: the NCCL model against published nccl-tests measurements.

The rows are the measured table of the shared note *NCCL as it really runs* (busbw in GB/s
at the largest size of each sweep), verbatim. The model is calibrated to these rows only,
and only through physically meaningful parameters: the presets' achievable link rates and
NCCL's own constants. There is no per-row factor; a row the model misses by more than 15%
is reported as missed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from choreo.benchtable import Row
from choreo.collectives import Collective, Demand
from choreo.generators import build
from choreo.nccl.model import nccl_baseline

GIB = 1 << 30
MIB = 1 << 20
TOLERANCE = 0.15
LARGE = 4 * GIB  # "large" in the note: the top of an nccl-tests sweep
SOURCE = ("shared note 'NCCL as it really runs': published nccl-tests busbw, "
          "largest size of the sweep")


@dataclass(frozen=True)
class Measured:
    """One measurement: ``busbw`` in GB/s, a (low, high) range where the note gives one."""

    fabric: str  # as the note names it
    preset: str  # the choreo preset it runs on
    collective: Collective
    algorithm: str  # as the note names it
    size: int
    busbw: tuple[float, float]
    forced: str | None = None  # NCCL_ALGO for a forced run


C = Collective
H100 = "1 x H100 SXM node (NVSwitch), 8 GPUs"
TABLE = (
    Measured(H100, "dgx-h100-1", C.ALLREDUCE, "NVLS (NCCL's default)", 8 * GIB, (479, 479)),
    Measured(H100, "dgx-h100-1", C.ALLREDUCE, "NVLS", GIB, (466, 466)),
    Measured(H100, "dgx-h100-1", C.ALLREDUCE, "NVLS", 128 * MIB, (401, 401)),
    Measured(H100, "dgx-h100-1", C.ALLREDUCE, "NVLS", 16 * MIB, (234, 234)),
    Measured(H100, "dgx-h100-1", C.ALLREDUCE, "Ring forced", 2 * GIB, (365, 370), "ring"),
    Measured(H100, "dgx-h100-1", C.ALLREDUCE, "Ring forced", 4 * GIB, (365, 370), "ring"),
    Measured(H100, "dgx-h100-1", C.ALLGATHER, "NCCL's choice", LARGE, (350, 370)),
    Measured(H100, "dgx-h100-1", C.REDUCESCATTER, "NCCL's choice", LARGE, (350, 370)),
    Measured("4 x H100 nodes, 8 x 400G InfiniBand each, 32 GPUs (NCCL 2.24)", "dgx-h100-4",
             C.ALLREDUCE, "NCCL's choice", LARGE, (331, 331)),
    Measured("4 x H100 nodes, 8 x 400G InfiniBand each, 32 GPUs (NCCL 2.24)", "dgx-h100-4",
             C.ALLGATHER, "NCCL's choice", LARGE, (324, 324)),
    Measured("1 x A100 node (NVSwitch, no NVLS), 8 GPUs", "dgx-a100-1", C.ALLREDUCE,
             "NCCL's choice", GIB, (232, 232)),
    Measured("1 x A100 node (NVSwitch, no NVLS), 8 GPUs", "dgx-a100-1", C.ALLGATHER,
             "NCCL's choice", GIB, (254, 254)),
)


def _size(n: int) -> str:
    return f"{n // GIB} GiB" if n >= GIB else f"{n // MIB} MiB"


def calibration_rows() -> list[Row]:
    """One row per measurement: measured, model, ratio (model / measured, the middle of a
    range) and whether the model is within 15% of the measurement (of the range's ends)."""
    rows = []
    for m in TABLE:
        fabric = build(m.preset)
        d = Demand(m.collective, tuple(fabric.npus), m.size)
        r = nccl_baseline(fabric, d, algorithms=[m.forced] if m.forced else None)
        model = r.busbw / 1e9
        lo, hi = m.busbw
        ratio = model / ((lo + hi) / 2)
        ok = lo * (1 - TOLERANCE) <= model <= hi * (1 + TOLERANCE)
        shown = f"{lo:g}" if lo == hi else f"{lo:g}-{hi:g}"
        rows.append(Row(
            f"{m.fabric}: {m.collective.value}, {m.algorithm}, {_size(m.size)} ({m.preset})",
            f"{shown} GB/s busbw (nccl-tests)",
            f"model {model:.1f} GB/s, within 15%",
            f"ratio {ratio:.3f}; model ran {r.choice} on {r.channels} channels",
            ok, group="NCCL calibration", value=ratio,
        ))
    return rows


def cost_rows() -> list[Row]:
    """What one NCCL-model call costs on the largest built-in fabrics (best of three)."""
    rows = []
    for name in ("dgx-h100-128", "torus-32x32"):
        fabric = build(name)
        d = Demand(Collective.ALLREDUCE, tuple(fabric.npus), 256 * MIB)
        times = []
        for _ in range(3):
            started = time.perf_counter()
            nccl_baseline(fabric, d)
            times.append(time.perf_counter() - started)
        rows.append(Row(f"{name} allreduce 256 MiB: one model call", f"{min(times):.2f} s",
                        "<= 2 s", "the CLI's 30 s budget at 1024 GPUs", min(times) <= 2.0,
                        group="NCCL model cost", value=min(times)))
    return rows
