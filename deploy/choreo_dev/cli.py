"""``choreo-dev``: build, start and drive the local Kubernetes control plane.

Every expected failure is a :class:`DevClusterError`; ``main`` prints it as
``error: ...`` and exits non-zero, so a developer never has to read a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml

from choreo_api.kube import ApiException, describe
from choreo_dev import build, fabric, nodes, paths
from choreo_dev.cluster import Cluster, ClusterInfo, control_plane_binaries
from choreo_dev.errors import DevClusterError
from choreo_dev.kube import run_kubectl
from choreo_dev.procs import is_alive
from choreo_dev.versions import BINARIES, CONTROL_PLANE, binary


def _progress(message: str) -> None:
    print(f"· {message}", file=sys.stderr, flush=True)


def _cluster(args: argparse.Namespace) -> Cluster:
    return Cluster(Path(args.state_dir) if args.state_dir else paths.state_dir())


def parse_labels(items: Sequence[str]) -> dict[str, str]:
    """``key=value`` pairs from the command line."""
    labels = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise DevClusterError(f"label {item!r} must look like key=value")
        labels[key] = value
    return labels


def parse_dims(text: str) -> list[int]:
    """``4x2`` -> ``[4, 2]``."""
    try:
        dims = [int(part) for part in text.lower().split("x")]
    except ValueError:
        raise DevClusterError(f"dims {text!r} must look like 8 or 4x2") from None
    return dims


def node_specs(
    fabric_file: str | None,
    dims: str | None = None,
    count: int = 8,
    gpus: int = 8,
    prefix: str = "gpu-node",
    labels: Sequence[str] = (),
) -> list[fabric.NodeSpec]:
    """Node specs from either a fabric file or the --count/--dims flags."""
    if fabric_file:
        try:
            doc = yaml.safe_load(Path(fabric_file).read_text())
        except FileNotFoundError:
            raise DevClusterError(f"fabric description {fabric_file} does not exist") from None
        except yaml.YAMLError as exc:
            raise DevClusterError(f"fabric description {fabric_file} is not YAML: {exc}") from None
        return fabric.parse(doc)
    shape = parse_dims(dims) if dims else [count]
    return fabric.grid(prefix, shape, gpus, parse_labels(labels))


def _print_usage(info: ClusterInfo) -> None:
    print(f"cluster ready: {info.server}")
    print("use it with:")
    for line in info.env_lines():
        print(f"  {line}")
    print("  kubectl get nodes        (or: choreo-dev kubectl get nodes)")


def cmd_build(args: argparse.Namespace) -> int:
    names = args.only or None
    done = build.ensure(names, _progress)
    for name, path in done.items():
        rec = build.record(binary(name))
        took = f"built in {rec.seconds:.0f} s" if rec else ""
        print(f"{name:<24} {binary(name).version:<8} {path}  {took}")
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    bins = control_plane_binaries(build_missing=not args.no_build, progress=_progress)
    requested = {"kube-apiserver": args.apiserver_port} if args.apiserver_port else {}
    info = cluster.up(bins, requested, progress=_progress)
    if args.nodes or args.fabric:
        names = nodes.add(cluster.client(), node_specs(args.fabric, count=args.nodes))
        nodes.wait_ready(cluster.client(), names)
        _progress(f"{len(names)} fake GPU node(s) Ready")
    _print_usage(info)
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    stopped = _cluster(args).down()
    if stopped:
        print("stopped " + ", ".join(f"{r.name} (pid {r.pid})" for r in stopped))
    else:
        print("nothing was running")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    records = cluster.records()
    try:
        info: ClusterInfo | None = cluster.info()
    except DevClusterError:
        info = None
    all_up = True
    print(f"state dir: {cluster.layout.root}")
    for name in CONTROL_PLANE:
        rec = records.get(name)
        alive = rec is not None and is_alive(rec)
        all_up &= alive
        pid = str(rec.pid) if rec else "-"
        print(f"  {name:<24} {'running' if alive else 'stopped':<8} pid {pid:<8} "
              f"log {cluster.layout.log(name)}")
    if info and all_up:
        print(f"server: {info.server}")
        print(f"kubeconfig: {info.kubeconfig}")
    return 0 if all_up else 1


def cmd_env(args: argparse.Namespace) -> int:
    info = _cluster(args).require_running()
    print("\n".join(info.env_lines()))
    return 0


def cmd_wipe(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    cluster.wipe()
    print(f"stopped the cluster and removed {cluster.layout.root}")
    return 0


def cmd_nodes_add(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    cluster.require_running()
    client = cluster.client()
    specs = node_specs(args.fabric, args.dims, args.count, args.gpus, args.prefix, args.label)
    names = nodes.add(client, specs)
    if not args.no_wait:
        nodes.wait_ready(client, names)
    shown = ", ".join(names[:8]) + (" ..." if len(names) > 8 else "")
    print(f"{len(names)} fake GPU node(s): {shown}")
    return 0


def cmd_nodes_fail(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    cluster.require_running()
    client = cluster.client()
    for name in args.names:
        nodes.mark_not_ready(client, name)
    nodes.wait_ready_status(client, args.names, "False")
    print(f"NotReady: {', '.join(args.names)}")
    return 0


def cmd_nodes_recover(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    cluster.require_running()
    client = cluster.client()
    for name in args.names:
        nodes.mark_ready(client, name)
    nodes.wait_ready(client, args.names)
    print(f"Ready: {', '.join(args.names)}")
    return 0


def cmd_nodes_list(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    cluster.require_running()
    for node in nodes.list_nodes(cluster.client()):
        meta, status = node["metadata"], node.get("status", {})
        gpus = status.get("capacity", {}).get(fabric.GPU_RESOURCE, "0")
        position = meta.get("labels", {}).get(fabric.POSITION_LABEL, "-")
        print(f"{meta['name']:<28} ready={nodes.ready_status(node):<8} gpus={gpus:<4} "
              f"position={position}")
    return 0


def cmd_kubectl(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    cluster.require_running()
    kubectl = build.resolve(["kubectl"])["kubectl"]
    sys.stdout.write(run_kubectl(kubectl, cluster.layout.kubeconfig, args.args))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from choreo_dev import bench

    return bench.run(nodes_for_memory=args.memory_nodes)


def cmd_demo(args: argparse.Namespace) -> int:
    from choreo_dev import demo

    root = Path(args.state) if args.state else None
    if args.action == "stop":
        return demo.stop(root)
    return demo.run(Path(args.out), args.keep, root)


def _add_node_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--fabric", help="fabric description (YAML) listing the nodes")
    group.add_argument("--count", type=int, default=8, help="number of nodes (default 8)")
    group.add_argument("--dims", help="grid of nodes such as 4x2; positions become labels")
    parser.add_argument("--gpus", type=int, default=8, help="nvidia.com/gpu per node (default 8)")
    parser.add_argument("--prefix", default="gpu-node", help="node name prefix")
    parser.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                        help="extra label on every node (repeatable)")
    parser.add_argument("--no-wait", action="store_true", help="do not wait for Ready")


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    parser = argparse.ArgumentParser(prog="choreo-dev", description=__doc__.splitlines()[0])
    parser.add_argument("--state-dir", help="cluster state directory "
                        "(default: $CHOREO_STATE_DIR or .state/cluster in the checkout)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("build", help="build and cache the pinned binaries")
    p.add_argument("--only", action="append", choices=[b.name for b in BINARIES],
                   help="build only this component (repeatable)")
    p.set_defaults(func=cmd_build)

    cluster = sub.add_parser("cluster", help="start, stop and inspect the local cluster")
    csub = cluster.add_subparsers(dest="action", required=True)
    p = csub.add_parser("up", help="start the control plane and wait until it is usable")
    p.add_argument("--apiserver-port", type=int, help="fixed API server port (default: free)")
    p.add_argument("--nodes", type=int, default=0, help="also add this many fake GPU nodes")
    p.add_argument("--fabric", help="also add the nodes of this fabric description")
    p.add_argument("--no-build", action="store_true", help="fail instead of building binaries")
    p.set_defaults(func=cmd_up)
    csub.add_parser("down", help="stop every component by PID").set_defaults(func=cmd_down)
    csub.add_parser("status", help="show which components run").set_defaults(func=cmd_status)
    csub.add_parser("env", help="print `export KUBECONFIG=...`").set_defaults(func=cmd_env)
    csub.add_parser("wipe", help="stop and delete all state").set_defaults(func=cmd_wipe)

    nodes_p = sub.add_parser("nodes", help="fake GPU nodes")
    nsub = nodes_p.add_subparsers(dest="action", required=True)
    p = nsub.add_parser("add", help="add fake GPU nodes")
    _add_node_flags(p)
    p.set_defaults(func=cmd_nodes_add)
    p = nsub.add_parser("fail", help="make nodes NotReady")
    p.add_argument("names", nargs="+")
    p.set_defaults(func=cmd_nodes_fail)
    p = nsub.add_parser("recover", help="make failed nodes Ready again")
    p.add_argument("names", nargs="+")
    p.set_defaults(func=cmd_nodes_recover)
    nsub.add_parser("list", help="list nodes").set_defaults(func=cmd_nodes_list)

    p = sub.add_parser("kubectl", help="run the pinned kubectl against the local cluster")
    p.add_argument("args", nargs=argparse.REMAINDER)
    p.set_defaults(func=cmd_kubectl)

    p = sub.add_parser("demo", help="the whole product end to end on a fresh local cluster")
    p.add_argument("action", nargs="?", choices=("run", "stop"), default="run",
                   help="run the demo (default), or stop one left running by --keep")
    p.add_argument("--out", default="out/demo", help="plots and summary (default out/demo)")
    p.add_argument("--keep", action="store_true",
                   help="leave the cluster and processes running at the end")
    p.add_argument("--state", help="demo state directory (default .state/demo)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("bench", help="measure build, start, job and memory")
    p.add_argument("--memory-nodes", type=int, default=128,
                   help="fake nodes present when memory is measured (default 128)")
    p.set_defaults(func=cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``choreo-dev``."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except DevClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except ApiException as exc:
        print(f"error: the API server refused a request: {describe(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
