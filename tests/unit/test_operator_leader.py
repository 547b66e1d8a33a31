"""Lease election against an in-memory API that enforces resourceVersion like the real one."""

from __future__ import annotations

import asyncio
import copy
import threading
import time
from typing import Any

from kubernetes_asyncio.client import ApiException

from choreo_operator.leader import Election, ElectionThread, Elector


class LeaseStore:
    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0

    async def get(self, path: str) -> Any:
        if self.lease is None:
            raise ApiException(status=404, reason="not found")
        return copy.deepcopy(self.lease)

    async def create(self, path: str, body: dict[str, Any]) -> Any:
        if self.lease is not None:
            raise ApiException(status=409, reason="exists")
        return await self._store(body)

    async def replace(self, path: str, body: dict[str, Any]) -> Any:
        assert self.lease is not None
        if body["metadata"].get("resourceVersion") != self.lease["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="the object has been modified")
        return await self._store(body)

    async def _store(self, body: dict[str, Any]) -> Any:
        self.version += 1
        self.lease = copy.deepcopy(body)
        self.lease["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(self.lease)


def _elector(store: LeaseStore, who: str) -> Elector:
    return Elector(store, Election("default", "op", who, lease_seconds=0.3, renew_seconds=0.2,
                                   retry_seconds=0.05))


def test_one_leader_and_a_takeover_only_after_the_lease_runs_out() -> None:
    store = LeaseStore()
    a, b = _elector(store, "a"), _elector(store, "b")

    async def main() -> None:
        assert await a.try_acquire_or_renew()
        assert not await b.try_acquire_or_renew()  # held and fresh
        stale = await store.get("")
        assert await a.try_acquire_or_renew()  # a renews: b's copy is out of date
        assert not await b.try_acquire_or_renew()
        await asyncio.sleep(0.2)
        assert await a.try_acquire_or_renew()
        assert not await b.try_acquire_or_renew()  # renewals keep it a's
        await asyncio.sleep(0.4)  # a stopped renewing: b sees no change for a whole lease
        assert await b.try_acquire_or_renew()
        assert not await a.try_acquire_or_renew() and a.holder == "b"
        # a write based on an old read loses, whoever makes it
        stale["spec"]["holderIdentity"] = "a"
        try:
            await store.replace("", stale)
            raise AssertionError("a stale write was accepted")
        except ApiException as err:
            assert err.status == 409
        assert store.lease is not None and store.lease["spec"]["leaseTransitions"] == 1

    asyncio.run(main())


def test_a_released_lease_is_taken_at_once() -> None:
    store = LeaseStore()
    a, b = _elector(store, "a"), _elector(store, "b")

    async def main() -> None:
        assert await a.try_acquire_or_renew()
        a.leading = True
        assert not await b.try_acquire_or_renew()
        await a.release()
        assert await b.try_acquire_or_renew()

    asyncio.run(main())


class HangingStore(LeaseStore):
    """An API server that stops answering: every call after ``hang`` is set never returns."""

    def __init__(self) -> None:
        super().__init__()
        self.hang = False

    async def get(self, path: str) -> Any:
        if self.hang:
            await asyncio.Event().wait()
        return await super().get(path)


def test_a_leader_whose_renewal_hangs_stops_leading_within_its_renew_time() -> None:
    store = HangingStore()
    a = _elector(store, "a")
    events: list[tuple[str, float]] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()

        async def started() -> None:
            events.append(("started", loop.time()))

        async def stopped() -> None:
            events.append(("stopped", loop.time()))

        task = asyncio.create_task(a.run(started, stopped))
        while not a.leading:
            await asyncio.sleep(0.01)
        store.hang = True
        hung_at = loop.time()
        for _ in range(200):
            if not a.leading:
                break
            await asyncio.sleep(0.01)
        task.cancel()
        assert not a.leading, "still leading while no renewal could complete"
        assert events[-1][0] == "stopped"
        # within renew_seconds (0.2) of the last renewal, plus a retry's sleep
        assert events[-1][1] - hung_at < 0.2 + 0.05 + 0.1

    asyncio.run(main())


def test_renewals_keep_their_cadence_while_the_operators_loop_is_busy() -> None:
    store = LeaseStore()
    election = ElectionThread(store, Election("default", "op", "a", lease_seconds=0.3,
                                              renew_seconds=0.2, retry_seconds=0.05))
    calls: list[tuple[str, int]] = []

    async def main() -> None:
        async def started() -> None:
            calls.append(("started", threading.get_ident()))

        async def stopped() -> None:
            calls.append(("stopped", threading.get_ident()))

        await election.start(started, stopped)
        for _ in range(200):
            if calls:
                break
            await asyncio.sleep(0.01)
        assert calls == [("started", threading.get_ident())], calls  # on this loop
        before = store.version
        time.sleep(1.0)  # a round holding the loop five times the renew time
        assert store.version - before >= 5, "renewals stalled behind the busy loop"
        await asyncio.sleep(0.1)
        assert election.leading and [c for c, _ in calls] == ["started"]
        election.cancel()
        await election.close()
        assert store.lease is not None and store.lease["spec"]["holderIdentity"] == ""

    asyncio.run(main())
