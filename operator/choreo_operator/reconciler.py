"""The operator's core loop: settle a burst of events, decide which tenant groups need a new
schedule, ask the synthesizer, and publish the results.

Everything is derived from the current inputs (the kopf indexes), never from the events
themselves: a round rebuilds the fabric (cached while its inputs are unchanged), places every
tenant, groups them, and hashes each group's inputs (its sub-fabric, members, ranks,
collectives, options). A group is synthesized only if that hash differs from the one its
members' status records, so replays after a restart, duplicate events and our own status
updates cost nothing. A result is published only if the group's hash is still current when it
arrives; anything else is stale and dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import hashlib
import json
import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from choreo.collectives import format_size
from choreo.errors import ChoreoError
from choreo.service.client import RequestOptions, TenantRequest, bucket_xml, build_request
from choreo_api import (
    GROUP,
    VERSION,
    CollectiveJob,
    DeviceFailure,
    DeviceFailureStatus,
    FabricTopology,
    FabricTopologyStatus,
    NodeFabricSpec,
)
from choreo_operator import metrics, results, status
from choreo_operator.debounce import Debouncer
from choreo_operator.fabric import (
    BaseFabric,
    Fabric,
    Subfabrics,
    apply_failures,
    base_fabric,
    fabric_nodes,
)
from choreo_operator.grouping import Group, Member, groups
from choreo_operator.kube import ApiError
from choreo_operator.model import SHIP_ANYWAY, Invalid, NodeInfo, PodInfo, resumed
from choreo_operator.placement import Placement, healthy_slots, place
from choreo_operator.synthclient import Outcome, SynthesisError

log = logging.getLogger("choreo.operator")
# The request options a CollectiveJob's inputs hash covers (what the operator sets; the hashes
# recorded in job statuses stay valid across versions that add options).
HASHED_OPTIONS = ("dialect", "instances", "protocol", "restarts", "max_buckets",
                  "deadline_seconds", "ship_slower_than_nccl")

CONFIGMAP_WRITES = 8  # concurrent ConfigMap creations per published schedule
REASON_ORDER = ("failure", "node", "nodefabric", "fabric", "job", "pods", "startup", "retry")


@dataclass
class Inputs:
    """Everything a round reads, as compact values. ``notes`` are each FabricTopology's
    source problems; ``invalid`` the objects of choreo's kinds that do not fit the API."""

    fabrics: list[FabricTopology]
    node_fabrics: dict[str, NodeFabricSpec]
    failures: list[DeviceFailure]
    nodes: dict[str, NodeInfo]
    jobs: list[CollectiveJob]
    pods: list[PodInfo]
    notes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    invalid: list[Invalid] = field(default_factory=list)


class Api(Protocol):
    async def get(self, path: str) -> Any: ...
    async def list_metadata(self, path: str) -> Any: ...
    async def create(self, path: str, body: dict[str, Any]) -> Any: ...
    async def merge_patch(self, path: str, patch: dict[str, Any]) -> Any: ...
    async def delete(self, path: str) -> Any: ...


class Synthesizer(Protocol):
    async def synthesize(self, request: Any, timeout: float) -> Any: ...


@dataclass
class Settings:
    quiet_seconds: float = 0.1
    max_delay_seconds: float = 2.0
    call_timeout_seconds: float = 60.0
    backoff_initial_seconds: float = 0.5
    backoff_max_seconds: float = 15.0
    restarts: int = 2
    max_buckets: int = 4
    split_bytes: int = results.SPLIT_BYTES
    publish_slots: int = 2  # groups whose schedules are written at the same time


@dataclass
class Flight:
    inputs_hash: str
    task: asyncio.Task[None]


@dataclass
class GroupPlan:
    group: Group
    members: list[CollectiveJob]
    placements: dict[str, Placement]
    tenants: list[TenantRequest]
    request_fabric: Any
    inputs_hash: str
    fingerprint: str
    options: RequestOptions
    alone: str = ""  # why the group's tenants were synthesized one by one
    singles: list[tuple[Any, TenantRequest]] = field(default_factory=list)


@dataclass
class JobState:
    # Held while its ConfigMaps are written or collected: a schedule that comes back (same
    # content, same name) must not be deleted between its create (409: exists) and its status.
    lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False, compare=False)
    conditions: list[dict[str, Any]] = field(default_factory=list)
    status_doc: dict[str, Any] = field(default_factory=dict)
    inputs_hash: str | None = None
    config_map: str | None = None
    keep: set[str] = field(default_factory=set)  # ConfigMaps of the current schedule
    mounted: frozenset[str] | None = None
    bucket_cap: int | None = None  # fewer size buckets, learned when files were too large
    gauged: tuple[str, ...] = ()  # collectives with per-tenant gauges set


def job_path(namespace: str, name: str, sub: str = "") -> str:
    return (f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/collectivejobs/{name}"
            + (f"/{sub}" if sub else ""))


def _digest(doc: Any) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=repr).encode()).hexdigest()


class Reconciler:
    def __init__(self, read: Callable[[], Inputs], api: Api, synth: Synthesizer,
                 settings: Settings | None = None) -> None:
        self.read = read
        self.api = api
        self.synth = synth
        self.settings = settings or Settings()
        self.debouncer = Debouncer(self.settings.quiet_seconds, self.settings.max_delay_seconds)
        self.flights: dict[str, Flight] = {}
        self._publishing = asyncio.Semaphore(self.settings.publish_slots)
        self.current: dict[str, str] = {}  # group scope -> inputs hash of the latest round
        self.jobs: dict[str, JobState] = {}
        self.failure_status: dict[str, Any] = {}
        self.fabric_status: dict[str, Any] = {}
        self.invalid_status: dict[tuple[str, str], str] = {}  # kind, key -> message written
        self.rounds = 0
        self._fabric_key: Any = None
        self._fingerprint = ""
        self._fabric: Fabric | None = None
        self._base: tuple[Any, BaseFabric] | None = None
        self._subs = Subfabrics()
        self._retry_reasons: dict[str, str] = {}
        self._stopping = False

    # ---- driving -----------------------------------------------------------------------------
    def poke(self, reason: str) -> None:
        self.debouncer.poke(reason)

    async def run(self) -> None:
        """Rounds until ``stop``; errors in one round are logged, never fatal. A stopped
        reconciler may run again (a replica that leads again after a stall)."""
        self._stopping = False
        while not self._stopping:
            reasons, since = await self.debouncer.wait()
            try:
                await self.round(reasons, since)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("reconciliation round failed; retrying")
                await asyncio.sleep(1.0)
                self.poke("retry")

    async def stop(self) -> None:
        self._stopping = True
        for flight in self.flights.values():
            flight.task.cancel()
        for flight in list(self.flights.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await flight.task
        self.flights.clear()  # run again, a group's cancelled flight is started anew

    # ---- one round ---------------------------------------------------------------------------
    def fabric(self, inputs: Inputs) -> tuple[Fabric | None, list[str]]:
        if not inputs.fabrics:
            return None, []
        fabrics = sorted(inputs.fabrics, key=lambda f: f.name)
        spec = fabrics[0]
        notes = [f"FabricTopology {f.name} is ignored: only {spec.name} is used"
                 for f in fabrics[1:]]
        names = {n.name for n in fabric_nodes(spec)}
        down = sorted(n for n in names if n not in inputs.nodes or not inputs.nodes[n].ready)
        failures = sorted((f for f in inputs.failures if not f.spec.resolved),
                          key=lambda f: f.name)
        nfs = tuple(sorted(((k, v) for k, v in inputs.node_fabrics.items() if k in names),
                           key=lambda kv: kv[0]))
        problems = (*inputs.notes.get(spec.name, ()),
                    *(f"NodeFabric {i.key} is ignored (the node keeps its preset): {i.message}"
                      for i in inputs.invalid if i.kind == "NodeFabric"))
        key = (spec, nfs, problems, tuple(failures), tuple(down))
        if key != self._fabric_key:
            if self._base is None or key[:3] != self._base[0]:
                self._base = (key[:3], base_fabric(spec, dict(nfs), problems))
                self._subs.clear()
            self._fabric = apply_failures(self._base[1], failures, down)
            self._fabric_key = key
            # problems describe the inputs, not the fabric: they leave its fingerprint alone
            self._fingerprint = _digest((spec, nfs, *key[3:]))[:16]
        return self._fabric, notes

    async def round(self, reasons: set[str], since: float) -> None:
        self.rounds += 1
        reason = next((r for r in REASON_ORDER if r in reasons), "startup")
        inputs = self.read()
        fabric, notes = self.fabric(inputs)
        jobs = [j for j in inputs.jobs if j.metadata.deletion_timestamp is None]
        placements = place(jobs, inputs.pods, fabric)
        live = {j.key for j in jobs}
        for key in list(self.jobs):
            if key not in live:  # deleted: its per-tenant series go with it
                namespace, name = key.split("/", 1)
                metrics.forget_tenant(namespace, name, list(self.jobs.pop(key).gauged))
        plans: list[GroupPlan] = []
        blocked: dict[str, tuple[str, str, str]] = {}  # job -> condition, reason, message
        if fabric is not None:
            plans = self._plan(jobs, placements, fabric, blocked)
            self._subs.keep_used()
        for job in jobs:
            if job.key in blocked:
                await self._blocked(job, placements[job.key], *blocked[job.key])
        scopes = {p.group.scope for p in plans}
        for scope in list(self.flights):
            if scope not in scopes:
                self.flights.pop(scope).task.cancel()
                self.current.pop(scope, None)
        for plan in plans:
            await self._launch(plan, reason, since)
        # Bookkeeping after the syntheses are under way: it is not on their path.
        if fabric is not None:
            await self._fabric_status(inputs, fabric, notes)
            await self._failure_status(inputs, fabric, placements)
        await self._invalid_status(inputs.invalid)
        await self._collect(jobs, inputs.pods)
        self._phase_metrics()

    def _plan(self, jobs: list[CollectiveJob], placements: Mapping[str, Placement], fabric: Fabric,
              blocked: dict[str, tuple[str, str, str]]) -> list[GroupPlan]:
        topo = fabric.topology
        members: list[Member] = []
        ready: dict[str, CollectiveJob] = {}
        for job in jobs:
            pl = placements[job.key]
            hard = [p for p in pl.problems if "not scheduled" not in p and "ordered by" not in p]
            if pl.pods == 0:
                blocked[job.key] = ("Pending", "NoPods", "no running pod matches the selector")
                continue
            if hard:
                blocked[job.key] = ("Pending", _problem_reason(hard[0]), "; ".join(hard[:5]))
                continue
            slots = healthy_slots(pl, fabric)
            if len(slots) < 2:
                blocked[job.key] = ("Pending", "TooFewRanks",
                                    f"{len(slots)} healthy GPU(s) placed; a collective needs 2")
                continue
            tenant_npus = tuple(s.npu for s in slots)
            why = self._disconnected(topo, tenant_npus)
            if why:
                blocked[job.key] = ("Infeasible", "TenantDisconnected", why)
                continue
            ready[job.key] = job
            spec = job.spec
            members.append(Member(job.key, tenant_npus, spec.isolation == "Joint",
                                  (spec.dialect, spec.instances, spec.protocol)))
        plans = []
        for group in groups(topo, members):
            group_jobs = [ready[k] for k in group.members]
            npus = [s.npu for j in group_jobs for s in healthy_slots(placements[j.key], fabric)]
            sub, ids = self._subs.get(topo, npus, name=f"{topo.name}-{group.scope}")
            tenants = [TenantRequest(j.key, tuple(ids[s.npu] for s in
                                                  healthy_slots(placements[j.key], fabric)),
                                     j.spec.collectives, j.spec.weight) for j in group_jobs]
            first = group_jobs[0].spec
            buckets = min([self.settings.max_buckets] + [
                cap for j in group_jobs if (cap := self._state(j).bucket_cap) is not None])
            options = RequestOptions(first.dialect, first.instances, first.protocol,
                                     self.settings.restarts, buckets,
                                     self.settings.call_timeout_seconds,
                                     any(j.spec.when_nccl_faster == SHIP_ANYWAY
                                         for j in group_jobs), gzip=True)
            fingerprint = sub.fingerprint()
            ranks = {j.key: [(s.pod, s.node, s.gpu) for s in
                             healthy_slots(placements[j.key], fabric)] for j in group_jobs}
            inputs_hash = _digest({"fabric": fingerprint, "tenants": [t.__dict__ for t in tenants],
                                   "options": {f: getattr(options, f) for f in HASHED_OPTIONS},
                                   "ranks": ranks})
            plan = GroupPlan(group, group_jobs, {k: placements[k] for k in group.members},
                             tenants, sub, inputs_hash, fingerprint, options)
            if len(group_jobs) > 1:
                for j, t in zip(group_jobs, tenants, strict=True):
                    own = [s.npu for s in healthy_slots(placements[j.key], fabric)]
                    alone, own_ids = self._subs.get(topo, own,
                                                    name=f"{topo.name}-{group.scope}-1")
                    plan.singles.append((alone, TenantRequest(
                        t.name, tuple(own_ids[v] for v in own), t.collectives, t.weight)))
            plans.append(plan)
        return plans

    def _disconnected(self, topo: Any, npus: tuple[int, ...]) -> str | None:
        """Why the tenant cannot run on its own GPUs, or None. Its sub-fabric holds exactly
        what its data may cross (its GPUs and the switches between them)."""
        sub, ids = self._subs.get(topo, npus)
        try:
            sub.check_connected([ids[v] for v in npus], "tenant")
        except ChoreoError as err:
            return str(err)
        return None

    def _up_to_date(self, plan: GroupPlan) -> bool:
        for job in plan.members:
            state = self.jobs.get(job.key)
            last = resumed(job).last_synthesis
            done = (state.inputs_hash if state and state.inputs_hash
                    else last.inputs_hash if last else None)
            if done != plan.inputs_hash:
                return False
        return True

    async def _launch(self, plan: GroupPlan, reason: str, since: float) -> None:
        scope = plan.group.scope
        self.current[scope] = plan.inputs_hash
        flight = self.flights.get(scope)
        if flight is not None and flight.inputs_hash == plan.inputs_hash:
            return
        if self._up_to_date(plan):
            if flight is not None:
                flight.task.cancel()
                self.flights.pop(scope)
            await self._current(plan)
            return
        if flight is not None:
            flight.task.cancel()
        task = asyncio.create_task(self._synthesize(plan, reason, since),
                                   name=f"synthesize-{scope}")
        self.flights[scope] = Flight(plan.inputs_hash, task)

    async def _current(self, plan: GroupPlan) -> None:
        """Members whose schedule matches the inputs are Ready again once a blocking problem
        (placement, disconnection) is gone; a refusal by the synthesizer stays until the
        inputs change."""
        for job in plan.members:
            state = self._state(job)
            refused = any(c.get("type") == "Infeasible" and c.get("status") == "True"
                          and c.get("reason") in ("Infeasible", "Rejected")
                          for c in state.conditions)
            if refused or not state.config_map:
                continue
            await self._update_jobs([job], {
                "Ready": (True, "Synthesized", f"schedule {state.config_map} is current"),
                "Infeasible": (False, "Feasible", "every rank is connected"),
                "Synthesizing": (False, "Done", "nothing changed since the last synthesis")})

    # ---- one group ---------------------------------------------------------------------------
    async def _synthesize(self, plan: GroupPlan, reason: str, since: float) -> None:
        scope = plan.group.scope
        request = build_request(plan.request_fabric, plan.tenants, plan.options,
                                f"choreo-operator/{scope}:{plan.inputs_hash[:16]}")
        started = time.monotonic()
        marking = asyncio.create_task(self._update_jobs(plan.members, {"Synthesizing": (
            True, "Resynthesizing", f"{reason}: synthesizing {len(plan.members)} tenant(s)")}))
        try:
            await self._call(plan, request, reason, since, started, marking)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            # A task that dies keeps its flight, and a flight with the current inputs is never
            # started again: say why, drop the flight and retry in a later round.
            log.exception("synthesis of %s failed", ", ".join(plan.group.members))
            metrics.RESYNTHESES.labels(reason=reason, result="error").inc()
            flight = self.flights.get(scope)
            if flight is not None and flight.inputs_hash == plan.inputs_hash:
                self.flights.pop(scope)
            with contextlib.suppress(Exception):
                await self._update_jobs(plan.members, {
                    "Degraded": (True, "OperatorError", f"{type(err).__name__}: {err}; "
                                 "keeping the last good schedule, retrying"),
                    "Synthesizing": (True, "Retrying", str(err)[:500])},
                    event=("Warning", "OperatorError"))
            asyncio.get_running_loop().call_later(self.settings.backoff_max_seconds,
                                                  self.poke, "retry")
        finally:
            if not marking.done():
                marking.cancel()

    async def _call(self, plan: GroupPlan, request: Any, reason: str, since: float,
                    started: float, marking: asyncio.Task[bool]) -> None:
        scope = plan.group.scope
        delay = self.settings.backoff_initial_seconds
        requests = [request]
        while True:
            try:
                response = await self.synth.synthesize(
                    requests[0], timeout=self.settings.call_timeout_seconds)
                for extra in requests[1:]:
                    more = await self.synth.synthesize(
                        extra, timeout=self.settings.call_timeout_seconds)
                    response.tenants.extend(more.tenants)
                break
            except SynthesisError as err:
                if self.current.get(scope) != plan.inputs_hash:
                    metrics.RESYNTHESES.labels(reason=reason, result="stale").inc()
                    return
                if err.outcome is Outcome.RETRY:
                    metrics.RESYNTHESES.labels(reason=reason, result="error").inc()
                    why = ("SynthesizerUnavailable" if err.code == "UNAVAILABLE"
                           else "SynthesizerSlow" if err.code == "DEADLINE_EXCEEDED"
                           else "SynthesizerError")
                    await self._update_jobs(plan.members, {
                        "Degraded": (True, why, f"{err}; keeping the last good schedule, "
                                     f"retrying in {delay:.1f} s"),
                        "Synthesizing": (True, "Retrying", str(err))}, event=("Warning", why))
                    await asyncio.sleep(delay * (0.8 + 0.4 * random.random()))
                    delay = min(delay * 2, self.settings.backoff_max_seconds)
                    continue
                if err.outcome is Outcome.REJECTED and len(requests) == 1 and len(plan.tenants) > 1:
                    # The joint request could not be lowered (a tenant's schedule left its own
                    # GPUs): keep every tenant running on a schedule of its own.
                    log.warning("joint synthesis of %s refused (%s); synthesizing each alone",
                                ", ".join(plan.group.members), err)
                    requests = [build_request(sub, [t], plan.options,
                                              f"choreo-operator/{scope}/{t.name}:"
                                              f"{plan.inputs_hash[:16]}")
                                for sub, t in plan.singles]
                    plan.alone = str(err)
                    continue
                result = "infeasible" if err.outcome is Outcome.INFEASIBLE else "rejected"
                metrics.RESYNTHESES.labels(reason=reason, result=result).inc()
                for job in plan.members:
                    self._state(job).inputs_hash = plan.inputs_hash
                await self._update_jobs(plan.members, {
                    "Infeasible": (True, "Infeasible" if result == "infeasible" else "Rejected",
                                   str(err)),
                    "Synthesizing": (False, "Done", "the synthesizer refused the request")},
                    event=("Warning", "Infeasible"), extra={"lastSynthesis": {
                        "time": status.now(), "reason": reason,
                        "inputsHash": plan.inputs_hash}})
                self.flights.pop(scope, None)
                return
        answered = time.monotonic()
        # Publishing inflates and splits megabytes of XML and writes them to the API server:
        # a few groups at a time, or a startup with many tenants would hold all of it at once.
        async with self._publishing:
            if self.current.get(scope) != plan.inputs_hash:
                metrics.RESYNTHESES.labels(reason=reason, result="stale").inc()
                return
            with contextlib.suppress(Exception):
                await marking
            by_name = {t.name: t for t in response.tenants}
            published = [job for job in plan.members if await self._publish(
                job, plan, by_name[job.key], response, reason, time.monotonic() - started)]
        self.flights.pop(scope, None)
        if len(published) == len(plan.members):  # otherwise each refusal was counted
            latency = max(0.0, time.time() - since)
            metrics.RESYNTHESES.labels(reason=reason, result="ok").inc()
            metrics.LATENCY.observe(latency)
            log.info("%s: published %.2f s after the %s event (synthesizer %.2f s, of which its "
                     "own work %.2f s; publishing %.2f s)", ", ".join(plan.group.members),
                     latency, reason, answered - started, response.synthesis_seconds,
                     time.monotonic() - answered)
        for job in published:
            await self._gc(job)
        release_memory()

    async def _publish(self, job: CollectiveJob, plan: GroupPlan, result: Any, response: Any,
                       reason: str, seconds: float) -> bool:
        """Write the job's new schedule and status; False when it was refused instead."""
        async with self._state(job).lock:
            return await self._write(job, plan, result, response, reason, seconds)

    async def _write(self, job: CollectiveJob, plan: GroupPlan, result: Any, response: Any,
                     reason: str, seconds: float) -> bool:
        pl = plan.placements[job.key]
        fabric = self._fabric
        assert fabric is not None
        slots = healthy_slots(pl, fabric)
        schedule = results.Schedule(files={}, dialect=job.spec.dialect, ranks=[
            {"rank": r, "pod": s.pod, "node": s.node, "gpu": s.gpu} for r, s in enumerate(slots)])
        pod_ranks: dict[str, tuple[int, int]] = {}
        for r, s in enumerate(slots):
            lo, _ = pod_ranks.get(s.pod, (r, r))
            pod_ranks[s.pod] = (lo, r)
        ship_anyway = job.spec.when_nccl_faster == SHIP_ANYWAY
        for spec, coll in zip(job.spec.collectives, result.collectives, strict=True):
            best = None
            sizes: dict[tuple[int, int], results.SizeRange] = {}
            for b, bucket in enumerate(coll.buckets):
                p = bucket.prediction
                to_nccl = results.nccl_runs(bucket, ship_anyway)
                sizes.setdefault((bucket.min_bytes, bucket.max_bytes), results.SizeRange(
                    int(bucket.min_bytes), int(bucket.max_bytes), to_nccl,
                    p.speedup_vs_nccl if p.nccl_choice else None))
                if not to_nccl:
                    schedule.files[results.xml_key(spec.name, b)] = bucket_xml(bucket)
                if not bucket.verification.ok:
                    schedule.verified = False
                    schedule.errors.extend(bucket.verification.errors)
                if best is None or bucket.max_bytes >= best.max_bytes:
                    best = bucket
            if best is not None:
                p = best.prediction
                schedule.collectives.append(results.CollectiveResult(
                    spec.name, int(best.representative_bytes), p.time_seconds,
                    p.busbw_bytes_per_second, p.lower_bound_seconds, p.fraction_of_bound,
                    p.nccl_time_seconds if p.nccl_choice else None, p.nccl_choice,
                    tuple(sorted(sizes.values(), key=lambda r: r.min_bytes))))
        if not schedule.verified:
            await self._update_jobs([job], {
                "Degraded": (True, "VerificationFailed", "; ".join(schedule.errors[:3])),
                "Synthesizing": (False, "Done", "the new schedule failed verification")},
                event=("Warning", "VerificationFailed"))
            metrics.RESYNTHESES.labels(reason=reason, result="unverified").inc()
            return False
        # Splitting megabytes of XML per pod takes a while: keep the event loop answering.
        name, parts, bodies = await asyncio.to_thread(
            results.config_maps, job, schedule, pod_ranks, pl.pod_index, plan.inputs_hash,
            plan.fingerprint, self.settings.split_bytes)
        too_big = results.oversized(bodies)
        used = max((len(c.buckets) for c in result.collectives), default=1)
        if too_big and used > 1:
            # Fewer size buckets mean fewer files per ConfigMap: try the count that fits.
            largest = max(results.data_bytes(b) for b in bodies)
            cap = max(1, min(used - 1, int(used * 0.9 * results.CONFIGMAP_MAX_BYTES / largest)))
            self._state(job).bucket_cap = cap
            metrics.RESYNTHESES.labels(reason=reason, result="too_large").inc()
            await self._update_jobs([job], {"Synthesizing": (
                True, "FewerSizeBuckets", f"a pod's ConfigMap would hold {largest / 2**20:.2f} "
                f"MiB, over the 1 MiB limit; synthesizing again with {cap} size bucket(s) "
                f"instead of {used}")}, event=("Normal", "FewerSizeBuckets"))
            self.poke("retry")
            return False
        if too_big:
            # The API server would refuse it on every retry: say so once, keep what pods have.
            self._state(job).inputs_hash = plan.inputs_hash
            metrics.RESYNTHESES.labels(reason=reason, result="rejected").inc()
            await self._update_jobs([job], {
                "Degraded": (True, "ScheduleTooLarge", too_big),
                "Synthesizing": (False, "Done", "the schedule does not fit in ConfigMaps")},
                event=("Warning", "ScheduleTooLarge"),
                extra={"lastSynthesis": {"time": status.now(), "reason": reason,
                                         "inputsHash": plan.inputs_hash}})
            return False
        # One ConfigMap per pod for large tenants: written side by side, a few at a time.
        writes = asyncio.Semaphore(CONFIGMAP_WRITES)

        async def create(body: dict[str, Any]) -> None:
            async with writes:
                try:
                    await self.api.create(f"/api/v1/namespaces/{job.namespace}/configmaps",
                                          body)
                except ApiError as err:
                    if err.status != 409:
                        raise

        await asyncio.gather(*(create(body) for body in bodies))
        if not parts:
            alias = results.alias_body(job, schedule, schedule.content_hash())
            path = f"/api/v1/namespaces/{job.namespace}/configmaps"
            try:
                await self.api.create(path, alias)
            except ApiError as err:
                if err.status != 409:
                    raise
                stale = {k: None for k in (*results.possible_files(job),
                                           *results.MSCCL_OFF[job.spec.dialect])
                         if k not in alias["data"]}
                await self.api.merge_patch(f"{path}/{alias['metadata']['name']}",
                                           {"data": {**stale, **alias["data"]},
                                            "metadata": {"labels": alias["metadata"]["labels"]}})
        state = self._state(job)
        new_maps = {name} if not parts else {p.name for p in parts}
        first = schedule.collectives[0] if schedule.collectives else None
        summary = first.summary() if first else ""
        extra = {
            "ranks": len(slots), "nodes": pl.nodes, "configMap": name,
            "configMapParts": [{"name": p.name, "firstRank": p.first, "lastRank": p.last,
                                "podRank": p.pod_rank} for p in parts],
            "files": sorted(schedule.files),
            "contentHash": schedule.content_hash(), "summary": summary,
            "collectives": [c.status() for c in schedule.collectives],
            "lastSynthesis": {"time": status.now(), "reason": reason,
                              "durationSeconds": round(seconds, 3),
                              "engine": response.engine or "greedy",
                              "fabricFingerprint": plan.fingerprint,
                              "inputsHash": plan.inputs_hash},
        }
        failed = len(pl.slots) - len(slots)
        others = [k for k in plan.group.members if k != job.key]
        how = ("" if not others else
               f"; synthesized alone ({plan.alone}) though it shares links with "
               f"{', '.join(others)}" if plan.alone else
               f"; jointly with {', '.join(others)}")
        left_to_nccl = [f"{c.name} {format_size(r.min_bytes)}..{format_size(r.max_bytes)}"
                        for c in schedule.collectives for r in c.nccl_ranges]
        nccl_note = ("" if not left_to_nccl else "; NCCL is predicted faster and runs "
                     + ", ".join(left_to_nccl) + " (no file for those sizes)")
        updates: dict[str, status.Update] = {
            "Ready": (True, "Synthesized",
                      f"schedule {name} for {len(slots)} ranks{how}{nccl_note}"),
            "Synthesizing": (False, "Done", f"synthesized in {seconds:.2f} s"),
            "Infeasible": (False, "Feasible", "every rank is connected"),
            "Degraded": ((True, "DevicesFailed", f"{failed} of {len(pl.slots)} placed GPUs "
                          "have failed; the schedule uses the others") if failed else
                         (False, "Healthy", "the synthesizer answered")),
        }
        written = await self._update_jobs([job], updates, extra=extra,
                                          event=("Normal", "Synthesized"),
                                          event_message=f"schedule {name} ({summary}) after "
                                          f"{reason}")
        if not written:
            # The status still names the previous ConfigMaps: keep them and the new ones, and
            # publish again (the service has the schedule cached) until the status says so.
            state.keep |= new_maps
            asyncio.get_running_loop().call_later(self.settings.backoff_initial_seconds,
                                                  self.poke, "retry")
            return False
        state.inputs_hash = plan.inputs_hash
        state.config_map = name
        state.keep = new_maps
        gone = [c for c in state.gauged if c not in {x.name for x in schedule.collectives}]
        metrics.forget_tenant(job.namespace, job.name, gone)
        state.gauged = tuple(c.name for c in schedule.collectives)
        for c in schedule.collectives:
            labels = (job.namespace, job.name, c.name)
            metrics.BUSBW.labels(*labels).set(c.busbw)
            metrics.BOUND.labels(*labels).set(c.fraction_of_bound)
            if c.speedup_vs_nccl is not None:
                metrics.VS_NCCL.labels(*labels).set(c.speedup_vs_nccl)
            for runs in (metrics.RUNS_CHOREO, metrics.RUNS_NCCL):
                metrics.RANGES.labels(*labels, runs).set(
                    sum(r.nccl_runs == (runs == metrics.RUNS_NCCL) for r in c.sizes))
        return True

    # ---- status ------------------------------------------------------------------------------
    def _state(self, job: CollectiveJob) -> JobState:
        state = self.jobs.get(job.key)
        if state is None:
            st = resumed(job)
            keep = ({p.name for p in st.config_map_parts or () if p.name}
                    or ({st.config_map} if st.config_map else set()))
            state = JobState(conditions=[c.dump() for c in st.conditions or ()],
                             config_map=st.config_map, keep=keep)
            self.jobs[job.key] = state
        return state

    async def _update_jobs(self, jobs: Iterable[CollectiveJob],
                           updates: Mapping[str, status.Update],
                           extra: Mapping[str, Any] | None = None,
                           event: tuple[str, str] | None = None,
                           event_message: str | None = None) -> bool:
        """Patch each job's status; False if any write failed (the API server restarting).

        What a job's status says is remembered only once written, so a failed write is
        repeated by the next update instead of being skipped as unchanged."""
        written = True
        for job in jobs:
            state = self._state(job)
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
            except ApiError as err:
                if err.status != 404:
                    log.warning("status of %s: %s", job.key, err)
                    written = False
                continue
            except (aiohttp.ClientError, TimeoutError) as err:
                log.warning("status of %s: %s: %s", job.key, type(err).__name__, err)
                written = False
                continue
            state.conditions = conditions
            state.status_doc.update(doc)
            self._phase_metrics()
            if event is not None:
                kind, why = event
                text = event_message or next(iter(updates.values()))[2]
                await self._event(job, kind, why, text)
        return written

    async def _blocked(self, job: CollectiveJob, pl: Placement, condition: str, reason: str,
                       message: str) -> None:
        updates: dict[str, status.Update] = {"Synthesizing": (False, reason, message)}
        if condition == "Infeasible":
            updates["Infeasible"] = (True, reason, message)
        else:
            updates["Ready"] = (False, reason, message)
            updates["Infeasible"] = (False, reason, message)
        await self._update_jobs([job], updates, extra={"nodes": pl.nodes},
                                event=("Warning", reason))

    async def _event(self, job: CollectiveJob | Invalid, kind: str, reason: str,
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
        except ApiError as err:
            log.debug("event for %s: %s", job.key, err)

    async def _fabric_status(self, inputs: Inputs, fabric: Fabric, notes: list[str]) -> None:
        spec = sorted(inputs.fabrics, key=lambda f: f.name)[0]
        for gone in set(self.fabric_status) - {f.name for f in inputs.fabrics}:
            del self.fabric_status[gone]  # one recreated under the same name gets its status
        problems = list(fabric.notes) + notes
        topo = fabric.topology
        doc = FabricTopologyStatus(observed_generation=spec.metadata.generation or 0,
                                   nodes=len(fabric.node_gpus), gpus=len(topo.all_npus),
                                   fingerprint=self._fingerprint).dump()
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
        except ApiError as err:
            log.warning("FabricTopology %s status: %s", spec.name, err)

    async def _failure_status(self, inputs: Inputs, fabric: Fabric,
                              placements: Mapping[str, Placement]) -> None:
        for f in inputs.failures:
            resolved = f.spec.resolved
            affected = [] if resolved else sorted(
                k for k, pl in placements.items() if any(_touches(f, s.node, s.gpu)
                                                         for s in pl.slots))
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
            except ApiError as err:
                if err.status != 404:
                    log.warning("DeviceFailure %s status: %s", f.name, err)
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

    async def _invalid_status(self, invalid: list[Invalid]) -> None:
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
                    await self._event(obj, "Warning", "InvalidSpec", obj.message)
            except ApiError as err:
                if err.status != 404:
                    log.warning("%s %s status: %s", obj.kind, obj.key, err)
                continue
            self.invalid_status[(obj.kind, obj.key)] = obj.message

    def _phase_metrics(self) -> None:
        counts: dict[str, int] = {}
        for state in self.jobs.values():
            phase = status.phase(state.conditions)
            counts[phase] = counts.get(phase, 0) + 1
        metrics.set_phases(counts)

    # ---- garbage collection ------------------------------------------------------------------
    async def _collect(self, jobs: list[CollectiveJob], pods: list[PodInfo]) -> None:
        """Delete a job's old ConfigMaps once no pod mounts them (only if mounts changed)."""
        mounted: dict[str, set[str]] = {}
        for pod in pods:
            if pod.active:
                mounted.setdefault(pod.namespace, set()).update(pod.config_maps)
        for job in jobs:
            state = self._state(job)
            if not state.keep:
                continue
            mine = frozenset(m for m in mounted.get(job.namespace, ())
                             if m.startswith(f"{job.name[:230]}-"))
            if state.mounted != mine:
                await self._gc(job, mine)

    async def _gc(self, job: CollectiveJob, mounted: frozenset[str] | None = None) -> None:
        if mounted is None:
            mounted = frozenset(m for p in self.read().pods
                                if p.active and p.namespace == job.namespace
                                for m in p.config_maps)
        state = self._state(job)
        async with state.lock:
            await self._collect_unused(job, state, mounted)

    async def _collect_unused(self, job: CollectiveJob, state: JobState,
                              mounted: frozenset[str]) -> None:
        state.mounted = mounted
        selector = f"{results.LABEL_JOB}={job.name[:63]}"
        try:
            listing = await self.api.list_metadata(
                f"/api/v1/namespaces/{job.namespace}/configmaps?labelSelector={selector}")
            # What the job's status names right now is never garbage, whatever this replica
            # remembers: after a takeover its index may still hold an older status.
            named = _named_config_maps(
                await self.api.get(job_path(job.namespace, job.name, "status")))
        except ApiError as err:
            log.warning("listing ConfigMaps of %s: %s", job.key, err)
            return
        for cm in listing.get("items", []):
            meta = cm["metadata"]
            owners = {o.get("uid") for o in meta.get("ownerReferences") or []}
            name = meta["name"]
            if (job.metadata.uid not in owners or name in state.keep or name in mounted
                    or name in named or name == results.alias_name(job.name)):
                continue
            try:
                await self.api.delete(f"/api/v1/namespaces/{job.namespace}/configmaps/{name}")
            except ApiError as err:
                if err.status != 404:
                    log.warning("deleting ConfigMap %s: %s", name, err)


def _named_config_maps(job: Mapping[str, Any]) -> set[str]:
    """The ConfigMaps a CollectiveJob's status names (its schedule's, whole or in parts)."""
    st = job.get("status") or {}
    parts = {p.get("name") for p in st.get("configMapParts") or () if isinstance(p, dict)}
    return {n for n in parts | {st.get("configMap")} if isinstance(n, str) and n}


def _touches(f: DeviceFailure, node: str, gpu: int) -> bool:
    device = f.spec.device
    if f.spec.node != node:
        return False
    if device.type == "gpu":
        return device.gpu == gpu
    if device.type == "link" and device.nic is None:
        return gpu in (device.gpu, device.peer_gpu)
    return True


def release_memory() -> None:
    """Hand freed heap back to the OS. Publishing inflates tens of megabytes of XML, partly in
    worker threads, and glibc keeps such memory in its arenas; without this the operator's
    resident size stays near its largest publication's peak."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to do
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _problem_reason(problem: str) -> str:
    if "not in the FabricTopology" in problem:
        return "UnknownNode"
    if "has no GPU" in problem:
        return "UnknownGPU"
    if "no FabricTopology" in problem:
        return "NoFabric"
    if "also claimed" in problem:
        return "GPUConflict"
    return "PlacementProblem"
