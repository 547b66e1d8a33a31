"""Bringing the local control plane up, reporting on it, and taking it down again.

Order matters: etcd first, then the API server, then the clients that need it
(controller-manager, scheduler, kwok). `up` waits until the API server is ready and the
controller-manager has created the ``default`` ServiceAccount, which is the earliest
moment a Pod can be admitted. Any failure during `up` stops what was already started.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from choreo_dev import build, config, pki, procs
from choreo_dev.errors import DevClusterError, with_tail
from choreo_dev.kube import KubeClient, wait_for
from choreo_dev.layout import Layout
from choreo_dev.logs import tail
from choreo_dev.ports import HOST, PORT_NAMES, choose_ports
from choreo_dev.versions import CONTROL_PLANE, KWOK_STAGE_FILES, binary

ETCD_TIMEOUT = 30.0
APISERVER_TIMEOUT = 120.0
SERVICE_ACCOUNT_TIMEOUT = 90.0
# Components that must stay up for `up` to succeed, once started.
CLIENTS: tuple[str, ...] = ("kube-controller-manager", "kube-scheduler", "kwok")

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    """Progress sink for callers that do not want any output."""


@dataclass
class ClusterInfo:
    """What a client needs to reach a running cluster."""

    state_dir: Path
    server: str
    kubeconfig: Path
    ports: dict[str, int]
    pids: dict[str, int] = field(default_factory=dict)

    def env_lines(self) -> list[str]:
        """Shell lines that point kubectl (and choreo) at this cluster."""
        return [f"export KUBECONFIG={self.kubeconfig}"]


def early_exit_message(name: str, code: int | None, log_path: Path) -> str:
    """Explain a component that died during start, with a hint for the usual causes."""
    lines = tail(log_path)
    text = "\n".join(lines).lower()
    message = f"{name} exited early (exit code {code}); full log: {log_path}"
    if "address already in use" in text or "bind: address" in text:
        message += "\nits port was taken by another process after it was chosen; run `up` again"
    return with_tail(message, f"last lines of the {name} log", lines)


class Cluster:
    """One local cluster, identified by its state directory."""

    def __init__(self, state_dir: Path, node_lease_seconds: int = config.NODE_LEASE_SECONDS
                 ) -> None:
        self.layout = Layout(state_dir.resolve())
        self.node_lease_seconds = node_lease_seconds
        self._children: dict[str, subprocess.Popen[bytes]] = {}

    # ---- queries ---------------------------------------------------------------------------
    def records(self) -> dict[str, procs.ProcRecord]:
        """Process records of every component that has one."""
        found = {}
        for name in CONTROL_PLANE:
            rec = procs.read(self.layout.run, name)
            if rec is not None:
                found[name] = rec
        return found

    def status(self) -> dict[str, bool]:
        """For each component: is it running (by recorded PID and start time)?"""
        recs = self.records()
        return {name: name in recs and procs.is_alive(recs[name]) for name in CONTROL_PLANE}

    def info(self) -> ClusterInfo:
        """Connection details of the last start; fails if the cluster was never started."""
        try:
            data = json.loads(self.layout.info.read_text())
        except FileNotFoundError:
            raise DevClusterError(
                f"no cluster in {self.layout.root}; start one with `choreo-dev cluster up`"
            ) from None
        ports = {k: int(v) for k, v in data["ports"].items()}
        pids = {name: rec.pid for name, rec in self.records().items()}
        return ClusterInfo(
            self.layout.root, config.server_url(ports), self.layout.kubeconfig, ports, pids
        )

    def client(self) -> KubeClient:
        """REST client for the running cluster, authenticated as the admin."""
        info = self.info()
        token = self.layout.token.read_text().strip()
        return KubeClient.with_token(info.server, token, self.layout.ca_cert)

    def require_running(self) -> ClusterInfo:
        """Connection details, or an error naming the components that are down."""
        state = self.status()
        down = [name for name, alive in state.items() if not alive]
        if down:
            raise DevClusterError(
                f"the local cluster in {self.layout.root} is not running "
                f"(down: {', '.join(down)}); start it with `choreo-dev cluster up`"
            )
        return self.info()

    # ---- lifecycle -------------------------------------------------------------------------
    def up(
        self,
        binaries: Mapping[str, Path],
        requested_ports: Mapping[str, int] | None = None,
        progress: Progress = _quiet,
    ) -> ClusterInfo:
        """Start every component and wait until the cluster accepts workloads."""
        state = self.status()
        if all(state.values()):
            progress(f"cluster in {self.layout.root} is already running")
            return self.info()
        if any(state.values()):
            running = ", ".join(n for n, alive in state.items() if alive)
            raise DevClusterError(
                f"the cluster in {self.layout.root} is partly running ({running}); "
                "run `choreo-dev cluster down` first"
            )
        try:
            return self._start(binaries, requested_ports or {}, progress)
        except BaseException:
            self.down()
            raise

    def _previous_ports(self) -> dict[str, int]:
        try:
            return {k: int(v) for k, v in json.loads(self.layout.info.read_text())["ports"].items()}
        except (FileNotFoundError, KeyError, ValueError):
            return {}

    def _prepare(self, ports: Mapping[str, int], stage_dir: Path) -> str:
        """Write PKI, kubeconfig and kwok config; return the admin token."""
        layout = self.layout
        for directory in (layout.root, layout.logs, layout.run, layout.etcd_data):
            directory.mkdir(parents=True, exist_ok=True)
        layout.etcd_data.chmod(0o700)
        token = pki.ensure(layout)
        layout.kubeconfig.write_text(
            config.render_kubeconfig(config.server_url(ports), layout.ca_cert.read_bytes(), token)
        )
        layout.kubeconfig.chmod(0o600)
        stages = config.read_stage_files(stage_dir, KWOK_STAGE_FILES)
        layout.kwok_config.write_text(config.render_kwok_stages(stages))
        return token

    def _launch(self, name: str, exe: Path, ports: Mapping[str, int]) -> None:
        argv = [str(exe), *config.component_args(name, self.layout, ports,
                                                 self.node_lease_seconds)]
        log = self.layout.log(name)
        log.write_text("")
        self._children[name] = procs.start(name, argv, log, self.layout.run)

    def _watchdog(self) -> None:
        """Raise if any component started so far has exited."""
        for name, proc in self._children.items():
            code = proc.poll()
            if code is not None:
                raise DevClusterError(early_exit_message(name, code, self.layout.log(name)))

    def _start(
        self, binaries: Mapping[str, Path], requested: Mapping[str, int], progress: Progress
    ) -> ClusterInfo:
        started = time.monotonic()
        self._children = {}
        ports = choose_ports(PORT_NAMES, requested, self._previous_ports())
        # The stage files travel with the cached kwok binary (see build.copy_kwok_stages).
        token = self._prepare(ports, binaries["kwok"].parent / "stages")
        layout = self.layout

        progress(f"starting etcd on {HOST}:{ports['etcd-client']}")
        self._launch("etcd", binaries["etcd"], ports)
        health = f"http://{HOST}:{ports['etcd-client']}/health"
        wait_for(lambda: _etcd_healthy(health), ETCD_TIMEOUT, "etcd", watchdog=self._watchdog)

        progress(f"starting kube-apiserver on {HOST}:{ports['kube-apiserver']}")
        self._launch("kube-apiserver", binaries["kube-apiserver"], ports)
        client = KubeClient.with_token(config.server_url(ports), token, layout.ca_cert)
        wait_for(client.ready, APISERVER_TIMEOUT, "kube-apiserver /readyz", watchdog=self._watchdog)

        for name in CLIENTS:
            self._launch(name, binaries[name], ports)
        progress("started kube-controller-manager, kube-scheduler and kwok")
        wait_for(
            lambda: client.exists("/api/v1/namespaces/default/serviceaccounts/default"),
            SERVICE_ACCOUNT_TIMEOUT,
            "the default ServiceAccount (created by kube-controller-manager)",
            watchdog=self._watchdog,
        )
        self._watchdog()
        layout.info.write_text(
            json.dumps(
                {
                    "ports": ports,
                    "versions": {n: binary(n).version for n in CONTROL_PLANE},
                    "started_in_seconds": round(time.monotonic() - started, 2),
                },
                indent=2,
            )
        )
        progress(f"cluster ready in {time.monotonic() - started:.1f} s")
        return self.info()

    def down(self) -> list[procs.ProcRecord]:
        """Stop every component by PID, clients first so they do not log etcd errors."""
        order = [*reversed(CLIENTS), "kube-apiserver", "etcd"]
        stopped = procs.stop_all(self.layout.run, order)
        for proc in self._children.values():
            proc.poll()
        self._children = {}
        return stopped

    def restart(self, name: str, timeout: float = APISERVER_TIMEOUT) -> int:
        """Stop one component by PID and start it again with the same flags (so the same
        ports and state), as a crash and a supervisor's restart would; returns the new PID.
        For the API server, waits until it is ready again."""
        rec = procs.read(self.layout.run, name)
        if rec is None:
            raise DevClusterError(f"{name} is not running in {self.layout.root}")
        procs.stop(rec)
        proc = procs.start(name, rec.argv, Path(rec.log), self.layout.run)
        self._children[name] = proc
        if name == "kube-apiserver":
            client = self.client()
            wait_for(client.ready, timeout, "kube-apiserver /readyz after its restart",
                     watchdog=self._watchdog)
        return proc.pid

    def wipe(self) -> None:
        """Stop the cluster and delete its state directory."""
        self.down()
        shutil.rmtree(self.layout.root, ignore_errors=True)


def _etcd_healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as resp:
            return bool(json.loads(resp.read()).get("health") == "true")
    except (OSError, ValueError):
        return False


def control_plane_binaries(build_missing: bool, progress: Progress = print) -> dict[str, Path]:
    """Paths of the control-plane binaries, building missing ones if allowed."""
    names = list(CONTROL_PLANE)
    if build_missing:
        return build.ensure(names, progress)
    return build.resolve(names)
