"""A real Prometheus server scraping the real choreo processes, and the dashboard over it.

The operator, the synthesizer and two node agents run as host processes on 127.0.0.1 (the
operator and the agents against the session's local API server), a training job's
``choreo.telemetry`` reporter runs in this process, and Debian's ``prometheus`` scrapes them
all once a second with the scrape settings the chart's monitors use (``honor_labels``, a
``node`` label per agent). The tests then ask Prometheus's HTTP API for every metric family
the dashboard needs, run every dashboard query, and draw the dashboard to a PNG.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from choreo.collectives import Collective
from choreo.dashboard import promql
from choreo.dashboard.render import render
from choreo.generators import build
from choreo.service.client import Client, TenantRequest, build_request, open_channel
from choreo.telemetry import Reporter, bus_factor
from choreo_dev.testing import LocalCluster

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "charts/choreo/dashboards/choreo.json"
TENANT_NAMESPACE, TENANT_JOB = "team-a", "llm-pretrain"

# Every family the dashboard reads, by the component that exports it.
FAMILIES = {
    "synthesizer": ["choreo_synthesizer_requests_total",
                    "choreo_synthesizer_synthesis_duration_seconds_bucket",
                    "choreo_synthesizer_queue_depth", "choreo_synthesizer_cache_hits_total"],
    "telemetry": ["choreo_measured_busbw_bytes_per_second",
                  "choreo_measured_algbw_bytes_per_second"],
}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class HostProcess:
    """A child process with its log; stopped by its PID."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def check(self) -> None:
        if self.proc.poll() is not None:
            tail = self.log.read_text(errors="replace")[-2000:]
            raise AssertionError(f"{self.name} exited with {self.proc.returncode}:\n{tail}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


@dataclass
class Stack:
    prometheus: promql.Prometheus
    processes: list[HostProcess]
    reporter: Reporter
    targets: dict[str, list[str]]
    out_dir: Path
    extra: dict[str, Any] = field(default_factory=dict)


def start(name: str, argv: list[str], log_dir: Path,
          env: dict[str, str] | None = None) -> HostProcess:
    log = log_dir / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})}, cwd=log_dir)
    return HostProcess(name, proc, log)


def wait_until(check: Callable[[], Any], what: str, timeout: float,
               watch: list[HostProcess] = ()) -> Any:  # type: ignore[assignment]
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        for p in watch:
            p.check()
        try:
            value = check()
            if value:
                return value
        except Exception as err:
            last = err
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}"
                         + (f" (last error: {last})" if last else ""))


def http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as resp:
        return bool(resp.status == 200)


def prometheus_config(targets: dict[str, list[str]], nodes: dict[str, str]) -> dict[str, Any]:
    """Static scrape jobs mirroring the chart's ServiceMonitor/PodMonitor settings."""
    jobs = []
    for job, addrs in targets.items():
        if job == "choreo-agent":
            static = [{"targets": [a], "labels": {"node": nodes[a]}} for a in addrs]
        else:
            static = [{"targets": addrs}]
        jobs.append({"job_name": job, "honor_labels": True, "static_configs": static})
    return {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": jobs}


def synthesize_some(address: str, step: int) -> None:
    """Real requests: a new solve (duration histogram) and a repeat (a cache hit)."""
    fabric = build("ring-8")
    with open_channel(address) as channel:
        client = Client(channel)
        for size in ((step + 1) << 20, (step + 1) << 20):
            request = build_request(fabric, [TenantRequest("t", fabric.npus, "allreduce", size,
                                                           size)])
            client.synthesize(request, timeout=120)


@pytest.fixture(scope="module")
def stack(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    prometheus_bin = shutil.which("prometheus")
    if prometheus_bin is None:
        pytest.fail("the prometheus server is not installed (`make system-deps`)", pytrace=False)
    work = tmp_path_factory.mktemp("prometheus-stack")
    processes: list[HostProcess] = []
    reporter = Reporter(port=0, addr="127.0.0.1", namespace=TENANT_NAMESPACE, job=TENANT_JOB,
                        rank=0)
    try:
        grpc_port, synth_metrics = free_port(), free_port()
        synth = start("synthesizer", [sys.executable, "-m", "choreo.service", "serve",
                                      "--host", "127.0.0.1", "--port", str(grpc_port),
                                      "--metrics-port", str(synth_metrics), "--workers", "1",
                                      "--warmup-topology", ""], work)
        processes.append(synth)
        targets = {"choreo-synthesizer": [f"127.0.0.1:{synth_metrics}"],
                   "choreo-telemetry": [f"127.0.0.1:{reporter.port}"]}
        nodes: dict[str, str] = {}
        wait_until(lambda: http_ok(f"http://127.0.0.1:{synth_metrics}/metrics"),
                   "the synthesizer's metrics endpoint", 60, [synth])
        prom_port = free_port()
        config = work / "prometheus.yml"
        config.write_text(yaml.safe_dump(prometheus_config(targets, nodes)))
        prom = start("prometheus", [prometheus_bin, f"--config.file={config}",
                                    f"--storage.tsdb.path={work / 'tsdb'}",
                                    f"--web.listen-address=127.0.0.1:{prom_port}",
                                    "--storage.tsdb.retention.time=1h", "--log.level=warn"],
                     work)
        processes.append(prom)
        url = f"http://127.0.0.1:{prom_port}"
        wait_until(lambda: http_ok(f"{url}/-/ready"), "prometheus to be ready", 60, [prom])
        api = promql.Prometheus(url)
        # Prometheus hands new targets to its scrapers in batches every 5 s: traffic before
        # the first scrape would only ever be seen as a starting value, never as a rate.
        wait_until(lambda: {t["health"] for t in api_targets(api)} == {"up"},
                   "every scrape target to be up", 30, processes)
        # Traffic over a few scrapes, so rates and quantiles have two points to work with.
        for step in range(4):
            synthesize_some(f"127.0.0.1:{grpc_port}", step)
            for collective, busbw in (("allreduce", 180e9), ("allgather", 150e9)):
                seconds = (1 << 30) * bus_factor(Collective(collective), 16) / (
                    busbw * (1 - 0.05 * step))
                reporter.record(collective, 1 << 30, seconds, world_size=16)
            time.sleep(1.5)
        time.sleep(2)  # one more scrape after the last request
        yield Stack(api, processes, reporter, {**targets}, work)
    finally:
        reporter.close()
        for p in reversed(processes):
            p.stop()
        for p in processes:
            assert p.proc.poll() is not None, f"{p.name} (pid {p.proc.pid}) still runs"


def api_targets(api: promql.Prometheus) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{api.url}/api/v1/targets", timeout=5) as resp:
        import json

        return list(json.loads(resp.read())["data"]["activeTargets"])


def test_every_target_is_scraped(stack: Stack) -> None:
    jobs = {t["labels"]["job"]: t["health"] for t in api_targets(stack.prometheus)}
    assert jobs == dict.fromkeys(stack.targets, "up")


@pytest.mark.parametrize("component", sorted(FAMILIES))
def test_metric_families_present(stack: Stack, component: str) -> None:
    names = stack.prometheus.metric_names()
    missing = [f for f in FAMILIES[component] if f not in names]
    assert not missing, f"{component}: Prometheus has no {missing}"
    for family in FAMILIES[component]:
        assert stack.prometheus.query(family), f"{family}: no series"


def test_every_dashboard_query_runs(stack: Stack) -> None:
    dashboard = promql.load(DASHBOARD)
    variables = promql.default_variables(dashboard)
    queries = list(promql.targets(dashboard))
    assert len(queries) >= 12
    for t in queries:
        stack.prometheus.query(promql.expand(t.expr, variables))


def test_dashboard_renders_to_png(stack: Stack) -> None:
    dashboard = promql.load(DASHBOARD)
    out = stack.out_dir / "dashboard.png"
    data = render(dashboard, stack.prometheus, out, minutes=2, step=1)
    assert out.stat().st_size > 20_000
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) == len(promql.panels(dashboard))
    by_title = {d.title: d for d in data}
    assert by_title["Synthesis duration"].points > 0
    assert by_title["Synthesizer requests by status"].points > 0
    measured = by_title["Bus bandwidth per tenant and collective: predicted vs measured"]
    assert any(name.startswith("measured team-a/llm-pretrain allreduce") and s.values
               for name, s in measured.series)
    if copy_to := os.environ.get("CHOREO_DASHBOARD_PNG"):
        shutil.copyfile(out, copy_to)
