"""Wires the agent together from command-line arguments and runs it until stopped.

Only problems a user must fix (a bad fault script, an unknown fabric, missing --node)
end the process, with one ``error:`` line and exit status 2. Everything that can heal on
its own (no driver yet, NVML failing, API server down) is retried inside the loop.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

from choreo.settings import SettingsError, from_arguments
from choreo_agents.backends import Backend, BackendError
from choreo_agents.config import AgentConfig
from choreo_api.kube import CALL_ERRORS, ConfigException, Kube, describe

log = logging.getLogger("choreo_agents")

FABRIC_INDEX_LABEL = "choreo.dev/fabric-index"


class UsageError(Exception):
    """A problem with the command line or its input files."""


def run(namespace: argparse.Namespace) -> int:
    try:
        args = from_arguments(AgentConfig, namespace)
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format=f"%(asctime)s %(levelname)s agent[{args.node or '?'}] %(message)s",
        stream=sys.stderr,
    )
    try:
        return _run(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _run(args: AgentConfig) -> int:
    from choreo_agents.agent import Agent, Settings
    from choreo_agents.metrics import AgentMetrics, MetricsServer
    from choreo_agents.publisher import Publisher
    from choreo_agents.watch import RequestWatcher

    if not args.node:
        raise UsageError("--node is required (or set NODE_NAME, e.g. from spec.nodeName)")
    api = _api(args.kubeconfig) if args.api else None
    backend = _backend(args, api)
    settings = Settings(
        node=args.node,
        namespace=args.namespace,
        interval=args.interval,
        poll=args.poll,
        stagger=args.stagger,
        change_threshold=args.change_threshold,
        fail_after=args.fail_after,
        recover_after=args.recover_after,
    )
    publisher = None
    if api is not None:
        pod = (args.pod_name, args.pod_namespace or args.namespace) if args.pod_name else None
        if pod is None:
            log.warning("no --pod-name/POD_NAME: the NodeFabric will have no owner reference")
        publisher = Publisher(api, args.node, args.namespace, pod, args.pod_uid)
    metrics = AgentMetrics()
    agent = Agent(settings, backend, publisher, metrics)
    stop = threading.Event()

    def _stop(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    server = None
    if args.metrics_port >= 0:
        try:
            server = MetricsServer(
                metrics, agent.heartbeat.alive, args.metrics_address, args.metrics_port
            )
        except OSError as exc:
            raise UsageError(
                f"cannot serve metrics on {args.metrics_address}:{args.metrics_port}: {exc}"
            ) from exc
        server.start()
        log.info("serving /metrics and /healthz on http://%s:%d", args.metrics_address, server.port)
    watcher = None
    if api is not None:
        watcher = RequestWatcher(api, args.node, args.namespace, agent.probe_requested)
        watcher.start()
    timer = threading.Timer(args.duration or 0.0, stop.set)
    timer.daemon = True
    if args.duration is not None:
        timer.start()
    try:
        agent.run(stop)
    finally:
        timer.cancel()
        if watcher is not None:
            watcher.close()
        if server is not None:
            server.stop()
        backend.close()
    log.info("stopped")
    return 0


def _api(kubeconfig: str | None) -> Kube:
    try:
        return Kube.from_environment(kubeconfig)
    except ConfigException as exc:
        raise UsageError(f"{exc} (or pass --no-api)") from exc


def _backend(args: AgentConfig, api: Kube | None) -> Backend:
    from choreo_agents.backends.nvml import NvmlBackend, driver_present

    kind = args.backend
    if kind == "auto":
        kind = "nvml" if driver_present() else "sim"
        log.info("backend auto: %s", "NVIDIA driver found, using NVML" if kind == "nvml"
                 else "no NVIDIA driver, using the simulated backend")  # fmt: skip
    if kind == "nvml":
        from choreo_agents.backends.dcgm import DcgmSource
        from choreo_agents.probes.cuda import load_cupy

        dcgm = DcgmSource(args.dcgm_url) if args.dcgm_url else None
        return NvmlBackend(
            sysfs_root=Path(args.sysfs), dcgm=dcgm, nccl_dirs=args.nccl_tests_dir, cupy=load_cupy()
        )
    return _sim_backend(args, api)


def _sim_backend(args: AgentConfig, api: Kube | None) -> Backend:
    from choreo.errors import ChoreoError
    from choreo.topofile import load_topology
    from choreo_agents.backends.script import ScriptError, load_script
    from choreo_agents.backends.sim import SimBackend, machines

    if not args.fabric:
        raise UsageError("the sim backend needs --fabric (a built-in name such as dgx-h100-1, "
                         "or a topology file)")  # fmt: skip
    try:
        topo = load_topology(args.fabric)
    except ChoreoError as exc:
        raise UsageError(f"--fabric: {exc}") from exc
    try:
        script = load_script(args.script) if args.script else None
    except ScriptError as exc:
        raise UsageError(str(exc)) from exc
    node = str(args.node)  # required: checked before the backend is built
    where: str | int = args.fabric_node or node
    prefixes = [m.prefix for m in machines(topo)]
    if args.fabric_node is None and len(prefixes) > 1 and node not in prefixes:
        where = _fabric_position(api, node)
    try:
        return SimBackend(topo, where, noise=args.noise, script=script, seed=args.seed,
                          script_path=args.script)
    except BackendError as exc:
        raise UsageError(str(exc)) from exc


def _fabric_position(api: Kube | None, node: str) -> int:
    """The Node's position label, for a fabric whose machine names differ from node names."""
    if api is None:
        raise UsageError(f"node {node} is not a machine of the fabric; pass --fabric-node")
    reading = Retrying(retry=retry_if_exception_type(CALL_ERRORS), stop=stop_after_delay(15.0),
                       wait=wait_fixed(1.0), reraise=True)
    try:
        node_obj = reading(api.get, f"/api/v1/nodes/{node}")
    except CALL_ERRORS as exc:
        raise UsageError(
            f"cannot read Node {node} for its fabric position: {describe(exc)}") from exc
    labels = node_obj["metadata"].get("labels") or {}
    value = labels.get(FABRIC_INDEX_LABEL)
    if value is None or not value.isdigit():
        raise UsageError(
            f"node {node} is not a machine of the fabric and has no {FABRIC_INDEX_LABEL} "
            "label; pass --fabric-node"
        )
    return int(value)
