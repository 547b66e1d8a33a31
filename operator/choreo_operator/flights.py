"""Syntheses in flight, one per tenant group: ask the synthesizer, retry what may succeed
later, and publish the answer if the group's inputs are still current.

A flight is tagged with the inputs hash it was started for. A round with other inputs for the
group replaces it, and an answer for inputs that are no longer current is dropped: only the
latest inputs are ever published. While the synthesizer is down, slow or busy the members say
so (Degraded, keeping their last good schedule) and the call is retried with exponential
backoff and jitter, until it answers or the inputs move on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, wait_exponential_jitter

from choreo.service.client import build_request
from choreo_api.kube import describe
from choreo_operator import metrics, status
from choreo_operator.model import resumed
from choreo_operator.planning import GroupPlan
from choreo_operator.publishing import Publisher, release_memory
from choreo_operator.reporting import Reporter
from choreo_operator.synthclient import Outcome, SynthesisError

log = logging.getLogger("choreo.operator")


class Synthesizer(Protocol):
    async def synthesize(self, request: Any, timeout: float) -> Any: ...


@dataclass
class Flight:
    inputs_hash: str
    task: asyncio.Task[None]


def _retryable(err: BaseException) -> bool:
    return isinstance(err, SynthesisError) and err.outcome is Outcome.RETRY


class Flights:
    def __init__(self, synth: Synthesizer, reporter: Reporter, publisher: Publisher,
                 poke: Callable[[str], None], *, timeout_seconds: float,
                 backoff_initial_seconds: float, backoff_max_seconds: float,
                 publish_slots: int, request_slots: int) -> None:
        self.synth = synth
        self.reporter = reporter
        self.publisher = publisher
        self.poke = poke
        self.timeout_seconds = timeout_seconds
        self.backoff_initial_seconds = backoff_initial_seconds
        self.backoff_max_seconds = backoff_max_seconds
        self.running: dict[str, Flight] = {}  # group scope -> its synthesis
        self.current: dict[str, str] = {}  # group scope -> inputs hash of the latest round
        self._publishing = asyncio.Semaphore(publish_slots)
        # A synthesizer refuses what its queue cannot hold. At startup every group asks at
        # once; refused, each would retry on a timer and write its status every time (2,486
        # refusals and as many status writes in 17 minutes at 5000 nodes), so the calls wait
        # their turn here instead, in the order they asked. A group keeps its turn until its
        # answer is published: answers came faster than the publication slots took them, and
        # up to 21 (6 MB each) waited at once at 5000 nodes, at the operator's peak memory.
        self._requesting = asyncio.Semaphore(request_slots)

    def keep(self, scopes: set[str]) -> None:
        """Cancel the flights of groups that no longer exist."""
        for scope in list(self.running):
            if scope not in scopes:
                self.running.pop(scope).task.cancel()
                self.current.pop(scope, None)

    async def launch(self, plan: GroupPlan, reason: str, since: float) -> None:
        """Synthesize the group unless its members' schedules are for these inputs already
        or a flight for them is under way."""
        scope = plan.group.scope
        self.current[scope] = plan.inputs_hash
        flight = self.running.get(scope)
        if flight is not None and flight.inputs_hash == plan.inputs_hash:
            return
        if self._up_to_date(plan):
            if flight is not None:
                flight.task.cancel()
                self.running.pop(scope)
            await self.reporter.current(plan.members)
            return
        if flight is not None:
            flight.task.cancel()
        task = asyncio.create_task(self._synthesize(plan, reason, since),
                                   name=f"synthesize-{scope}")
        self.running[scope] = Flight(plan.inputs_hash, task)

    async def stop(self) -> None:
        for flight in self.running.values():
            flight.task.cancel()
        for flight in list(self.running.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await flight.task
        self.running.clear()  # run again, a group's cancelled flight is started anew

    def _up_to_date(self, plan: GroupPlan) -> bool:
        for job in plan.members:
            state = self.reporter.jobs.get(job.key)
            last = resumed(job).last_synthesis
            done = (state.inputs_hash if state and state.inputs_hash
                    else last.inputs_hash if last else None)
            if done != plan.inputs_hash:
                return False
        return True

    def _stale(self, plan: GroupPlan) -> bool:
        return self.current.get(plan.group.scope) != plan.inputs_hash

    def _land(self, plan: GroupPlan) -> None:
        """Drop this task's flight: the group is synthesized again only when its inputs
        change. A flight that replaced it stays."""
        flight = self.running.get(plan.group.scope)
        if flight is not None and flight.task is asyncio.current_task():
            self.running.pop(plan.group.scope)

    # ---- one flight --------------------------------------------------------------------------
    async def _synthesize(self, plan: GroupPlan, reason: str, since: float) -> None:
        scope = plan.group.scope
        request = build_request(plan.request_fabric, plan.tenants, plan.options,
                                f"choreo-operator/{scope}:{plan.inputs_hash[:16]}")
        started = time.monotonic()
        waited = max(0.0, time.time() - since)  # the debounce window and the round
        marking = asyncio.create_task(self.reporter.update_jobs(plan.members, {"Synthesizing": (
            True, "Resynthesizing", f"{reason}: synthesizing {len(plan.members)} tenant(s)")}))
        try:
            async with self._requesting:
                response = await self._answer(plan, request, reason)
                if response is not None:
                    await self._publish(plan, response, reason, since, started, waited,
                                        marking)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            # A task that dies would keep its flight, and a flight with the current inputs is
            # never started again: say why, drop the flight and retry in a later round.
            log.exception("synthesis of %s failed", ", ".join(plan.group.members))
            metrics.RESYNTHESES.labels(reason=reason, result="error").inc()
            self._land(plan)
            with contextlib.suppress(Exception):
                await self.reporter.update_jobs(plan.members, {
                    "Degraded": (True, "OperatorError", f"{type(err).__name__}: {describe(err)}; "
                                 "keeping the last good schedule, retrying"),
                    "Synthesizing": (True, "Retrying", describe(err)[:500])},
                    event=("Warning", "OperatorError"))
            asyncio.get_running_loop().call_later(self.backoff_max_seconds, self.poke, "retry")
        finally:
            if not marking.done():
                marking.cancel()

    async def _answer(self, plan: GroupPlan, request: Any, reason: str) -> Any | None:
        """The synthesizer's answer for the group, or None when there is nothing to publish:
        the inputs moved on, or the synthesizer refused (which the members' status says)."""
        scope = plan.group.scope
        requests = [request]
        while True:
            try:
                return await self._retrying(plan, reason)(self._ask, requests)
            except SynthesisError as err:
                if self._stale(plan):
                    metrics.RESYNTHESES.labels(reason=reason, result="stale").inc()
                    return None
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
                await self._refused(plan, err, reason)
                return None

    async def _ask(self, requests: list[Any]) -> Any:
        """One answer for all ``requests`` (a joint one, or one per tenant)."""
        response = await self.synth.synthesize(requests[0], timeout=self.timeout_seconds)
        for extra in requests[1:]:
            more = await self.synth.synthesize(extra, timeout=self.timeout_seconds)
            response.tenants.extend(more.tenants)
        return response

    def _retrying(self, plan: GroupPlan, reason: str) -> AsyncRetrying:
        """Retries of what may succeed later (the synthesizer down, slow or busy), each said
        in the members' status with the time to the next, while the inputs are current."""

        async def degraded(state: RetryCallState) -> None:
            assert state.outcome is not None
            err = state.outcome.exception()
            assert isinstance(err, SynthesisError)
            metrics.RESYNTHESES.labels(reason=reason, result="error").inc()
            why = ("SynthesizerUnavailable" if err.code == "UNAVAILABLE"
                   else "SynthesizerSlow" if err.code == "DEADLINE_EXCEEDED"
                   else "SynthesizerError")
            await self.reporter.update_jobs(plan.members, {
                "Degraded": (True, why, f"{err}; keeping the last good schedule, "
                             f"retrying in {state.upcoming_sleep:.1f} s"),
                "Synthesizing": (True, "Retrying", str(err))}, event=("Warning", why))

        return AsyncRetrying(
            retry=retry_if_exception(_retryable),
            stop=lambda _: self._stale(plan),
            wait=wait_exponential_jitter(multiplier=self.backoff_initial_seconds,
                                         max=self.backoff_max_seconds,
                                         jitter=self.backoff_initial_seconds),
            before_sleep=degraded,
            reraise=True)

    async def _refused(self, plan: GroupPlan, err: SynthesisError, reason: str) -> None:
        """Infeasible or rejected: said once, and not asked again until the inputs change."""
        result = "infeasible" if err.outcome is Outcome.INFEASIBLE else "rejected"
        metrics.RESYNTHESES.labels(reason=reason, result=result).inc()
        for job in plan.members:
            self.reporter.state(job).inputs_hash = plan.inputs_hash
        await self.reporter.update_jobs(plan.members, {
            "Infeasible": (True, "Infeasible" if result == "infeasible" else "Rejected",
                           str(err)),
            "Synthesizing": (False, "Done", "the synthesizer refused the request")},
            event=("Warning", "Infeasible"), extra={"lastSynthesis": {
                "time": status.now(), "reason": reason, "inputsHash": plan.inputs_hash}})
        self._land(plan)

    async def _publish(self, plan: GroupPlan, response: Any, reason: str, since: float,
                       started: float, waited: float, marking: asyncio.Task[bool]) -> None:
        answered = time.monotonic()
        # Publishing inflates and splits megabytes of XML and writes them to the API server:
        # a few groups at a time, or a startup with many tenants would hold all of it at once.
        async with self._publishing:
            if self._stale(plan):
                metrics.RESYNTHESES.labels(reason=reason, result="stale").inc()
                return
            with contextlib.suppress(Exception):
                await marking
            by_name = {t.name: t for t in response.tenants}
            published = [job for job in plan.members if await self.publisher.publish(
                job, plan, by_name[job.key], response, reason, time.monotonic() - started)]
        self._land(plan)
        if len(published) == len(plan.members):  # otherwise each refusal was counted
            latency = max(0.0, time.time() - since)
            metrics.RESYNTHESES.labels(reason=reason, result="ok").inc()
            metrics.LATENCY.observe(latency)
            # A cached answer's synthesis_seconds are those of the solve that first made it.
            work = ("a cached result" if response.cache_hit
                    else f"of which its own work {response.synthesis_seconds:.2f} s")
            log.info("%s: published %.2f s after the %s event (the round %.2f s; synthesizer "
                     "%.2f s, %s; publishing %.2f s)",
                     ", ".join(plan.group.members), latency, reason, waited,
                     answered - started, work, time.monotonic() - answered)
        for job in published:
            await self.publisher.gc(job)
        release_memory()
