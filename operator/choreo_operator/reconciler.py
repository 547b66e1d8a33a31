"""The operator's core loop: settle a burst of events, plan the tenant groups, launch the
syntheses that are needed, and write what the operator sees.

Everything is derived from the current inputs (the kopf indexes), never from the events
themselves: a round rebuilds the fabric (cached while its inputs are unchanged), places every
tenant and plans each group (``planning``); a group whose inputs hash differs from the one
its members' status records is synthesized (``flights``) and its schedule published
(``publishing``) only if that hash is still current when the answer arrives. Statuses and
events are ``reporting``'s.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from choreo_operator import metrics, results
from choreo_operator.debounce import Debouncer
from choreo_operator.flights import Flights, Synthesizer
from choreo_operator.placement import Placer
from choreo_operator.planning import FabricCache, GroupPlan, Inputs, plan_groups
from choreo_operator.publishing import Publisher
from choreo_operator.reporting import Api, Reporter

log = logging.getLogger("choreo.operator")
REASON_ORDER = ("failure", "node", "nodefabric", "fabric", "job", "pods", "startup", "retry",
                "collect")


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
    keep_replaced_seconds: float = 0.0  # a replaced schedule's ConfigMaps stay this long
    packed: bool = False  # XML gzipped in ConfigMaps: pods get the sidecar that inflates it
    publish_slots: int = 2  # groups whose schedules are written at the same time
    request_slots: int = 8  # synthesis calls in flight at once


class Reconciler:
    def __init__(self, read: Callable[[], Inputs], api: Api, synth: Synthesizer,
                 settings: Settings | None = None) -> None:
        self.read = read
        self.settings = s = settings or Settings()
        self.debouncer = Debouncer(s.quiet_seconds, s.max_delay_seconds)
        self.fabrics = FabricCache()
        self.placer = Placer()
        self.reporter = Reporter(api)
        self.publisher = Publisher(api, self.reporter, lambda: self.read().pods, self.poke,
                                   split_bytes=s.split_bytes,
                                   retry_seconds=s.backoff_initial_seconds, packed=s.packed,
                                   keep_replaced_seconds=s.keep_replaced_seconds)
        self.flights = Flights(synth, self.reporter, self.publisher, self.poke,
                               timeout_seconds=s.call_timeout_seconds,
                               backoff_initial_seconds=s.backoff_initial_seconds,
                               backoff_max_seconds=s.backoff_max_seconds,
                               publish_slots=s.publish_slots, request_slots=s.request_slots)
        self.rounds = 0
        self._stopping = False

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
        await self.flights.stop()

    async def round(self, reasons: set[str], since: float) -> None:
        self.rounds += 1
        reason = next((r for r in REASON_ORDER if r in reasons), "startup")
        metrics.ROUNDS.labels(reason=reason).inc()
        started = time.monotonic()
        try:
            await self._round(reason, since)
        finally:  # a round that failed took its time too
            took = time.monotonic() - started
            metrics.ROUND_SECONDS.observe(took)
            log.debug("round %d (%s) took %.3f s", self.rounds, ", ".join(sorted(reasons)),
                      took)

    async def _round(self, reason: str, since: float) -> None:
        inputs = self.read()
        fabric, notes = self.fabrics.fabric(inputs)
        jobs = [j for j in inputs.jobs if j.metadata.deletion_timestamp is None]
        placements = self.placer.place(jobs, inputs.pods, fabric)
        self.reporter.forget_deleted({j.key for j in jobs})
        plans: list[GroupPlan] = []
        if fabric is not None:
            s = self.settings
            plans, blocked = plan_groups(
                jobs, placements, fabric, max_buckets=s.max_buckets, restarts=s.restarts,
                timeout_seconds=s.call_timeout_seconds, trims=self.reporter.trims(jobs),
                subs=self.fabrics.subs, packed=s.packed)
            self.fabrics.subs.keep_used()
            for job in jobs:
                if job.key in blocked:
                    await self.reporter.blocked(job, placements[job.key], blocked[job.key])
        self.flights.keep({p.group.scope for p in plans})
        for plan in plans:
            await self.flights.launch(plan, reason, since)
        # Bookkeeping after the syntheses are under way: it is not on their path.
        if fabric is not None:
            await self.reporter.fabric(inputs, fabric, notes, self.fabrics.fingerprint)
            await self.reporter.failures(inputs, fabric, placements)
        await self.reporter.invalid(inputs.invalid)
        await self.publisher.collect(jobs, inputs.pods)
        self.reporter.phase_metrics()
