"""Choosing loopback ports so that several clusters (and CI jobs) can run side by side."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from choreo.service.ports import HOST, is_free, listen_port
from choreo_dev.errors import DevClusterError

# Every listening socket of the control plane, by role.
PORT_NAMES: tuple[str, ...] = (
    "etcd-client",
    "etcd-peer",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
)


def choose_ports(
    names: Iterable[str],
    requested: Mapping[str, int] | None = None,
    previous: Mapping[str, int] | None = None,
    *,
    free: Callable[[int], bool] = is_free,
    pick: Callable[[], int] = listen_port,
) -> dict[str, int]:
    """Assign a port to every name.

    An explicitly requested port must be free, or the start fails with a clear error;
    a port used by the previous run is reused when free, so an exported kubeconfig keeps
    working across restarts; anything else gets a fresh one (``listen_port``).
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
