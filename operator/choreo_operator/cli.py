"""``choreo operator`` and ``python -m choreo_operator``: run the operator in the foreground.

Imports stay light here: the ``choreo`` command builds its parser on every call, and kopf,
grpc and aiohttp load only when the operator actually runs.
"""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Sequence
from typing import Any


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--synthesizer", default="127.0.0.1:50051",
                   help="address of `choreo serve` (host:port)")
    p.add_argument("--synthesizer-ca", help="CA (PEM) of the synthesizer; enables TLS")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, else in-cluster)")
    p.add_argument("--metrics-port", type=int, default=9464,
                   help="Prometheus /metrics port; -1 turns it off, 0 picks a free one")
    p.add_argument("--metrics-addr", default="127.0.0.1")
    p.add_argument("--webhook-port", type=int, default=9443,
                   help="admission webhook HTTPS port; 0 turns the webhook off")
    p.add_argument("--webhook-addr", default="127.0.0.1", help="address the webhook binds")
    p.add_argument("--webhook-host", help="host name the API server dials (default: the address)")
    p.add_argument("--webhook-cert-dir", default="/tmp/choreo-operator-certs",
                   help="tls.crt/tls.key/ca.crt to serve with; generated here if absent")
    p.add_argument("--webhook-config", default="choreo-operator",
                   help="MutatingWebhookConfiguration to point at this webhook ('' leaves it)")
    p.add_argument("--debounce", type=float, default=0.1,
                   help="seconds without new events before a round starts")
    p.add_argument("--max-delay", type=float, default=2.0,
                   help="longest a burst may postpone a round (seconds)")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="deadline of one synthesis call (seconds)")
    p.add_argument("--restarts", type=int, default=2, help="randomized restarts per synthesis")
    p.add_argument("--max-buckets", type=int, default=4, help="size buckets per collective")
    p.add_argument("--split-bytes", type=int, default=900 * 1024,
                   help="split a schedule into per-pod ConfigMaps above this size")
    p.add_argument("--liveness", help="kopf liveness endpoint, e.g. http://127.0.0.1:8080/healthz")
    p.add_argument("--leader-election", action=argparse.BooleanOptionalAction, default=True,
                   help="run as one of several replicas: only the holder of a Lease reconciles")
    p.add_argument("--lease-namespace", default=os.environ.get("POD_NAMESPACE", "default"),
                   help="namespace of the Lease (default: $POD_NAMESPACE, else default)")
    p.add_argument("--lease-name", default="choreo-operator")
    p.add_argument("--identity", default=os.environ.get("POD_NAME") or socket.gethostname(),
                   help="this replica's name in the Lease, unique per replica (default: "
                   "$POD_NAME, else the host name); a restart under the same name takes its "
                   "Lease back at once")
    p.add_argument("--log-level", default="INFO")


def register(subparsers: Any) -> None:
    """Add ``operator`` to the ``choreo`` command."""
    p = subparsers.add_parser("operator", help="run the Kubernetes operator (kopf)")
    add_arguments(p)
    p.set_defaults(func=run_from_args)


def run_from_args(args: argparse.Namespace) -> int:
    from choreo_operator.config import Config
    from choreo_operator.main import run

    return run(Config(
        synthesizer=args.synthesizer, synthesizer_ca=args.synthesizer_ca,
        kubeconfig=args.kubeconfig, metrics_port=args.metrics_port,
        metrics_addr=args.metrics_addr, webhook_port=args.webhook_port,
        webhook_addr=args.webhook_addr, webhook_host=args.webhook_host,
        webhook_cert_dir=args.webhook_cert_dir, webhook_config=args.webhook_config,
        quiet_seconds=args.debounce, max_delay_seconds=args.max_delay,
        timeout_seconds=args.timeout, restarts=args.restarts, max_buckets=args.max_buckets,
        split_bytes=args.split_bytes, liveness=args.liveness,
        leader_election=args.leader_election, lease_namespace=args.lease_namespace,
        lease_name=args.lease_name, identity=args.identity), args.log_level)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="choreo-operator", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run_from_args(p.parse_args(argv))
