"""``python -m choreo_operator.bench``: the operator's benchmark on a throw-away local cluster.

Starts the control plane, ``choreo serve`` and the operator (all stopped by PID at the end),
creates 1000 fake 8-GPU nodes in one rail-optimized FabricTopology and 50 tenants (one of
64 GPUs, one of 1024 GPUs, 48 of 144), then measures:
- DeviceFailure created -> new ConfigMap written (the tenant's status names it), p50 over
  repetitions, for the 64-GPU and the 1024-GPU tenant;
- the operator's resident memory with all of that indexed and scheduled;
- a burst of 20 DeviceFailures within one second over two tenant groups: resyntheses counted.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from choreo.benchtable import Row, exit_code, print_rows
from choreo_operator import testing as T

GROUP = "/apis/choreo.dev/v1alpha1"
console = Console(highlight=False)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _wait(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
        except Exception:
            value = None
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


class Bench:
    def __init__(self, lc: Any, ns: str, metrics_port: int) -> None:
        self.lc = lc
        self.client = lc.client
        self.ns = ns
        self.metrics_port = metrics_port

    def status(self, job: str) -> dict[str, Any]:
        return dict(self.client.get(f"{GROUP}/namespaces/{self.ns}/collectivejobs/{job}")
                    .get("status") or {})

    def metric(self, name: str, **labels: str) -> float:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as resp:
            return T.metric(resp.read().decode(), name, **labels) or 0.0

    def failure(self, name: str, node: str, gpu: int) -> None:
        self.client.create(f"{GROUP}/devicefailures", {
            "apiVersion": "choreo.dev/v1alpha1", "kind": "DeviceFailure",
            "metadata": {"name": name},
            "spec": {"node": node, "device": {"type": "gpu", "gpu": gpu}, "source": "agent"}})

    def latency(self, job: str, node: str, reps: int, timeout: float) -> list[float]:
        """Seconds from DeviceFailure created to the tenant's new ConfigMap, per repetition."""
        out = []
        for r in range(reps):
            before = self.status(job).get("configMap")
            name = f"bench-{job}-{r}"
            start = time.monotonic()
            self.failure(name, node, r % 8)
            _wait(lambda b=before: self.status(job).get("configMap") not in (None, b),  # type: ignore[misc]
                  timeout, f"{job}: a new schedule")
            out.append(time.monotonic() - start)
            self.client.delete(f"{GROUP}/devicefailures/{name}")
            _wait(lambda b=before: self.status(job).get("configMap") == b  # type: ignore[misc]
                  and self.status(job).get("phase") == "Ready", timeout, f"{job}: restored")
        return out


def run(nodes: int, tenants: int, reps: int, keep: Path | None) -> list[Row]:
    from choreo_dev import build
    from choreo_dev.cluster import Cluster
    from choreo_dev.testing import LocalCluster
    from choreo_dev.versions import CONTROL_PLANE

    workdir = keep or Path(tempfile.mkdtemp(prefix="choreo-operator-bench-"))
    binaries = build.resolve((*CONTROL_PLANE, "kubectl"))
    control = Cluster(workdir / "cluster")
    synth = operator = None
    rows: list[Row] = []
    try:
        info = control.up(binaries)
        lc = LocalCluster(control, info, control.client(), binaries["kubectl"])
        for crd in T.crd_documents():
            lc.kubectl("apply", "-f", str(crd))
        lc.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
        console.print(f"creating {nodes} fake nodes ...")
        names = lc.add_nodes(nodes, gpus=8, prefix="b")
        lc.apply({"apiVersion": "choreo.dev/v1alpha1", "kind": "FabricTopology",
                  "metadata": {"name": "bench"},
                  "spec": {"nodes": [{"name": n, "position": i} for i, n in enumerate(names)],
                           "intraNode": {"preset": "dgx-h100"},
                           "interNode": {"type": "rail", "rails": 8}}})
        synth, port = T.start_synthesizer(workdir / "synth.log", workers=2)
        operator, ports = T.start_operator(workdir / "operator.log", info.kubeconfig,
                                           f"127.0.0.1:{port}", workdir / "certs",
                                           webhook=False, extra=["--timeout", "300"])
        ns = lc.create_namespace("bench")
        bench = Bench(lc, ns, ports.metrics)
        sizes = [8, 128] + [(nodes - 136) // max(tenants - 2, 1)] * (tenants - 2)
        layout: dict[str, list[str]] = {}
        at = 0
        for t, size in enumerate(sizes):
            layout[f"t{t}"] = names[at:at + size]
            at += size
        console.print(f"creating {tenants} tenants, {at} pods ...")
        for job, job_nodes in layout.items():
            lc.client.create(f"{GROUP}/namespaces/{ns}/collectivejobs", {
                "apiVersion": "choreo.dev/v1alpha1", "kind": "CollectiveJob",
                "metadata": {"name": job},
                "spec": {"selector": {"matchLabels": {"tenant": job}}, "collectives": [
                    {"name": "grads", "collective": "allreduce", "minBytes": 1 << 20,
                     "maxBytes": 1 << 28}]}})
            for rank, node in enumerate(job_nodes):
                lc.client.create(f"/api/v1/namespaces/{ns}/pods", {
                    "apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": f"{job}-{rank}", "labels": {
                        "tenant": job, "batch.kubernetes.io/job-completion-index": str(rank)}},
                    "spec": {"nodeName": node, "containers": [{
                        "name": "train", "image": "trainer", "resources": {
                            "limits": {"nvidia.com/gpu": "8"}}}]}})
        start = time.monotonic()
        _wait(lambda: all(bench.status(j).get("phase") == "Ready" for j in layout), 1800,
              "every tenant Ready", interval=2.0)
        console.print(f"all {tenants} tenants Ready after {time.monotonic() - start:.0f} s")
        rss = rss_mib(operator.pid)

        small = bench.latency("t0", layout["t0"][0], reps, 120)
        large = bench.latency("t1", layout["t1"][0], max(1, reps // 2), 600)

        before = bench.metric("choreo_resynthesis_total", reason="failure", result="ok")
        t_start = time.monotonic()
        for i in range(20):
            job = "t2" if i % 2 == 0 else "t3"
            bench.failure(f"burst-{i}", layout[job][i // 2 % len(layout[job])], i // 4 % 8)
            time.sleep(max(0.0, t_start + (i + 1) * 0.05 - time.monotonic()))
        burst_seconds = time.monotonic() - t_start
        _wait(lambda: all(bench.status(j).get("ranks") in (8 * len(layout[j]) - 10,)
                          for j in ("t2", "t3")), 300, "the burst to be handled", interval=0.2)
        time.sleep(3.0)
        counted = bench.metric("choreo_resynthesis_total", reason="failure", result="ok") - before
        stale = bench.metric("choreo_resynthesis_total", reason="failure", result="stale")

        p50_small, p50_large = statistics.median(small), statistics.median(large)
        rows = [
            Row("DeviceFailure -> new ConfigMap, 64-GPU tenant (p50)",
                f"{p50_small:.2f} s (n={len(small)}, max {max(small):.2f} s)", "<= 1 s",
                "issue 6", p50_small <= 1.0),
            Row("DeviceFailure -> new ConfigMap, 1024-GPU tenant (p50)",
                f"{p50_large:.2f} s (n={len(large)}, max {max(large):.2f} s)", "<= 5 s",
                "issue 6", p50_large <= 5.0),
            Row(f"operator RSS, {nodes} nodes x 8 GPUs, {tenants} tenants", f"{rss:.0f} MiB",
                "<= 500 MiB", "issue 6", rss <= 500),
            Row(f"burst of 20 DeviceFailures in {burst_seconds:.2f} s over 2 tenant groups",
                f"{counted:.0f} resyntheses ({stale:.0f} stale)", "2 (one per group)",
                "issue 6", counted == 2),
        ]
    finally:
        for proc in (operator, synth):
            if proc is not None:
                proc.stop()
        control.down()
    return rows


def _exit_once(*_: object) -> None:
    """Unwind into the cleanup; a second SIGTERM must not interrupt that cleanup."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit(143)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m choreo_operator.bench",
                                description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--tenants", type=int, default=50)
    p.add_argument("--reps", type=int, default=5, help="repetitions of the latency runs")
    p.add_argument("--keep", type=Path, help="work directory to keep (logs, state)")
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_once)  # run the cleanup on SIGTERM
    if args.nodes < 136 + args.tenants - 2:
        print("error: --nodes must leave at least one node per small tenant", file=sys.stderr)
        return 2
    rows = run(args.nodes, args.tenants, args.reps, args.keep)
    print_rows(rows, "choreo operator on the local control plane", console)
    return exit_code(rows)


if __name__ == "__main__":
    sys.exit(main())
