"""One active operator among replicas: leader election on a ``coordination.k8s.io`` Lease.

The protocol is client-go's: a candidate takes the Lease when it is free or when its holder has
not renewed it for ``lease_seconds`` as observed here (never comparing clocks across
machines); the holder renews it every ``retry_seconds`` and every write carries the
resourceVersion it read, so two candidates never both win. A leader that cannot renew within
``renew_seconds`` stops leading, drops what it held in memory (the caller's
``on_stopped``) and campaigns again as a standby; an API server that was only restarting
gives the Lease straight back to its holder. A leader that shuts down cleanly releases the
Lease, so a standby takes over at its next try instead of waiting out the lease.

Every replica keeps its kopf indexes warm; only the leader reconciles and writes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

from choreo_api.kube import describe
from choreo_operator.kube import CALL_ERRORS, ApiException

log = logging.getLogger("choreo.operator.leader")
T = TypeVar("T")


class LeaseApi(Protocol):
    async def get(self, path: str) -> Any: ...
    async def create(self, path: str, body: dict[str, Any]) -> Any: ...
    async def replace(self, path: str, body: dict[str, Any]) -> Any: ...


@dataclass(frozen=True)
class Election:
    namespace: str
    name: str
    identity: str
    lease_seconds: float = 8.0
    renew_seconds: float = 6.0
    retry_seconds: float = 1.0

    @property
    def collection(self) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Elector:
    def __init__(self, api: LeaseApi, election: Election) -> None:
        self.api = api
        self.election = election
        self.leading = False
        self.holder = ""  # the Lease's holder as last read
        self.transitions = 0  # the Lease's leaseTransitions as last written by this replica
        self._seen: tuple[str, float] | None = None  # (resourceVersion, when first seen)

    def _spec(self, transitions: int, acquired: str | None = None) -> dict[str, Any]:
        e = self.election
        now = _now()
        return {"holderIdentity": e.identity, "leaseDurationSeconds": round(e.lease_seconds),
                "acquireTime": acquired or now, "renewTime": now,
                "leaseTransitions": transitions}

    async def try_acquire_or_renew(self) -> bool:
        """One attempt; True when this replica holds the Lease afterwards."""
        e = self.election
        path = f"{e.collection}/{e.name}"
        try:
            lease = await self.api.get(path)
        except ApiException as err:
            if err.status != 404:
                raise
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": e.name, "namespace": e.namespace},
                    "spec": self._spec(0)}
            try:
                await self.api.create(e.collection, body)
            except ApiException as err2:
                if err2.status == 409:
                    return False
                raise
            return True
        spec = lease.get("spec") or {}
        meta = lease["metadata"]
        holder = self.holder = spec.get("holderIdentity") or ""
        version = str(meta.get("resourceVersion", ""))
        if self._seen is None or self._seen[0] != version:
            self._seen = (version, time.monotonic())
        expired = time.monotonic() - self._seen[1] > float(
            spec.get("leaseDurationSeconds") or e.lease_seconds)
        if holder and holder != e.identity and not expired:
            return False
        transitions = int(spec.get("leaseTransitions") or 0) + (holder != e.identity)
        acquired = spec.get("acquireTime") if holder == e.identity else None
        body = {**lease, "spec": self._spec(transitions, acquired)}
        try:
            await self.api.replace(path, body)
        except ApiException as err:
            if err.status == 409:  # someone else wrote first: read again next time
                return False
            raise
        self.transitions = transitions
        if holder != e.identity:
            log.info("took the Lease %s/%s from %r", e.namespace, e.name, holder or "nobody")
        return True

    async def release(self) -> None:
        """Hand the Lease back at a clean shutdown, so a standby need not wait it out."""
        e = self.election
        path = f"{e.collection}/{e.name}"
        try:
            lease = await self.api.get(path)
            if (lease.get("spec") or {}).get("holderIdentity") != e.identity:
                return
            spec = {**lease["spec"], "holderIdentity": "", "leaseDurationSeconds": 1}
            await self.api.replace(path, {**lease, "spec": spec})
            log.info("released the Lease %s/%s", e.namespace, e.name)
        except CALL_ERRORS as err:
            log.warning("releasing the Lease: %s", describe(err))

    async def run(self, on_started: Callable[[], Awaitable[None]],
                  on_stopped: Callable[[], Awaitable[None]]) -> None:
        """Campaign; lead while renewals succeed; on a loss call ``on_stopped`` and campaign
        again, until cancelled."""
        e = self.election
        renewed = time.monotonic()
        while True:
            # A leader's renewal may take no longer than its lead lasts: a call still
            # hanging when the Lease could have passed to another replica counts as lost.
            budget = e.renew_seconds - (time.monotonic() - renewed) if self.leading else None
            try:
                ok = await asyncio.wait_for(self.try_acquire_or_renew(),
                                            None if budget is None else max(budget, 0.1))
            except CALL_ERRORS as err:
                log.warning("Lease %s/%s: %s", e.namespace, e.name, describe(err))
                ok = False
            if ok:
                renewed = time.monotonic()
                if not self.leading:
                    self.leading = True
                    log.info("leading as %s", e.identity)
                    await on_started()
            elif self.leading and (self.holder not in ("", e.identity)
                                   or time.monotonic() - renewed > e.renew_seconds):
                self.leading = False
                log.error("lost the Lease %s/%s (held by %r; last renewed %.1f s ago)",
                          e.namespace, e.name, self.holder, time.monotonic() - renewed)
                await on_stopped()
            await asyncio.sleep(e.retry_seconds)


class ElectionThread:
    """An Elector on a thread and event loop of its own, as client-go runs it in a goroutine.

    On the operator's loop a renewal waits behind whatever runs there: with 5,000 nodes, a
    round's placement and the per-pod cuts held that loop for seconds, renewals timed out
    every 15 s and every step-down dropped the round in flight, so nothing was published.
    Here renewals keep their cadence (the GIL is handed over every few milliseconds);
    ``on_started`` and ``on_stopped`` still run on the caller's loop, which owns what they
    start and stop. ``api`` is used only on this thread's loop.
    """

    def __init__(self, api: LeaseApi, election: Election) -> None:
        self.elector = Elector(api, election)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="choreo-lease")
        self._task: concurrent.futures.Future[None] | None = None

    @property
    def leading(self) -> bool:
        return self.elector.leading

    @property
    def transitions(self) -> int:
        return self.elector.transitions

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the election's loop (the Lease client's login, its closing)."""
        if not self._thread.is_alive():
            self._thread.start()
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    async def start(self, on_started: Callable[[], Awaitable[None]],
                    on_stopped: Callable[[], Awaitable[None]]) -> None:
        """Campaign; the callbacks run on the calling loop."""
        home = asyncio.get_running_loop()

        def there(callback: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
            async def run() -> None:
                await asyncio.wrap_future(
                    asyncio.run_coroutine_threadsafe(_awaited(callback), home))
            return run

        if not self._thread.is_alive():
            self._thread.start()
        self._task = asyncio.run_coroutine_threadsafe(
            self.elector.run(there(on_started), there(on_stopped)), self._loop)
        self._task.add_done_callback(_campaign_ended)

    def cancel(self) -> None:
        """Stop campaigning; a Lease held stays held until ``close``."""
        if self._task is not None:
            self._task.cancel()

    async def close(self, close_api: Callable[[], Awaitable[None]] | None = None) -> None:
        """Hand the Lease back if held, close the Lease client on its loop, end the thread."""
        self.cancel()
        if self._thread.is_alive():
            if self.elector.leading:
                await self.call(self.elector.release())
            if close_api is not None:
                await self.call(_awaited(close_api))
            self._loop.call_soon_threadsafe(self._loop.stop)
            await asyncio.to_thread(self._thread.join, 5.0)


async def _awaited(callback: Callable[[], Awaitable[None]]) -> None:
    await callback()


def _campaign_ended(task: concurrent.futures.Future[None]) -> None:
    """The campaign only ends when cancelled; anything else would leave no leader here."""
    if not task.cancelled() and task.exception() is not None:
        log.error("leader election stopped: %r", task.exception())
