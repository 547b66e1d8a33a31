"""Starting the synthesizer and the operator as subprocesses against a local cluster.

Shared by the e2e tests and the benchmark. Every process is started with its own log file
and stopped by PID (SIGTERM, then SIGKILL), never by name.
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from choreo.service.ports import listen_port
from choreo_dev.kube import ApiException
from choreo_dev.stack import operator_argv, port_open, synthesizer_argv

GROUP = "/apis/choreo.dev/v1alpha1"

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "crds"
MANIFESTS = ROOT / "deploy" / "manifests"


def wait_port(port: int, timeout: float, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}: {tail(log)}")
        if port_open(port):
            return
        time.sleep(0.1)
    raise RuntimeError(f"port {port} did not open within {timeout:.0f} s: {tail(log)}")


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout: float = 15.0, sig: int = signal.SIGTERM) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.popen.pid, sig)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.popen.pid, signal.SIGKILL)
                self.popen.wait(10)

    def kill(self) -> None:
        self.stop(timeout=5.0, sig=signal.SIGKILL)


def spawn(name: str, argv: Sequence[str], log: Path, env: dict[str, str] | None = None) -> Proc:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        popen = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})},
                                 cwd=ROOT)
    return Proc(name, popen, log)


def start_synthesizer(log: Path, port: int | None = None, workers: int = 2) -> tuple[Proc, int]:
    """``choreo serve`` on a free loopback port, ready for requests."""
    port = port or listen_port()
    proc = spawn("synthesizer", synthesizer_argv(port, workers=workers), log)
    try:
        wait_port(port, 60.0, proc.popen, log)
    except Exception:
        proc.kill()
        raise
    return proc, port


@dataclass
class OperatorPorts:
    metrics: int
    webhook: int


def start_operator(log: Path, kubeconfig: Path, synthesizer: str, cert_dir: Path,
                   webhook: bool = True, extra: Sequence[str] = (),
                   ports: OperatorPorts | None = None) -> tuple[Proc, OperatorPorts]:
    ports = ports or OperatorPorts(listen_port(), listen_port() if webhook else 0)
    argv = operator_argv(kubeconfig, synthesizer, ports.metrics, ports.webhook, cert_dir, extra)
    proc = spawn("operator", argv, log)
    try:
        wait_port(ports.metrics, 60.0, proc.popen, log)
        if webhook:
            wait_port(ports.webhook, 60.0, proc.popen, log)
    except Exception:
        proc.kill()
        raise
    return proc, ports


def crd_documents() -> list[Path]:
    return sorted(CRDS.glob("*.yaml"))


def prepare_cluster(cluster: Any, prefix: str, webhook: str | None = None,
                    nodes: int = 2) -> tuple[list[str], str]:
    """What an operator test starts from: the CRDs established, the webhook registered (if
    named), ``nodes`` DGX-H100 nodes in a rail FabricTopology named ``prefix``, and a fresh
    namespace. The nodes' names and the namespace."""
    for crd in crd_documents():
        cluster.kubectl("apply", "-f", str(crd))
    cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
    if webhook is not None:
        cluster.apply(webhook_manifest(webhook))
    names = cluster.add_nodes(nodes, gpus=8, prefix=prefix)
    ns = cluster.create_namespace(prefix)
    cluster.apply(rail_fabric(prefix, names))
    return names, ns


def collective_job(name: str, collective: str = "allreduce", min_bytes: int = 1 << 20,
                   max_bytes: int = 1 << 26) -> dict[str, Any]:
    """A CollectiveJob ``name`` of one collective, selecting pods labelled ``tenant=name``."""
    return {"apiVersion": "choreo.dev/v1alpha1", "kind": "CollectiveJob",
            "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": {"tenant": name}},
                     "collectives": [{"name": "grads", "collective": collective,
                                      "minBytes": min_bytes, "maxBytes": max_bytes}]}}


def webhook_manifest(name: str = "choreo-operator") -> dict[str, object]:
    """The MutatingWebhookConfiguration from deploy/manifests with ``name``."""
    doc = yaml.safe_load((MANIFESTS / "operator-webhook.yaml").read_text())
    doc["metadata"]["name"] = name
    return dict(doc)


def metric(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in Prometheus text format, or None."""
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        if head.split("{")[0] != name:
            continue
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            return float(value)
    return None


def rail_fabric(name: str, nodes: Sequence[str], rails: int = 1) -> dict[str, Any]:
    """A FabricTopology of DGX-H100 ``nodes`` in rank order on ``rails`` rails."""
    return {"apiVersion": "choreo.dev/v1alpha1", "kind": "FabricTopology",
            "metadata": {"name": name},
            "spec": {"nodes": [{"name": n, "position": i} for i, n in enumerate(nodes)],
                     "intraNode": {"preset": "dgx-h100"},
                     "interNode": {"type": "rail", "rails": rails}}}


def tenant_pod(name: str, node: str, tenant: str, rank: int, gpus: int = 8) -> dict[str, Any]:
    """A training pod of ``tenant`` on ``node``, holding ``gpus`` GPUs as indexed rank ``rank``."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {
                "tenant": tenant, "batch.kubernetes.io/job-completion-index": str(rank)}},
            "spec": {"nodeName": node, "containers": [{
                "name": "train", "image": "trainer:latest",
                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


def project_config_map(cm: dict[str, Any], items: list[dict[str, str]], root: Path) -> None:
    """What the kubelet writes for a ConfigMap volume with ``items``: a dated copy of the
    listed keys, ``..data`` pointing at it and each top-level entry linked through it."""
    copy = root / "..2026_11_27_00_00_00.000000001"
    for item in items:
        key = item["key"]
        body = (base64.b64decode(cm["binaryData"][key]) if key in cm.get("binaryData", {})
                else cm["data"][key].encode() if key in cm["data"] else None)
        if body is not None:
            (copy / item["path"]).parent.mkdir(parents=True, exist_ok=True)
            (copy / item["path"]).write_bytes(body)
    (root / "..data").symlink_to(copy.name)
    for top in os.listdir(copy):
        (root / top).symlink_to(f"..data/{top}")


@dataclass
class Namespace:
    """A test's namespace on the local cluster: its CollectiveJobs' status, its ConfigMaps."""

    cluster: Any  # choreo_dev.testing.LocalCluster
    ns: str

    def status(self, job: str) -> dict[str, Any]:
        return dict(self.cluster.client.get(
            f"{GROUP}/namespaces/{self.ns}/collectivejobs/{job}").get("status") or {})

    def configmap(self, name: str) -> dict[str, Any]:
        return dict(self.cluster.client.get(f"/api/v1/namespaces/{self.ns}/configmaps/{name}"))


@contextlib.contextmanager
def operator_stack(cluster: Any, logs: Path, prefix: str, webhook: str,
                   extra: Sequence[str] = ()) -> Iterator[tuple[list[str], str, Proc]]:
    """A test's stack: the cluster prepared (``prepare_cluster``), a synthesizer and an
    operator serving webhook ``webhook`` (with ``extra`` flags); its nodes, namespace and
    operator. On exit both are stopped by PID and the fabric and webhook deleted."""
    nodes, ns = prepare_cluster(cluster, prefix, webhook=webhook)
    synth, port = start_synthesizer(logs / "synth.log")
    procs = [synth]
    try:
        operator, _ = start_operator(
            logs / "operator.log", cluster.info.kubeconfig, f"127.0.0.1:{port}", logs / "certs",
            extra=["--webhook-config", webhook, "--debounce", "0.2", *extra])
        procs.append(operator)
        yield nodes, ns, operator
    finally:
        tear_down(cluster, procs, prefix, webhook)


def tear_down(cluster: Any, procs: Sequence[Proc], fabric: str, webhook: str) -> None:
    """Stop ``procs`` by PID, then delete the test's FabricTopology and its webhook's
    configuration (either may be gone already)."""
    for proc in procs:
        proc.stop()
    for path in (f"{GROUP}/fabrictopologies/{fabric}",
                 f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{webhook}"):
        with contextlib.suppress(ApiException):
            cluster.client.delete(path)
    assert not any(proc.alive() for proc in procs)
