"""A synthesized schedule into ConfigMaps, and the ConfigMaps nobody uses any more out again.

ConfigMaps are content-addressed and immutable (``results``): publishing the same schedule
twice finds it already there (409), and a pod keeps the files it started with. A schedule too
large for one ConfigMap is split per pod; one too large even then leaves its smallest size
ranges to NCCL, and the job asks for the others only from then on. Old ConfigMaps are deleted
only once no pod mounts them and the job's status no longer names them; a job's writes and
deletions hold its lock, so a schedule that comes back is never deleted between its create
and the status that names it. The schedule a publication replaced stays for
``keep_replaced_seconds`` after it: a failed device that recovers within that window gets its
old schedule back without a ConfigMap written (for a 1,024-GPU tenant, 128 of them).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

from kubernetes_asyncio.client import ApiException

from choreo.collectives import format_size
from choreo.service.client import bucket_body, bucket_member_ends
from choreo_api import CollectiveJob
from choreo_api.kube import describe
from choreo_operator import metrics, results, status
from choreo_operator.kube import CALL_ERRORS
from choreo_operator.model import SHIP_ANYWAY, PodInfo
from choreo_operator.placement import RankSlot, pod_part_ends
from choreo_operator.planning import GroupPlan
from choreo_operator.reporting import Api, JobState, Reporter, job_path

log = logging.getLogger("choreo.operator")
CONFIGMAP_WRITES = 8  # concurrent ConfigMap creations (or deletions) per schedule


class Publisher:
    def __init__(self, api: Api, reporter: Reporter, pods: Callable[[], Iterable[PodInfo]],
                 poke: Callable[[str], None], *, split_bytes: int = results.SPLIT_BYTES,
                 retry_seconds: float = 0.5, packed: bool = False,
                 keep_replaced_seconds: float = 0.0) -> None:
        self.api = api
        self.reporter = reporter
        self.pods = pods  # the pods as they are now
        self.poke = poke
        self.split_bytes = split_bytes
        self.packed = packed  # XML compressed in ConfigMaps, for pods that inflate it (webhook)
        self.retry_seconds = retry_seconds  # before publishing again after a lost status write
        self.keep_replaced_seconds = keep_replaced_seconds

    async def publish(self, job: CollectiveJob, plan: GroupPlan, result: Any, response: Any,
                      reason: str, seconds: float) -> bool:
        """Write the job's new schedule and status; False when it was refused instead."""
        async with self.reporter.state(job).lock:
            return await self._write(job, plan, result, response, reason, seconds)

    async def _write(self, job: CollectiveJob, plan: GroupPlan, result: Any, response: Any,
                     reason: str, seconds: float) -> bool:
        pl = plan.placements[job.key]
        slots = plan.slots[job.key]
        # Inflating megabytes of XML takes a while too: off the event loop.
        schedule = await asyncio.to_thread(_schedule, job, slots, result, self.packed)
        pod_ranks: dict[str, tuple[int, int]] = {}
        for r, s in enumerate(slots):
            lo, _ = pod_ranks.get(s.pod, (r, r))
            pod_ranks[s.pod] = (lo, r)
        if not schedule.verified:
            await self.reporter.update_jobs([job], {
                "Degraded": (True, "VerificationFailed", "; ".join(schedule.errors[:3])),
                "Synthesizing": (False, "Done", "the new schedule failed verification")},
                event=("Warning", "VerificationFailed"))
            metrics.RESYNTHESES.labels(reason=reason, result="unverified").inc()
            return False
        # Which ConfigMaps exist is asked while the XML is split, not after it.
        listing = asyncio.create_task(self._existing(job))
        try:
            # Splitting megabytes of XML per pod takes a while: keep the event loop answering.
            schedule, (name, parts, bodies) = await asyncio.to_thread(
                results.config_maps, job, schedule, pod_ranks, pl.pod_index, plan.inputs_hash,
                plan.fingerprint, self.split_bytes)
            too_big = results.oversized(bodies)
            if too_big:
                await self._too_large(job, plan, too_big, reason)
                return False
            await self._create(job, schedule, bodies, parts, await listing)
        finally:
            listing.cancel()
        state = self.reporter.state(job)
        new_maps = {name} if not parts else {p.name for p in parts}
        first = schedule.collectives[0] if schedule.collectives else None
        summary = first.summary() if first else ""
        extra = {
            "ranks": len(slots), "nodes": pl.nodes, "configMap": name,
            "configMapParts": [p.status() for p in parts],
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
        nccl_note = "".join(
            f"; NCCL {why} and runs " + ", ".join(ranges) + " (no file for those sizes)"
            for why, ranges in _left_to_nccl(schedule).items())
        updates: dict[str, status.Update] = {
            "Ready": (True, "Synthesized",
                      f"schedule {name} for {len(slots)} ranks{how}{nccl_note}"),
            "Synthesizing": (False, "Done", f"synthesized in {seconds:.2f} s"),
            "Infeasible": (False, "Feasible", "every rank is connected"),
            "Degraded": ((True, "DevicesFailed", f"{failed} of {len(pl.slots)} placed GPUs "
                          "have failed; the schedule uses the others") if failed else
                         (False, "Healthy", "the synthesizer answered")),
        }
        written = await self.reporter.update_jobs(
            [job], updates, extra=extra, event=("Normal", "Synthesized"),
            event_message=f"schedule {name} ({summary}) after {reason}")
        if not written:
            # The status still names the previous ConfigMaps: keep them and the new ones, and
            # publish again (the service has the schedule cached) until the status says so.
            state.keep |= new_maps
            asyncio.get_running_loop().call_later(self.retry_seconds, self.poke, "retry")
            return False
        state.inputs_hash = plan.inputs_hash
        state.config_map = name
        self._replace(state, new_maps)
        # Sizes left to NCCL for want of room are not asked for again (nor made) from now on.
        state.trims = results.trims(job, schedule)
        _gauge(job, state, schedule)
        return True

    def _replace(self, state: JobState, new_maps: set[str]) -> None:
        """Make ``new_maps`` the job's schedule. The one before stays for the window (one
        schedule back at most: any older one is collected as before), then a round collects
        it."""
        previous = state.keep - new_maps
        state.keep = new_maps
        if self.keep_replaced_seconds <= 0 or not previous:
            state.replaced = set()
            return
        state.replaced = previous
        state.replaced_until = time.monotonic() + self.keep_replaced_seconds
        asyncio.get_running_loop().call_later(self.keep_replaced_seconds, self.poke, "collect")

    async def _too_large(self, job: CollectiveJob, plan: GroupPlan, too_big: str,
                         reason: str) -> None:
        # The API server would refuse it on every retry: say so once, keep what pods have.
        self.reporter.state(job).inputs_hash = plan.inputs_hash
        metrics.RESYNTHESES.labels(reason=reason, result="rejected").inc()
        await self.reporter.update_jobs([job], {
            "Degraded": (True, "ScheduleTooLarge", too_big),
            "Synthesizing": (False, "Done", "the schedule does not fit in ConfigMaps")},
            event=("Warning", "ScheduleTooLarge"),
            extra={"lastSynthesis": {"time": status.now(), "reason": reason,
                                     "inputsHash": plan.inputs_hash}})

    async def _create(self, job: CollectiveJob, schedule: results.Schedule,
                      bodies: list[dict[str, Any]], parts: list[results.Part],
                      there: set[str]) -> None:
        """Create the schedule's ConfigMaps that are not ``there`` yet (one that exists is
        the same), and point the job's alias at a whole schedule."""
        path = f"/api/v1/namespaces/{job.namespace}/configmaps"
        # Names are content hashes: one that exists holds this schedule already. A schedule
        # that comes back (a failed GPU recovers while pods still mount its ConfigMaps) is
        # then not sent again, megabytes per pod, only for the API server to answer 409.
        whole = bodies[0]  # used only where the schedule is one ConfigMap
        bodies = [b for b in bodies if b["metadata"]["name"] not in there]
        # One ConfigMap per pod for large tenants: written side by side, a few at a time.
        writes = asyncio.Semaphore(CONFIGMAP_WRITES)

        async def create(body: dict[str, Any]) -> None:
            async with writes:
                try:
                    await self.api.create(path, body)
                except ApiException as err:
                    if err.status != 409:
                        raise

        await asyncio.gather(*(create(body) for body in bodies))
        if parts:
            return
        # The whole schedule's one body holds its data already: no file is inflated again.
        alias = results.alias_body(job, whole, schedule.content_hash())
        if alias["metadata"]["name"] not in there:
            try:
                await self.api.create(path, alias)
                return
            except ApiException as err:
                if err.status != 409:
                    raise
        await self.api.merge_patch(f"{path}/{alias['metadata']['name']}",
                                   results.alias_patch(job, alias))

    async def _existing(self, job: CollectiveJob) -> set[str]:
        """Names of the job's ConfigMaps now (none known if the listing fails: every create
        is then tried, and one that exists answers 409)."""
        try:
            listing = await self.api.list_metadata(_listing_path(job))
        except CALL_ERRORS as err:
            log.warning("listing ConfigMaps of %s: %s", job.key, describe(err))
            return set()
        return {cm["metadata"]["name"] for cm in listing.get("items") or []}

    # ---- garbage collection ------------------------------------------------------------------
    async def collect(self, jobs: list[CollectiveJob], pods: list[PodInfo]) -> None:
        """Delete a job's old ConfigMaps once no pod mounts them (only if mounts changed)."""
        mounted: dict[str, set[str]] = {}
        for pod in pods:
            if pod.active:
                mounted.setdefault(pod.namespace, set()).update(pod.config_maps)
        for job in jobs:
            state = self.reporter.state(job)
            if not state.keep:
                continue
            mine = frozenset(m for m in mounted.get(job.namespace, ())
                             if m.startswith(f"{job.name[:230]}-"))
            if state.mounted != mine or _replaced_expired(state):
                await self.gc(job, mine)

    async def gc(self, job: CollectiveJob, mounted: frozenset[str] | None = None) -> None:
        """Delete the job's ConfigMaps that nothing uses; ``mounted`` defaults to what the
        pods mount now."""
        if mounted is None:
            mounted = frozenset(m for p in self.pods()
                                if p.active and p.namespace == job.namespace
                                for m in p.config_maps)
        state = self.reporter.state(job)
        async with state.lock:
            await self._collect_unused(job, state, mounted)

    async def _collect_unused(self, job: CollectiveJob, state: JobState,
                              mounted: frozenset[str]) -> None:
        # Housekeeping, never retried by rounds (a sick API server would hold each round for
        # a timeout per job): what a failed call leaves is collected at the job's next
        # publication or change of mounts.
        state.mounted = mounted
        held = state.replaced if time.monotonic() < state.replaced_until else set()
        state.replaced = held
        try:
            listing = await self.api.list_metadata(_listing_path(job))
            # What the job's status names right now is never garbage, whatever this replica
            # remembers: after a takeover its index may still hold an older status.
            named = named_config_maps(
                await self.api.get(job_path(job.namespace, job.name, "status")))
        except CALL_ERRORS as err:
            log.warning("listing ConfigMaps of %s: %s", job.key, describe(err))
            return
        unused = []
        for cm in listing.get("items") or []:
            meta = cm["metadata"]
            owners = {o.get("uid") for o in meta.get("ownerReferences") or []}
            name = meta["name"]
            if (job.metadata.uid not in owners or name in state.keep or name in held
                    or name in mounted or name in named or name == results.alias_name(job.name)):
                continue
            unused.append(name)
        # A few at a time, as they were created: one after another, a large tenant's 128 held
        # its lock, and so its next publication, for about a second.
        deletes = asyncio.Semaphore(CONFIGMAP_WRITES)
        unanswered = False

        async def delete(name: str) -> None:
            nonlocal unanswered
            async with deletes:
                if unanswered:  # the rest would wait a timeout each
                    return
                try:
                    await self.api.delete(f"/api/v1/namespaces/{job.namespace}/configmaps/{name}")
                except ApiException as err:
                    if err.status != 404:
                        log.warning("deleting ConfigMap %s: %s", name, describe(err))
                except CALL_ERRORS as err:
                    unanswered = True
                    log.warning("deleting ConfigMap %s: %s; the rest wait for the next "
                                "collection", name, describe(err))

        await asyncio.gather(*(delete(name) for name in unused))


def _replaced_expired(state: JobState) -> bool:
    """The replaced schedule's window has passed and it still waits to be collected."""
    return bool(state.replaced) and time.monotonic() >= state.replaced_until


def _listing_path(job: CollectiveJob) -> str:
    """The job's ConfigMaps, by their label (names only: metadata is all a listing reads)."""
    return (f"/api/v1/namespaces/{job.namespace}/configmaps"
            f"?labelSelector={results.LABEL_JOB}={job.name[:63]}")


_WHY = {results.NCCL_FASTER: "is predicted faster",
        results.CONFIGMAP_LIMIT: "keeps the sizes whose files would not fit a pod's ConfigMap"}


def _left_to_nccl(schedule: results.Schedule) -> dict[str, list[str]]:
    """The size ranges NCCL runs, by why."""
    out: dict[str, list[str]] = {}
    for c in schedule.collectives:
        for r in c.nccl_ranges:
            out.setdefault(_WHY[r.reason], []).append(
                f"{c.name} {format_size(r.min_bytes)}..{format_size(r.max_bytes)}")
    return out


def _schedule(job: CollectiveJob, slots: list[RankSlot], result: Any,
              packed: bool = False) -> results.Schedule:
    """The tenant's part of a synthesizer response as files, ranks and predictions. Sizes
    below the response's first bucket were asked for no more (their files did not fit a
    pod's ConfigMap): NCCL runs them."""
    schedule = results.Schedule(files=results.Files(), dialect=job.spec.dialect, packed=packed,
                                ranks=[
        {"rank": r, "pod": s.pod, "node": s.node, "gpu": s.gpu} for r, s in enumerate(slots)])
    ship_anyway = job.spec.when_nccl_faster == SHIP_ANYWAY
    parts = pod_part_ends(slots)  # as the request named them
    for spec, coll in zip(job.spec.collectives, result.collectives, strict=True):
        best = None
        sizes: dict[tuple[int, int], results.SizeRange] = {}
        if coll.buckets and coll.buckets[0].min_bytes > spec.min_bytes:
            lo = int(coll.buckets[0].min_bytes)
            sizes[(spec.min_bytes, lo - 1)] = results.SizeRange(
                spec.min_bytes, lo - 1, True, None, reason=results.CONFIGMAP_LIMIT)
        for b, bucket in enumerate(coll.buckets):
            p = bucket.prediction
            to_nccl = results.nccl_runs(bucket, ship_anyway)
            key = results.xml_key(spec.name, b)
            served = sizes.setdefault((bucket.min_bytes, bucket.max_bytes), results.SizeRange(
                int(bucket.min_bytes), int(bucket.max_bytes), to_nccl,
                p.speedup_vs_nccl if p.nccl_choice else None,
                reason=results.NCCL_FASTER if to_nccl else ""))
            if not to_nccl:  # one range may have two files (legacy: in place, out of place)
                sizes[(bucket.min_bytes, bucket.max_bytes)] = replace(
                    served, files=(*served.files, key))
                schedule.files.add(key, bucket_body(bucket), bucket_member_ends(bucket),
                                   parts)
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
                tuple(sorted(sizes.values(), key=lambda r: r.min_bytes)), best.engine))
    return schedule


def _gauge(job: CollectiveJob, state: JobState, schedule: results.Schedule) -> None:
    """Set the tenant's predicted-performance series to the published schedule's."""
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


def named_config_maps(job: Mapping[str, Any]) -> set[str]:
    """The ConfigMaps a CollectiveJob's status names (its schedule's, whole or in parts)."""
    st = job.get("status") or {}
    parts = {p.get("name") for p in st.get("configMapParts") or () if isinstance(p, dict)}
    return {n for n in parts | {st.get("configMap")} if isinstance(n, str) and n}


def release_memory() -> None:
    """Hand freed heap back to the OS. Publishing inflates tens of megabytes of XML, partly in
    worker threads, and glibc keeps such memory in its arenas; without this the operator's
    resident size stays near its largest publication's peak."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to do
        ctypes.CDLL("libc.so.6").malloc_trim(0)
