"""Writes the agent's view to the API server: its NodeFabric and the node's DeviceFailures.

The NodeFabric is owned by the agent's Pod (garbage-collected with it) and patched with a
JSON merge patch; DeviceFailures are cluster-scoped with deterministic names, so a
restarted agent finds and updates its own instead of creating duplicates. Nothing here
retries: a failed write raises, the caller backs off and tries again with fresh state,
and what was last written successfully is remembered so unchanged state is not rewritten.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from choreo_agents.kube import ApiError, KubeApi
from choreo_agents.model import DeviceKey, DeviceType, Peer

log = logging.getLogger(__name__)

GROUP = "choreo.dev/v1alpha1"
NODE_LABEL = "choreo.dev/node"
MANAGED_BY = {"app.kubernetes.io/managed-by": "choreo-agent"}
PROBE_REQUEST = "choreo.dev/probe-requested"
"""Annotation on a NodeFabric asking its agent to re-measure now (any value)."""


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def device_doc(key: DeviceKey) -> dict[str, Any]:
    """DeviceFailure ``spec.device`` for a device key."""
    doc: dict[str, Any] = {"type": key.type.value}
    if key.gpu is not None:
        doc["gpu"] = key.gpu
    if key.type is DeviceType.NIC:
        doc["nic"] = key.nic
    if key.peer is not None:
        if key.peer.gpu is not None:
            doc["peerGPU"] = key.peer.gpu
        elif key.peer.switch is not None:
            doc["switch"] = key.peer.switch
        else:
            doc["nic"] = key.peer.nic
    return doc


def device_key(doc: dict[str, Any]) -> DeviceKey | None:
    """The inverse of ``device_doc``; None for shapes this agent does not write."""
    kind = doc.get("type")
    if kind == "gpu" and isinstance(doc.get("gpu"), int):
        return DeviceKey.of_gpu(doc["gpu"])
    if kind == "nic" and doc.get("nic"):
        return DeviceKey.of_nic(doc["nic"])
    if kind == "link" and isinstance(doc.get("gpu"), int):
        if isinstance(doc.get("peerGPU"), int):
            return DeviceKey.of_link(doc["gpu"], Peer(gpu=doc["peerGPU"]))
        if doc.get("switch"):
            return DeviceKey.of_link(doc["gpu"], Peer(switch=doc["switch"]))
        if doc.get("nic"):
            return DeviceKey.of_link(doc["gpu"], Peer(nic=doc["nic"]))
    return None


class Publisher:
    def __init__(
        self,
        api: KubeApi,
        node: str,
        namespace: str,
        pod: tuple[str, str] | None = None,
        pod_uid: str | None = None,
    ) -> None:
        self.api = api
        self.node = node
        self.namespace = namespace
        self.pod = pod
        self.pod_uid = pod_uid
        self.fabric_path = f"/apis/{GROUP}/namespaces/{namespace}/nodefabrics/{node}"
        self._owner: list[dict[str, Any]] | None = None
        self._exists = False
        self.generation = 0
        self.failures: dict[DeviceKey, bool] = {}
        """Device -> resolved, as last read or written."""

    # ---- NodeFabric -------------------------------------------------------------------------
    def owner_references(self) -> list[dict[str, Any]]:
        """A reference to the agent's Pod (UID from the downward API, else read from the Pod)."""
        if self._owner is not None:
            return self._owner
        if self.pod is None:
            self._owner = []
            return self._owner
        name, namespace = self.pod
        uid = (
            self.pod_uid
            or self.api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")["metadata"]["uid"]
        )
        if namespace != self.namespace:
            log.warning(
                "pod %s/%s is not in namespace %s; NodeFabric gets no owner (cross-namespace "
                "owners are not allowed)", namespace, name, self.namespace,
            )  # fmt: skip
            self._owner = []
        else:
            self._owner = [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": name,
                    "uid": uid,
                    "controller": True,
                    "blockOwnerDeletion": False,
                }
            ]
        return self._owner

    def write_fabric(self, spec: dict[str, Any]) -> None:
        """Create the NodeFabric, or patch its spec (and owner) if it exists."""
        metadata = {
            "name": self.node,
            "namespace": self.namespace,
            "labels": {NODE_LABEL: self.node, **MANAGED_BY},
            "ownerReferences": self.owner_references(),
        }
        if not self._exists:
            body = {"apiVersion": GROUP, "kind": "NodeFabric", "metadata": metadata, "spec": spec}
            try:
                obj = self.api.create(self.fabric_path.rsplit("/", 1)[0], body)
                self._exists = True
                self.generation = int(obj["metadata"].get("generation", 1))
                return
            except ApiError as exc:
                if exc.status != 409:
                    raise
                self._exists = True  # left by an earlier agent: take it over below
        patch = {"metadata": {k: metadata[k] for k in ("labels", "ownerReferences")}, "spec": spec}
        try:
            obj = self.api.merge_patch(self.fabric_path, patch)
        except ApiError as exc:
            if exc.status == 404:
                self._exists = False  # deleted under us (e.g. with an old Pod): recreate next time
            raise
        self.generation = int(obj["metadata"].get("generation", 0))

    def write_status(self, status: dict[str, Any]) -> None:
        body = {"status": {**status, "observedGeneration": self.generation}}
        for cond in body["status"].get("conditions", []):
            cond["observedGeneration"] = self.generation
        self.api.merge_patch(self.fabric_path + "/status", body)

    def clear_probe_request(self) -> None:
        self.api.merge_patch(self.fabric_path, {"metadata": {"annotations": {PROBE_REQUEST: None}}})

    # ---- DeviceFailure ----------------------------------------------------------------------
    def load_failures(self) -> dict[DeviceKey, str]:
        """This node's agent-written failures; returns the unresolved ones with reasons."""
        items = self.api.get(
            f"/apis/{GROUP}/devicefailures?labelSelector={NODE_LABEL}%3D{self.node}"
        )["items"]
        open_ones: dict[DeviceKey, str] = {}
        for item in items:
            spec = item.get("spec", {})
            key = device_key(spec.get("device", {}))
            if key is None or spec.get("source") != "agent" or spec.get("node") != self.node:
                continue
            resolved = bool(spec.get("resolved", False))
            self.failures[key] = resolved
            if not resolved:
                open_ones[key] = str(spec.get("reason", ""))
        return open_ones

    def write_failure(self, key: DeviceKey, failed: bool, reason: str) -> None:
        """Open (or re-open) a failure, or mark it resolved."""
        name = key.failure_name(self.node)
        path = f"/apis/{GROUP}/devicefailures/{name}"
        if failed:
            body = {
                "apiVersion": GROUP,
                "kind": "DeviceFailure",
                "metadata": {"name": name, "labels": {NODE_LABEL: self.node, **MANAGED_BY}},
                "spec": {
                    "node": self.node,
                    "device": device_doc(key),
                    "reason": reason[:1024],
                    "source": "agent",
                    "resolved": False,
                },
            }
            try:
                self.api.create(f"/apis/{GROUP}/devicefailures", body)
            except ApiError as exc:
                if exc.status != 409:
                    raise
                self.api.merge_patch(path, {"spec": {"resolved": False, "reason": reason[:1024]}})
        else:
            try:
                self.api.merge_patch(path, {"spec": {"resolved": True}})
            except ApiError as exc:
                if exc.status != 404:  # deleted by someone: nothing left to resolve
                    raise
        self.failures[key] = not failed
