"""Choosing loopback ports so that several clusters (and CI jobs) can run side by side."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable, Mapping

from choreo_dev.errors import DevClusterError

HOST = "127.0.0.1"

# Every listening socket of the control plane, by role.
PORT_NAMES: tuple[str, ...] = (
    "etcd-client",
    "etcd-peer",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
)


def is_free(port: int, host: str = HOST) -> bool:
    """Whether a server could listen on ``host:port`` right now.

    SO_REUSEADDR mirrors what the Go servers do, so a port held only by TIME_WAIT
    connections of a previous run counts as free, as it will for them.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def ephemeral_port(host: str = HOST) -> int:
    """A port the kernel considers free at this moment."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def choose_ports(
    names: Iterable[str],
    requested: Mapping[str, int] | None = None,
    previous: Mapping[str, int] | None = None,
    *,
    free: Callable[[int], bool] = is_free,
    pick: Callable[[], int] = ephemeral_port,
) -> dict[str, int]:
    """Assign a port to every name.

    An explicitly requested port must be free, or the start fails with a clear error;
    a port used by the previous run is reused when free, so an exported kubeconfig keeps
    working across restarts; anything else gets a fresh kernel-chosen port.
    """
    requested = dict(requested or {})
    previous = dict(previous or {})
    chosen: dict[str, int] = {}
    taken: set[int] = set()
    for name in names:
        port = requested.get(name)
        if port is not None:
            if port in taken or not free(port):
                raise DevClusterError(
                    f"port {port} on {HOST} (requested for {name}) is already in use; "
                    "free it or request another port"
                )
        else:
            port = previous.get(name)
            if port is None or port in taken or not free(port):
                port = pick()
                while port in taken:
                    port = pick()
        chosen[name] = port
        taken.add(port)
    return chosen
