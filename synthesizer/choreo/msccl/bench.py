"""``python -m choreo.msccl.bench``: MSCCL lowering speed and file sizes, against targets.

Rows: lowering + validation time of a 64-GPU AllReduce (target <= 1 s), the interpreter's
time for the same file, and file sizes per GPU count with the largest per-node split file
against the 1 MiB ConfigMap limit. Each row names its program's step count: the schedule is
whatever ``synthesize`` picks for the fabric, and every time here grows with it.
"""

from __future__ import annotations

import argparse
import time

from choreo.benchtable import Row, exit_code, print_rows
from choreo.collectives import Collective, Demand
from choreo.generators import build
from choreo.msccl.api import to_xml
from choreo.msccl.interpret import run
from choreo.msccl.split import MAX_CONFIGMAP_BYTES, split_per_node
from choreo.msccl.validate import validate
from choreo.schedule import Schedule
from choreo.synth import SynthOptions, synthesize

GPUS_PER_NODE = 8


def _schedule(topology: str, chunks: int) -> Schedule:
    fabric = build(topology)
    demand = Demand(Collective.ALLREDUCE, tuple(fabric.npus), 1 << 30, chunks)
    return synthesize(fabric, [demand], SynthOptions(restarts=1, relay=False))


def speed_rows(topologies: list[str], chunks: tuple[int, ...]) -> list[Row]:
    rows = []
    for topo in topologies:
        for c in chunks:
            sched = _schedule(topo, c)
            started = time.perf_counter()
            xml = to_xml(sched)
            lowered = time.perf_counter()
            problems = validate(xml)
            checked = time.perf_counter()
            result = run(xml)
            ran = time.perf_counter()
            total = checked - started
            target = c == 1
            steps = xml.count("<step ")
            rows.append(Row(
                f"{topo} allreduce, {c} chunk(s)/piece, {steps:,} steps: "
                f"lower {lowered - started:.3f} s + "
                f"validate {checked - lowered:.3f} s", f"{total:.3f} s",
                "<= 1 s" if target else "(info)", "issue 4: 64-GPU AllReduce",
                (total <= 1.0 and not problems) if target else None))
            rows.append(Row(f"{topo} allreduce, {c} chunk(s)/piece: interpret (both modes)",
                            f"{ran - checked:.3f} s", "(info)",
                            "ok" if result.ok else "FAILED", result.ok))
    return rows


def size_rows(counts: tuple[int, ...]) -> list[Row]:
    rows = []
    for n in counts:
        xml = to_xml(_schedule(f"3d-rfs-{n}", 1))
        size = len(xml.encode())
        nodes = [f"node{r // GPUS_PER_NODE}" for r in range(n)]
        parts = split_per_node(xml, nodes)
        largest = max(len(p.encode()) for p in parts.values())
        rows.append(Row(f"3d-rfs-{n} allreduce file ({n} GPUs)", f"{size / 1024:.0f} KiB",
                        "<= 1024 KiB or split", "ConfigMap limit 1 MiB",
                        size <= MAX_CONFIGMAP_BYTES or largest <= MAX_CONFIGMAP_BYTES))
        rows.append(Row(f"  largest per-node file ({len(parts)} nodes of {GPUS_PER_NODE})",
                        f"{largest / 1024:.0f} KiB", "<= 1024 KiB", "ConfigMap limit 1 MiB",
                        largest <= MAX_CONFIGMAP_BYTES))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m choreo.msccl.bench", description=__doc__)
    p.add_argument("--quick", action="store_true", help="one topology, sizes up to 64 GPUs")
    args = p.parse_args(argv)
    topologies = ["3d-rfs-64"] if args.quick else ["3d-rfs-64", "torus-8x8", "dgx-h100-8"]
    counts = (8, 16, 32, 64) if args.quick else (8, 16, 32, 64, 128)
    rows = speed_rows(topologies, (1,) if args.quick else (1, 2)) + size_rows(counts)
    print_rows(rows, "choreo MSCCL lowering benchmark (executor dialect)")
    return exit_code(rows)


if __name__ == "__main__":
    raise SystemExit(main())
