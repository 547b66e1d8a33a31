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
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from choreo.collectives import Collective
from choreo.generators import build
from choreo.service.client import Client, TenantRequest, build_request, open_channel
from choreo.service.ports import listen_port
from choreo.telemetry import Reporter, bus_factor
from choreo_dev.dashboard import promql
from choreo_dev.dashboard.render import render
from choreo_dev.stack import (
    AgentOptions,
    agent_argv,
    operator_argv,
    prometheus_argv,
    prometheus_config,
    synthesizer_argv,
)
from choreo_dev.testing import LocalCluster

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "charts/choreo/dashboards/choreo.json"

JOB, COLLECTIVE = "llm-pretrain", "grads"
GROUP = "/apis/choreo.dev/v1alpha1"

# Every family the dashboard reads, by the component that exports it.
FAMILIES = {
    "synthesizer": ["choreo_synthesizer_requests_total",
                    "choreo_synthesizer_synthesis_duration_seconds_bucket",
                    "choreo_synthesizer_queue_depth", "choreo_synthesizer_cache_hits_total"],
    "operator": ["choreo_tenant_predicted_busbw_bytes_per_second",
                 "choreo_tenant_bound_fraction", "choreo_tenant_predicted_speedup_vs_nccl",
                 "choreo_tenant_size_ranges", "choreo_resynthesis_total",
                 "choreo_resynthesis_latency_seconds_bucket", "choreo_tenants"],
    "agent": ["choreo_link_alpha_seconds", "choreo_link_bandwidth_bytes_per_second",
              "choreo_link_healthy", "choreo_probe_duration_seconds_bucket"],
    "telemetry": ["choreo_measured_busbw_bytes_per_second",
                  "choreo_measured_algbw_bytes_per_second"],
}


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


def tenant(cluster: LocalCluster, ns: str, nodes: list[str]) -> None:
    """A fabric over ``nodes`` and a CollectiveJob with one 4-GPU pod on each of them."""
    cluster.apply({"apiVersion": "choreo.dev/v1alpha1", "kind": "FabricTopology",
                   "metadata": {"name": ns},
                   "spec": {"nodes": [{"name": n, "position": i} for i, n in enumerate(nodes)],
                            "intraNode": {"preset": "dgx-h100"},
                            "interNode": {"type": "rail", "rails": 1}}})
    cluster.apply({"apiVersion": "choreo.dev/v1alpha1", "kind": "CollectiveJob",
                   "metadata": {"name": JOB, "namespace": ns},
                   "spec": {"selector": {"matchLabels": {"tenant": JOB}},
                            "collectives": [{"name": COLLECTIVE, "collective": "allreduce",
                                             "minBytes": 1 << 20, "maxBytes": 1 << 26}]}})
    for rank, node in enumerate(nodes):
        cluster.apply({"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": f"{JOB}-{rank}", "namespace": ns, "labels": {
                           "tenant": JOB, "batch.kubernetes.io/job-completion-index": str(rank)}},
                       "spec": {"nodeName": node, "containers": [{
                           "name": "train", "image": "trainer:latest",
                           "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}})


def synthesize_some(address: str, step: int) -> None:
    """Real requests: a new solve (duration histogram) and a repeat (a cache hit)."""
    fabric = build("ring-8")
    with open_channel(address) as channel:
        client = Client(channel)
        for size in ((step + 1) << 20, (step + 1) << 20):
            request = build_request(fabric, [TenantRequest.one("t", fabric.npus, "allreduce",
                                                               size, size)])
            client.synthesize(request, timeout=120)


@pytest.fixture(scope="module")
def stack(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    prometheus_bin = shutil.which("prometheus")
    if prometheus_bin is None:
        pytest.fail("the prometheus server is not installed (`make system-deps`)", pytrace=False)
    work = tmp_path_factory.mktemp("prometheus-stack")
    for crd in sorted((ROOT / "crds").glob("*.yaml")):
        name = yaml.safe_load(crd.read_text())["metadata"]["name"]
        # Installed already (by the chart test's Helm release, say): leave it as it is.
        if not cluster.client.exists(f"/apis/apiextensions.k8s.io/v1/"
                                     f"customresourcedefinitions/{name}"):
            cluster.apply(crd)
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
    nodes = cluster.add_nodes(2, gpus=8, prefix="prom")
    ns = cluster.create_namespace("prom")
    processes: list[HostProcess] = []
    reporter = Reporter(port=0, addr="127.0.0.1", namespace=ns, job=JOB, rank=0)
    # A link of the first node goes down for a while: a DeviceFailure, an unhealthy link,
    # and a resynthesis around it, then recovery.
    faults = work / "faults.yaml"
    faults.write_text("events:\n  - {at: 8s, link-down: [1, sw-nvswitch]}\n"
                      "  - {at: 40s, link-up: [1, sw-nvswitch]}\n")
    try:
        grpc_port, ports = listen_port(), {k: listen_port() for k in
                                         ("synthesizer", "operator", "agent-0", "agent-1")}
        processes.append(start("synthesizer", synthesizer_argv(
            grpc_port, ports["synthesizer"], workers=2), work))
        processes.append(start("operator", operator_argv(
            cluster.info.kubeconfig, f"127.0.0.1:{grpc_port}", ports["operator"], listen_port(),
            work / "certs", ["--webhook-config", ""]), work))
        options = AgentOptions(fabric="dgx-h100-2", namespace=ns, poll=0.25, recover_after=1)
        for i, node in enumerate(nodes):
            processes.append(start(f"agent-{i}", [*agent_argv(
                node, i, cluster.info.kubeconfig, options, ports[f"agent-{i}"],
                faults if i == 0 else None), "--duration", "300"], work))
        targets = {"choreo-synthesizer": [f"127.0.0.1:{ports['synthesizer']}"],
                   "choreo-operator": [f"127.0.0.1:{ports['operator']}"],
                   "choreo-agent": [f"127.0.0.1:{ports['agent-0']}",
                                    f"127.0.0.1:{ports['agent-1']}"],
                   "choreo-telemetry": [f"127.0.0.1:{reporter.port}"]}
        prom_port = listen_port()
        config = work / "prometheus.yml"
        config.write_text(yaml.safe_dump(prometheus_config(targets)))
        processes.append(start("prometheus", prometheus_argv(
            prometheus_bin, config, work / "tsdb", prom_port), work))
        url = f"http://127.0.0.1:{prom_port}"
        wait_until(lambda: http_ok(f"{url}/-/ready"), "prometheus to be ready", 60, processes)
        api = promql.Prometheus(url)
        # Prometheus hands new targets to its scrapers in batches every 5 s: traffic before
        # the first scrape would only ever be seen as a starting value, never as a rate.
        wait_until(lambda: {t["health"] for t in api_targets(api)} == {"up"},
                   "every scrape target to be up", 60, processes)
        tenant(cluster, ns, nodes)
        job_path = f"{GROUP}/namespaces/{ns}/collectivejobs/{JOB}"
        wait_until(lambda: cluster.client.get(job_path).get("status", {}).get("phase")
                   == "Ready", "the CollectiveJob to be Ready", 90, processes)
        # The training job measures its all-reduce a little below the prediction, and the
        # synthesizer answers some direct requests, over a few scrapes.
        factor = bus_factor(Collective.ALLREDUCE, 8)
        for step in range(10):
            # The prediction changes as agents publish measured fabrics: track the current one.
            predicted = cluster.client.get(job_path)["status"]["collectives"][0][
                "predictedBusBandwidthBytesPerSecond"]
            synthesize_some(f"127.0.0.1:{grpc_port}", step)
            busbw = predicted * (0.9 - 0.02 * (step % 3))
            reporter.record("allreduce", 1 << 26, (1 << 26) * factor / busbw, world_size=8,
                            name=COLLECTIVE)
            time.sleep(1.0)
        wait_until(lambda: api.query("min_over_time(choreo_link_healthy[5m]) == 0"),
                   "an unhealthy link in Prometheus", 30, processes)
        wait_until(lambda: api.query('sum(choreo_resynthesis_total) >= 2'),
                   "a resynthesis after the link failure", 60, processes)
        time.sleep(2)  # one more scrape
        yield Stack(api, processes, reporter, targets, work, {"namespace": ns})
    finally:
        reporter.close()
        for p in reversed(processes):
            p.stop()
        for path in (f"{GROUP}/fabrictopologies/{ns}",):
            if cluster.client.exists(path):
                cluster.client.delete(path)
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
    ns = stack.extra["namespace"]
    bandwidth = by_title["Bus bandwidth per tenant and collective: predicted vs measured"]
    for kind in ("predicted", "measured"):
        assert any(name == f"{kind} {ns}/{JOB} {COLLECTIVE}" and s.values
                   for name, s in bandwidth.series), (kind, [n for n, _ in bandwidth.series])
    ratio = by_title["Measured / predicted bus bandwidth"]
    # Measured runs at 86-90% of the prediction once both have been scraped.
    assert ratio.series and all(0.8 < s.values[-1] < 0.95 for _, s in ratio.series), [
        s.values for _, s in ratio.series]
    for title in ("Predicted speedup vs NCCL as it runs", "Size ranges left to NCCL",
                  "Fraction of the lower bound", "Resynthesis events by reason",
                  "Failure to new schedule latency", "Link latency α per node",
                  "Link bandwidth 1/β per node", "Unhealthy links per node"):
        assert by_title[title].points > 0, title
    if copy_to := os.environ.get("CHOREO_DASHBOARD_PNG"):
        shutil.copyfile(out, copy_to)
