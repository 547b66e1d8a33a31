"""``choreo agent``: the node agent's command line (also ``python -m choreo_agents``).

Imports here stay light (argparse only) because ``choreo``'s own CLI builds its parser
from this module on every invocation; the agent's modules load when the command runs.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``agent`` sub-command to a parent CLI."""
    p = subparsers.add_parser(
        "agent", help="run the node agent: discover, measure and watch GPU links"
    )
    add_arguments(p)
    p.set_defaults(func=run_command)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    env = os.environ.get
    p.add_argument(
        "--backend",
        choices=("auto", "nvml", "sim"),
        default="auto",
        help="auto: NVML when an NVIDIA driver is present, else sim",
    )
    p.add_argument(
        "--node", default=env("NODE_NAME"), help="this node's name (default: $NODE_NAME)"
    )
    g = p.add_argument_group("simulated backend")
    g.add_argument("--fabric", help="built-in topology name or topology file (sim backend)")
    g.add_argument(
        "--fabric-node",
        help="which machine of the fabric: name prefix (node3) or position (3); "
        "default: the node name, else the Node's choreo.dev/fabric-index label",
    )
    g.add_argument("--script", help="YAML fault script (see docs/agent.md)")
    g.add_argument(
        "--noise",
        type=float,
        default=0.02,
        help="relative measurement noise (standard deviation), default 0.02",
    )
    g.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("NVML backend")
    g.add_argument("--dcgm-url", help="read error counters and XIDs from a DCGM exporter")
    g.add_argument(
        "--nccl-tests-dir",
        action="append",
        default=[],
        help="directory with sendrecv_perf/alltoall_perf (also searched: PATH)",
    )
    g.add_argument("--sysfs", default="/sys", help=argparse.SUPPRESS)
    g = p.add_argument_group("timing")
    g.add_argument(
        "--interval",
        type=float,
        default=600.0,
        help="seconds between full re-measurements (jittered by 10%%)",
    )
    g.add_argument("--poll", type=float, default=0.5, help="seconds between health polls")
    g.add_argument(
        "--stagger",
        type=float,
        default=30.0,
        help="window over which nodes spread their first measurement (by name hash)",
    )
    g.add_argument(
        "--fail-after",
        type=int,
        default=2,
        help="consecutive bad polls before a device counts as failed",
    )
    g.add_argument(
        "--recover-after",
        type=float,
        default=30.0,
        help="seconds a failed device must stay good to recover (doubles per flap)",
    )
    g.add_argument(
        "--change-threshold",
        type=float,
        default=0.1,
        help="relative change of alpha or bandwidth that is worth a NodeFabric patch",
    )
    g.add_argument("--duration", type=float, help="exit after this many seconds")
    g = p.add_argument_group("reporting")
    g.add_argument(
        "--namespace",
        default=env("POD_NAMESPACE") or "choreo-system",
        help="namespace of the NodeFabric (default: $POD_NAMESPACE or choreo-system)",
    )
    g.add_argument("--pod-name", default=env("POD_NAME"), help="owner Pod (default: $POD_NAME)")
    g.add_argument(
        "--pod-uid",
        default=env("POD_UID"),
        help="owner Pod's UID (default: $POD_UID; else read from the Pod)",
    )
    g.add_argument(
        "--pod-namespace",
        default=env("POD_NAMESPACE"),
        help="owner Pod's namespace (default: $POD_NAMESPACE)",
    )
    g.add_argument("--kubeconfig", help="default: $KUBECONFIG, else the in-cluster account")
    g.add_argument(
        "--no-api",
        action="store_true",
        help="do not talk to Kubernetes; log and serve metrics only",
    )
    g.add_argument(
        "--metrics-port",
        type=int,
        default=9464,
        help="port for /metrics and /healthz (0: any free port, -1: off)",
    )
    g.add_argument("--metrics-address", default="0.0.0.0")
    g.add_argument("--log-level", default="INFO")


def run_command(args: argparse.Namespace) -> int:
    from choreo_agents.run import run

    return run(args)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="choreo-agent", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    return run_command(args)


if __name__ == "__main__":
    sys.exit(main())
