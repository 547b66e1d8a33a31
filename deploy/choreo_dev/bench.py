"""Benchmark of the local cluster: cold build, warm start, a GPU Job, and memory.

Not a test: it prints measured values next to their targets and references so that a
regression (a slower start, a hungrier API server) is visible at a glance. The cold build
is measured when it happens (by ``choreo-dev build``) and read back from the cache.

Run with ``choreo-dev bench`` or ``python -m choreo_dev.bench``.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

from choreo.benchtable import Row, exit_code, print_rows
from choreo_dev import build, fabric, nodes, procs
from choreo_dev.cluster import Cluster, control_plane_binaries
from choreo_dev.errors import DevClusterError
from choreo_dev.versions import BINARIES, CONTROL_PLANE
from choreo_dev.workloads import gpu_job, wait_job

GIB = 1024**3
WARM_START_TARGET_S = 15.0
MEMORY_TARGET_BYTES = int(1.5 * GIB)
START_NODES = 8


def cold_build_row() -> Row:
    """Total and slowest component of the recorded builds."""
    records = [build.record(b) for b in BINARIES]
    if any(r is None for r in records):
        return Row("cold build (all binaries)", "not recorded", "fits CI (90 min)", "-", None)
    done = [r for r in records if r is not None]
    total = sum(r.seconds for r in done)
    slowest = max(done, key=lambda r: r.seconds)
    detail = f"{total / 60:.1f} min (slowest {slowest.name} {slowest.seconds:.0f} s)"
    return Row(
        "cold build (all binaries)",
        detail,
        "< 90 min (CI budget)",
        "notes: apiserver ~4.5 min, kwok ~1.5 min, helm ~1.7 min",
        total < 90 * 60,
    )


def control_plane_rss(cluster: Cluster) -> int:
    """Sum of the resident memory of every control-plane process."""
    return sum(procs.rss_bytes(rec.pid) for rec in cluster.records().values())


def run(nodes_for_memory: int = 128, console: Console | None = None) -> int:
    """Run the benchmark on a throw-away cluster and print the table."""
    # A pipe or CI log is not a terminal; give the table room instead of wrapping cells.
    console = console or Console(width=None if sys.stdout.isatty() else 150)
    rows = [cold_build_row()]
    binaries = control_plane_binaries(build_missing=True, progress=console.log)
    rows[0] = cold_build_row()
    with tempfile.TemporaryDirectory(prefix="choreo-bench-") as tmp:
        cluster = Cluster(Path(tmp) / "cluster")
        try:
            started = time.monotonic()
            cluster.up(binaries, progress=console.log)
            client = cluster.client()
            first = fabric.grid("bench-gpu", [START_NODES], 8, {})
            nodes.wait_ready(client, nodes.add(client, first))
            warm = time.monotonic() - started
            rows.append(
                Row(
                    f"warm start to API ready + {START_NODES} nodes Ready",
                    f"{warm:.1f} s",
                    f"<= {WARM_START_TARGET_S:.0f} s",
                    "issue 3 target",
                    warm <= WARM_START_TARGET_S,
                )
            )

            job_started = time.monotonic()
            client.create("/apis/batch/v1/namespaces/default/jobs", gpu_job("bench", "default"))
            outcome = wait_job(client, "bench", "default")
            job_s = time.monotonic() - job_started
            rows.append(
                Row(
                    "GPU Job create -> Complete",
                    f"{job_s:.1f} s ({outcome})",
                    "completes",
                    "notes: ~20 s on this machine kind",
                    outcome == "Complete",
                )
            )

            more = fabric.grid("bench-gpu", [nodes_for_memory], 8, {})[START_NODES:]
            names = nodes.add(client, more)
            nodes.wait_ready(client, names, timeout=180.0)
            time.sleep(10.0)  # let watch caches and informers settle after the burst
            rss = control_plane_rss(cluster)
            per = ", ".join(
                f"{name.removeprefix('kube-')} {procs.rss_bytes(rec.pid) / 2**20:.0f}M"
                for name, rec in cluster.records().items()
            )
            rows.append(
                Row(
                    f"control-plane RSS, {nodes_for_memory} fake nodes",
                    f"{rss / GIB:.2f} GiB ({per})",
                    f"<= {MEMORY_TARGET_BYTES / GIB:.1f} GiB",
                    "issue 3 target",
                    rss <= MEMORY_TARGET_BYTES,
                )
            )
        finally:
            cluster.down()
        leftover = [n for n, alive in cluster.status().items() if alive]
        if leftover:
            raise DevClusterError(f"benchmark left processes running: {', '.join(leftover)}")
    print_rows(rows, f"choreo local cluster ({', '.join(CONTROL_PLANE)})", console)
    return exit_code(rows)


def main() -> int:
    """``python -m choreo_dev.bench``."""
    try:
        return run()
    except DevClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
