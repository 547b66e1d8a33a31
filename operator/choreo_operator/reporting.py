"""What the operator tells the API server about the objects it reads: CollectiveJob conditions
and events, FabricTopology and DeviceFailure status, and why an object that does not fit the
API is not used.

Users and tools read state only from these statuses, so every write is skipped when it would
say nothing new, and what a status says is remembered only once written: a write lost to an
API server restart is repeated by the next update instead of being skipped as unchanged.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from choreo_api import (
    GROUP,
    VERSION,
    CollectiveJob,
    DeviceFailure,
    DeviceFailureStatus,
    FabricTopologyStatus,
)
from choreo_api.kube import describe
from choreo_operator import metrics, status
from choreo_operator.fabric import Fabric
from choreo_operator.kube import CALL_ERRORS, ApiException
from choreo_operator.model import Invalid, resumed
from choreo_operator.placement import Placement
from choreo_operator.planning import Blocked, Inputs
from choreo_operator.results import Trim, resumed_trims

log = logging.getLogger("choreo.operator")


class Api(Protocol):
    async def get(self, path: str) -> Any: ...
    async def list_metadata(self, path: str) -> Any: ...
    async def create(self, path: str, body: dict[str, Any]) -> Any: ...
    async def merge_patch(self, path: str, patch: dict[str, Any]) -> Any: ...
    async def delete(self, path: str) -> Any: ...


@dataclass
class JobState:
    """What the operator knows of a job: its status as last written, and its schedule's
    ConfigMaps. Resumed from the job's status, so a restarted operator redoes nothing."""

    # Held while its ConfigMaps are written or collected: a schedule that comes back (same
    # content, same name) must not be deleted between its create (409: exists) and its status.
    lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False, compare=False)
    conditions: list[dict[str, Any]] = field(default_factory=list)
    status_doc: dict[str, Any] = field(default_factory=dict)
    inputs_hash: str | None = None
    config_map: str | None = None
    keep: set[str] = field(default_factory=set)  # ConfigMaps of the current schedule
    # The schedule it replaced, kept until ``replaced_until`` (time.monotonic()): a device that
    # recovers within that (an Xid reset, a flapping link) gets it back with nothing written.
    replaced: set[str] = field(default_factory=set)
    replaced_until: float = 0.0
    mounted: frozenset[str] | None = None
    # Per collective, the sizes still asked for: learned when the files of smaller sizes did
    # not fit a pod's ConfigMap (NCCL runs those).
    trims: dict[str, Trim] = field(default_factory=dict)
    gauged: tuple[str, ...] = ()  # collectives with per-tenant gauges set


def job_path(namespace: str, name: str, sub: str = "") -> str:
    return (f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/collectivejobs/{name}"
            + (f"/{sub}" if sub else ""))


class Reporter:
    def __init__(self, api: Api) -> None:
        self.api = api
        self.jobs: dict[str, JobState] = {}
        self.failure_status: dict[str, Any] = {}
        self.fabric_status: dict[str, Any] = {}
        self.invalid_status: dict[tuple[str, str], str] = {}  # kind, key -> message written

    # ---- CollectiveJobs ----------------------------------------------------------------------
    def state(self, job: CollectiveJob) -> JobState:
        state = self.jobs.get(job.key)
        if state is None:
            st = resumed(job)
            keep = ({p.name for p in st.config_map_parts or () if p.name}
                    or ({st.config_map} if st.config_map else set()))
            state = JobState(conditions=[c.dump() for c in st.conditions or ()],
                             config_map=st.config_map, keep=keep,
                             trims=resumed_trims(job))
            self.jobs[job.key] = state
        return state

    def trims(self, jobs: Iterable[CollectiveJob]) -> dict[str, dict[str, Trim]]:
        """The jobs' trims, learned or read back from their status."""
        return {j.key: trims for j in jobs if (trims := self.state(j).trims)}

    def forget_deleted(self, live: set[str]) -> None:
        """Drop the jobs that are gone, and their per-tenant series with them."""
        for key in list(self.jobs):
            if key not in live:
                namespace, name = key.split("/", 1)
                metrics.forget_tenant(namespace, name, list(self.jobs.pop(key).gauged))

    async def update_jobs(self, jobs: Iterable[CollectiveJob],
                          updates: Mapping[str, status.Update],
                          extra: Mapping[str, Any] | None = None,
                          event: tuple[str, str] | None = None,
                          event_message: str | None = None) -> bool:
        """Patch each job's status; False if any write failed (the API server restarting)."""
        written = True
        for job in jobs:
            state = self.state(job)
            generation = job.metadata.generation or 0
            conditions = status.merge(state.conditions, updates, generation)
            doc = {"phase": status.phase(conditions), "observedGeneration": generation,
                   **(extra or {})}
            if status.same(conditions, state.conditions) and all(
                    state.status_doc.get(k) == v for k, v in doc.items()):
                continue
            try:
                await self.api.merge_patch(job_path(job.namespace, job.name, "status"),
                                           {"status": {**doc, "conditions": conditions}})
            except CALL_ERRORS as err:
                if not (isinstance(err, ApiException) and err.status == 404):  # 404: job gone
                    log.warning("status of %s: %s", job.key, describe(err))
                    written = False
                continue
            state.conditions = conditions
            state.status_doc.update(doc)
            self.phase_metrics()
            if event is not None:
                kind, why = event
                text = event_message or next(iter(updates.values()))[2]
                await self.event(job, kind, why, text)
        return written

    async def blocked(self, job: CollectiveJob, pl: Placement, why: Blocked) -> None:
        condition, reason, message = why
        updates: dict[str, status.Update] = {"Synthesizing": (False, reason, message)}
        if condition == "Infeasible":
            updates["Infeasible"] = (True, reason, message)
        else:
            updates["Ready"] = (False, reason, message)
            updates["Infeasible"] = (False, reason, message)
        await self.update_jobs([job], updates, extra={"nodes": pl.nodes},
                               event=("Warning", reason))

    async def current(self, members: Sequence[CollectiveJob]) -> None:
        """Members whose schedule matches the inputs are Ready again once a blocking problem
        (placement, disconnection) is gone; a refusal by the synthesizer stays until the
        inputs change."""
        for job in members:
            state = self.state(job)
            refused = any(c.get("type") == "Infeasible" and c.get("status") == "True"
                          and c.get("reason") in ("Infeasible", "Rejected")
                          for c in state.conditions)
            if refused or not state.config_map:
                continue
            await self.update_jobs([job], {
                "Ready": (True, "Synthesized", f"schedule {state.config_map} is current"),
                "Infeasible": (False, "Feasible", "every rank is connected"),
                "Synthesizing": (False, "Done", "nothing changed since the last synthesis")})

    async def event(self, job: CollectiveJob | Invalid, kind: str, reason: str,
                    message: str) -> None:
        uid = job.uid if isinstance(job, Invalid) else job.metadata.uid
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{job.name}.", "namespace": job.namespace},
            "involvedObject": {"apiVersion": f"{GROUP}/{VERSION}", "kind": "CollectiveJob",
                               "name": job.name, "namespace": job.namespace, "uid": uid},
            "reason": status.reason_text(reason), "message": message[:1000], "type": kind,
            "source": {"component": "choreo-operator"},
            "firstTimestamp": status.now(), "lastTimestamp": status.now(), "count": 1,
        }
        try:
            await self.api.create(f"/api/v1/namespaces/{job.namespace}/events", body)
        except ApiException as err:
            log.debug("event for %s: %s", job.key, describe(err))

    def phase_metrics(self) -> None:
        counts: dict[str, int] = {}
        for state in self.jobs.values():
            phase = status.phase(state.conditions)
            counts[phase] = counts.get(phase, 0) + 1
        metrics.set_phases(counts)

    # ---- the fabric and its failures ---------------------------------------------------------
    async def fabric(self, inputs: Inputs, fabric: Fabric, notes: list[str],
                     fingerprint: str) -> None:
        spec = sorted(inputs.fabrics, key=lambda f: f.name)[0]
        for gone in set(self.fabric_status) - {f.name for f in inputs.fabrics}:
            del self.fabric_status[gone]  # one recreated under the same name gets its status
        problems = list(fabric.notes) + notes
        topo = fabric.topology
        doc = FabricTopologyStatus(observed_generation=spec.metadata.generation or 0,
                                   nodes=len(fabric.node_gpus), gpus=len(topo.all_npus),
                                   fingerprint=fingerprint).dump()
        previous = self.fabric_status.get(spec.name)
        if previous is not None and previous[:2] == (doc, problems):
            return
        conditions = status.merge(previous[2] if previous else [], {"Ready": (
            not problems, "Invalid" if problems else "Built",
            "; ".join(problems) or f"{len(topo.npus)} live GPUs")}, spec.metadata.generation or 0)
        try:
            await self.api.merge_patch(
                f"/apis/{GROUP}/{VERSION}/fabrictopologies/{spec.name}/status",
                {"status": {**doc, "conditions": conditions}})
            self.fabric_status[spec.name] = (doc, problems, conditions)
        except ApiException as err:
            log.warning("FabricTopology %s status: %s", spec.name, describe(err))

    async def failures(self, inputs: Inputs, fabric: Fabric,
                       placements: Mapping[str, Placement]) -> None:
        for f in inputs.failures:
            resolved = f.spec.resolved
            affected = [] if resolved else sorted(
                k for k, pl in placements.items() if f.spec.node in pl.nodes
                and any(_touches(f, s.node, s.gpu) for s in pl.slots))
            problem = fabric.problems.get(f.name)
            key = (tuple(affected), problem, resolved)
            if self.failure_status.get(f.name) == key:
                continue
            applied = (False, "UnknownDevice", problem) if problem else (
                (False, "Resolved", "the device is back in the fabric") if resolved else
                (True, "Applied", f"excluded from the fabric; {len(affected)} tenant(s) affected"))
            try:
                await self._failure_conditions(f.name, applied, affected)
                self.failure_status[f.name] = key
            except ApiException as err:
                if err.status != 404:
                    log.warning("DeviceFailure %s status: %s", f.name, describe(err))
        names = {f.name for f in inputs.failures}
        for name in list(self.failure_status):
            if name not in names:
                del self.failure_status[name]

    async def _failure_conditions(self, name: str, applied: status.Update,
                                  affected: list[str]) -> None:
        doc = DeviceFailureStatus(affected=tuple(affected), affected_count=len(affected)).dump()
        await self.api.merge_patch(
            f"/apis/{GROUP}/{VERSION}/devicefailures/{name}/status",
            {"status": {**doc, "conditions": status.merge([], {"Applied": applied}, 0)}})

    # ---- objects that do not fit the API -----------------------------------------------------
    async def invalid(self, invalid: list[Invalid]) -> None:
        """Say in its status why an object is not used, in the words of ``problem``: the
        DeviceFailure is not Applied, the FabricTopology and CollectiveJob are not Ready. (A
        NodeFabric's problem is in the FabricTopology's Ready condition.)"""
        seen = {(i.kind, i.key) for i in invalid}
        for gone in set(self.invalid_status) - seen:
            del self.invalid_status[gone]
        for obj in invalid:
            if obj.kind == "NodeFabric" or self.invalid_status.get((obj.kind, obj.key)) == \
                    obj.message:
                continue
            log.warning("%s %s is invalid: %s", obj.kind, obj.key, obj.message)
            try:
                if obj.kind == "DeviceFailure":
                    await self._failure_conditions(obj.name, (False, "Invalid", obj.message), [])
                    self.failure_status.pop(obj.name, None)
                elif obj.kind == "FabricTopology":
                    await self.api.merge_patch(
                        f"/apis/{GROUP}/{VERSION}/fabrictopologies/{obj.name}/status",
                        {"status": {"observedGeneration": obj.generation, "conditions":
                                    status.merge([], {"Ready": (False, "Invalid", obj.message)},
                                                 obj.generation)}})
                    self.fabric_status.pop(obj.name, None)
                else:
                    updates: dict[str, status.Update] = {
                        "Ready": (False, "InvalidSpec", obj.message),
                        "Synthesizing": (False, "InvalidSpec", obj.message)}
                    await self.api.merge_patch(
                        job_path(obj.namespace or "", obj.name, "status"),
                        {"status": {"phase": "Pending", "observedGeneration": obj.generation,
                                    "conditions": status.merge([], updates, obj.generation)}})
                    await self.event(obj, "Warning", "InvalidSpec", obj.message)
            except ApiException as err:
                if err.status != 404:
                    log.warning("%s %s status: %s", obj.kind, obj.key, describe(err))
                continue
            self.invalid_status[(obj.kind, obj.key)] = obj.message


def _touches(f: DeviceFailure, node: str, gpu: int) -> bool:
    device = f.spec.device
    if f.spec.node != node:
        return False
    if device.type == "gpu":
        return device.gpu == gpu
    if device.type == "link" and device.nic is None:
        return gpu in (device.gpu, device.peer_gpu)
    return True
