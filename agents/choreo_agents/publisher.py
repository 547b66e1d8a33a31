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

from choreo_agents.model import failure_name
from choreo_api import (
    API_VERSION,
    NODE_LABEL,
    Device,
    DeviceFailure,
    DeviceFailureSpec,
    NodeFabric,
    NodeFabricSpec,
    NodeFabricStatus,
    ObjectMeta,
    OwnerReference,
    ValidationError,
    problem,
)
from choreo_api.kube import ApiException, Kube

log = logging.getLogger(__name__)

MANAGED_BY = {"app.kubernetes.io/managed-by": "choreo-agent"}
PROBE_REQUEST = "choreo.dev/probe-requested"
"""Annotation on a NodeFabric asking its agent to re-measure now (any value)."""


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Publisher:
    def __init__(
        self,
        api: Kube,
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
        self.fabric_path = f"/apis/{API_VERSION}/namespaces/{namespace}/nodefabrics/{node}"
        self._owner: tuple[OwnerReference, ...] | None = None
        self._exists = False
        self.generation = 0
        self.failures: dict[Device, bool] = {}
        """Device -> resolved, as last read or written."""

    # ---- NodeFabric -------------------------------------------------------------------------
    def owner_references(self) -> tuple[OwnerReference, ...]:
        """A reference to the agent's Pod (UID from the downward API, else read from the Pod)."""
        if self._owner is not None:
            return self._owner
        if self.pod is None:
            self._owner = ()
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
            self._owner = ()
        else:
            self._owner = (
                OwnerReference(
                    api_version="v1", kind="Pod", name=name, uid=uid, controller=True,
                    block_owner_deletion=False,
                ),
            )  # fmt: skip
        return self._owner

    def write_fabric(self, spec: NodeFabricSpec) -> None:
        """Create the NodeFabric, or patch its spec (and owner) if it exists."""
        body = NodeFabric(
            metadata=ObjectMeta(
                name=self.node, namespace=self.namespace,
                labels={NODE_LABEL: self.node, **MANAGED_BY},
                owner_references=self.owner_references(),
            ),
            spec=spec,
        ).dump()  # fmt: skip
        if not self._exists:
            try:
                obj = self.api.create(self.fabric_path.rsplit("/", 1)[0], body)
                self._exists = True
                self.generation = int(obj["metadata"].get("generation", 1))
                return
            except ApiException as exc:
                if exc.status != 409:
                    raise
                self._exists = True  # left by an earlier agent: take it over below
        meta = body["metadata"]
        patch = {"metadata": {k: meta[k] for k in ("labels", "ownerReferences")},
                 "spec": body["spec"]}  # fmt: skip
        try:
            obj = self.api.merge_patch(self.fabric_path, patch)
        except ApiException as exc:
            if exc.status == 404:
                self._exists = False  # deleted under us (e.g. with an old Pod): recreate next time
            raise
        self.generation = int(obj["metadata"].get("generation", 0))

    def write_status(self, status: NodeFabricStatus) -> None:
        conditions = tuple(
            c.model_copy(update={"observed_generation": self.generation})
            for c in status.conditions or ()
        )
        status = status.model_copy(
            update={"observed_generation": self.generation, "conditions": conditions}
        )
        self.api.merge_patch(self.fabric_path + "/status", {"status": status.dump()})

    def clear_probe_request(self) -> None:
        self.api.merge_patch(self.fabric_path, {"metadata": {"annotations": {PROBE_REQUEST: None}}})

    # ---- DeviceFailure ----------------------------------------------------------------------
    def load_failures(self) -> dict[Device, str]:
        """This node's agent-written failures; returns the unresolved ones with reasons."""
        items = self.api.get(
            f"/apis/{API_VERSION}/devicefailures?labelSelector={NODE_LABEL}%3D{self.node}"
        )["items"]
        open_ones: dict[Device, str] = {}
        for item in items:
            try:
                spec = DeviceFailure.model_validate(item).spec
            except ValidationError as err:
                name = (item.get("metadata") or {}).get("name")
                log.warning("DeviceFailure %s is not usable: %s", name, problem(err))
                continue
            if spec.source != "agent" or spec.node != self.node:
                continue
            self.failures[spec.device] = spec.resolved
            if not spec.resolved:
                open_ones[spec.device] = spec.reason or ""
        return open_ones

    def write_failure(self, key: Device, failed: bool, reason: str) -> None:
        """Open (or re-open) a failure, or mark it resolved."""
        name = failure_name(self.node, key)
        path = f"/apis/{API_VERSION}/devicefailures/{name}"
        spec = DeviceFailureSpec(
            node=self.node, device=key, reason=reason[:1024], source="agent", resolved=not failed
        )
        if failed:
            body = DeviceFailure(
                metadata=ObjectMeta(name=name, labels={NODE_LABEL: self.node, **MANAGED_BY}),
                spec=spec,
            ).dump()
            try:
                self.api.create(f"/apis/{API_VERSION}/devicefailures", body)
            except ApiException as exc:
                if exc.status != 409:
                    raise
                reopen = spec.model_dump(include={"resolved", "reason"})
                self.api.merge_patch(path, {"spec": reopen})
        else:
            try:
                self.api.merge_patch(path, {"spec": spec.model_dump(include={"resolved"})})
            except ApiException as exc:
                if exc.status != 404:  # deleted by someone: nothing left to resolve
                    raise
        self.failures[key] = not failed
