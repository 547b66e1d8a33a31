"""Creating fake GPU nodes and failing or recovering them on a running cluster.

A node fails through kwok's chaos stage: a label makes kwok report ``Ready=False``, just
as a kubelet of a broken machine would, and the controller-manager then taints the node
as it would in production. Removing the label lets kwok report it Ready again.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from choreo_dev.config import NOT_READY_LABEL
from choreo_dev.fabric import NodeSpec, node_manifest
from choreo_dev.kube import ApiException, KubeClient, wait_for

NODES = "/api/v1/nodes"
READY_TIMEOUT = 60.0


def ready_status(node: dict[str, Any]) -> str:
    """The status of a node's Ready condition (``True``, ``False``, ``Unknown``, or ``""``)."""
    for cond in node.get("status", {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return str(cond.get("status", ""))
    return ""


def add(client: KubeClient, specs: Iterable[NodeSpec]) -> list[str]:
    """Create the nodes (existing ones are left as they are); return all their names."""
    names = []
    for spec in specs:
        try:
            client.create(NODES, node_manifest(spec))
        except ApiException as exc:
            if exc.status != 409:
                raise
        names.append(spec.name)
    return names


def list_nodes(client: KubeClient) -> list[dict[str, Any]]:
    """All Node objects."""
    return list(client.get(NODES).get("items", []))


def wait_ready_status(
    client: KubeClient, names: Sequence[str], status: str, timeout: float = READY_TIMEOUT
) -> None:
    """Wait until every named node's Ready condition has ``status``."""
    wanted = set(names)

    def done() -> bool:
        current = {n["metadata"]["name"]: ready_status(n) for n in list_nodes(client)}
        return all(current.get(name) == status for name in wanted)

    wait_for(done, timeout, f"{len(wanted)} node(s) to report Ready={status}", interval=0.25)


def wait_ready(client: KubeClient, names: Sequence[str], timeout: float = READY_TIMEOUT) -> None:
    """Wait until every named node is Ready."""
    wait_ready_status(client, names, "True", timeout)


def mark_not_ready(client: KubeClient, name: str) -> None:
    """Make kwok report the node NotReady (as a dead kubelet would)."""
    client.merge_patch(f"{NODES}/{name}", {"metadata": {"labels": {NOT_READY_LABEL: "true"}}})


def mark_ready(client: KubeClient, name: str) -> None:
    """Undo :func:`mark_not_ready`; kwok re-initialises the node as Ready."""
    client.merge_patch(f"{NODES}/{name}", {"metadata": {"labels": {NOT_READY_LABEL: None}}})


def delete(client: KubeClient, name: str) -> None:
    """Remove a fake node (a missing node is not an error)."""
    try:
        client.delete(f"{NODES}/{name}")
    except ApiException as exc:
        if exc.status != 404:
            raise
