"""choreo's own processes on the host, next to a local control plane: started, watched, stopped.

Without a container runtime the chart's pods never run their images, so the operator, the
synthesizer, the node agents (sim backend) and a Prometheus server run as host processes on
127.0.0.1 against the local API server, exactly as the e2e tests run them. Each one is
recorded like a control-plane component (PID plus kernel start time in ``run/``), so it can
be stopped by PID later, even by another command after ``choreo-dev demo --keep``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from choreo_dev import procs
from choreo_dev.errors import DevClusterError, with_tail
from choreo_dev.kube import wait_for
from choreo_dev.logs import tail

HOST = "127.0.0.1"


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex((HOST, port)) == 0


# ---- command lines (shared with the e2e tests) -----------------------------------------------


def synthesizer_argv(port: int, metrics_port: int = -1, workers: int = 2) -> list[str]:
    """``choreo serve`` on loopback without a warm-up, with a short shutdown grace.

    Workers run at the server's priority here. In a cluster the synthesizer's container is a
    cgroup of its own, so the workers' default niceness ranks them only below their own
    server; on one machine it would rank them below the API server, etcd and kwok as well,
    which no deployment does."""
    return [sys.executable, "-m", "choreo.service", "serve", "--host", HOST, "--port", str(port),
            "--metrics-port", str(metrics_port), "--workers", str(workers),
            "--warmup-topology", "", "--grace", "2", "--worker-nice", "0"]


def operator_argv(kubeconfig: Path, synthesizer: str, metrics_port: int, webhook_port: int,
                  cert_dir: Path, extra: Sequence[str] = ()) -> list[str]:
    """``choreo operator`` against the local API server; ``webhook_port`` 0 disables it."""
    return [sys.executable, "-m", "choreo_operator", "--kubeconfig", str(kubeconfig),
            "--synthesizer", synthesizer, "--metrics-port", str(metrics_port),
            "--metrics-addr", HOST, "--webhook-port", str(webhook_port),
            "--webhook-cert-dir", str(cert_dir), *extra]


@dataclass(frozen=True)
class AgentOptions:
    """How a simulated node agent runs; the defaults make faults show up within a second."""

    fabric: str
    namespace: str
    poll: float = 0.25
    recover_after: float = 1.0
    interval: float = 600.0
    seed: int = 0


def agent_argv(node: str, position: int, kubeconfig: Path, options: AgentOptions,
               metrics_port: int = -1, script: Path | None = None,
               pod: tuple[str, str] | None = None) -> list[str]:
    """``choreo agent --backend sim`` for one fake node; ``pod`` (namespace, name) owns its
    NodeFabric, as the DaemonSet pod would."""
    argv = [sys.executable, "-m", "choreo_agents", "--backend", "sim", "--node", node,
            "--fabric", options.fabric, "--fabric-node", str(position),
            "--namespace", options.namespace, "--kubeconfig", str(kubeconfig),
            "--stagger", "0", "--poll", str(options.poll),
            "--recover-after", str(options.recover_after), "--interval", str(options.interval),
            "--seed", str(options.seed), "--metrics-port", str(metrics_port),
            "--metrics-address", HOST]
    if script is not None:
        argv += ["--script", str(script)]
    if pod is not None:
        argv += ["--pod-namespace", pod[0], "--pod-name", pod[1]]
    return argv


def prometheus_config(targets: Mapping[str, Sequence[str]], interval: str = "1s") -> dict[str, Any]:
    """Static scrape jobs with the chart's monitor settings (tenant labels honoured)."""
    jobs = [{"job_name": job, "honor_labels": True, "static_configs": [{"targets": list(addrs)}]}
            for job, addrs in targets.items()]
    return {"global": {"scrape_interval": interval, "evaluation_interval": interval},
            "scrape_configs": jobs}


def prometheus_argv(binary: str, config: Path, data: Path, port: int) -> list[str]:
    return [binary, f"--config.file={config}", f"--storage.tsdb.path={data}",
            f"--web.listen-address={HOST}:{port}", "--storage.tsdb.retention.time=1d",
            "--log.level=warn"]


# ---- the processes ---------------------------------------------------------------------------


class HostStack:
    """Named host processes under ``root`` (``logs/<name>.log``, ``run/<name>.json``)."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.logs = self.root / "logs"
        self.run = self.root / "run"

    def log(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def start(self, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None,
              cwd: Path | None = None) -> int:
        """Start ``argv`` in its own session (so it can outlive this process); return its PID."""
        if (rec := procs.read(self.run, name)) is not None and procs.is_alive(rec):
            raise DevClusterError(f"{name} already runs (pid {rec.pid}); stop it first")
        self.logs.mkdir(parents=True, exist_ok=True)
        return procs.start(name, argv, self.log(name), self.run, env=env, cwd=cwd).pid

    def names(self) -> list[str]:
        return sorted(p.stem for p in self.run.glob("*.json")) if self.run.is_dir() else []

    def record(self, name: str) -> procs.ProcRecord | None:
        return procs.read(self.run, name)

    def pid(self, name: str) -> int:
        rec = self.record(name)
        if rec is None:
            raise DevClusterError(f"{name} was never started")
        return rec.pid

    def alive(self, name: str) -> bool:
        rec = self.record(name)
        return rec is not None and procs.is_alive(rec)

    def check(self, names: Sequence[str] | None = None) -> None:
        """Raise, quoting its log, if any of the processes has exited."""
        for name in names if names is not None else self.names():
            rec = self.record(name)
            if rec is not None and not procs.is_alive(rec):
                with contextlib.suppress(ChildProcessError, OSError):
                    os.waitpid(rec.pid, os.WNOHANG)
                raise DevClusterError(with_tail(f"{name} (pid {rec.pid}) exited; log "
                                                f"{self.log(name)}", "last lines",
                                                tail(self.log(name))))

    def wait_port(self, name: str, port: int, timeout: float = 60.0) -> None:
        wait_for(lambda: port_open(port), timeout, f"{name} to listen on {HOST}:{port}",
                 interval=0.1, watchdog=lambda: self.check([name]))

    def stop(self, name: str, sig: int = signal.SIGTERM) -> None:
        """Stop one process by PID: ``sig`` (SIGKILL for a crash), then SIGKILL after 10 s."""
        rec = self.record(name)
        if rec is None:
            return
        if sig == signal.SIGKILL and procs.is_alive(rec):
            # a crash takes the whole process: its worker children die with it
            for pid in reversed(procs.process_tree(rec.pid)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        procs.stop(rec)
        procs.record_path(self.run, name).unlink(missing_ok=True)

    def stop_all(self) -> list[procs.ProcRecord]:
        """Stop everything recorded, agents and Prometheus first, the synthesizer last."""
        order = sorted(self.names(), key=lambda n: (n == "synthesizer", n == "operator", n))
        return procs.stop_all(self.run, order)

    def rss_bytes(self, name: str) -> int:
        """Resident memory of the process and its children (the synthesizer's workers)."""
        rec = self.record(name)
        if rec is None or not procs.is_alive(rec):
            return 0
        return sum(procs.rss_bytes(pid) for pid in procs.process_tree(rec.pid))
