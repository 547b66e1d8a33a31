"""In-flight requests by scope: identical ones share a job, a newer different one supersedes.

A scope is the client's idempotency key or, without one, the set of tenant names. Within a
scope only the newest request matters: the operator re-asks for the same tenants when the
fabric changes, and the answer for the old fabric is then worthless, so the old job is
aborted (ABORTED) and its worker freed. An identical retry (same cache key) joins the running
job instead of starting another.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

import grpc

from choreo.service.pool import Job
from choreo.service.status import RequestError


def scope_of(idempotency_key: str, tenant_names: Iterable[str]) -> str:
    if idempotency_key:
        return "key:" + idempotency_key
    return "tenants:" + "\0".join(sorted(tenant_names))


class Flights:
    def __init__(self, on_supersede: Callable[[], object] = lambda: None) -> None:
        self.on_supersede = on_supersede
        self._by_scope: dict[str, Job] = {}
        self._lock = threading.Lock()

    def join_or_start(self, scope: str, key: str, deadline: float | None,
                      make: Callable[[], Job], submit: Callable[[Job], None]) -> Job:
        """The job to wait for: the running identical one, or a new one.

        A new job is submitted (``submit`` may refuse it, e.g. queue full) before the older
        one in the scope is aborted, so a refused request never costs the older its result.
        """
        with self._lock:
            current = self._by_scope.get(scope)
            if current is not None and not current.finished and current.key == key:
                current.attach(deadline)
                return current
            job = make()
            job.attach(deadline)
            submit(job)
            self._by_scope[scope] = job
        self._abort(current, scope)
        return job

    def supersede(self, scope: str, key: str) -> None:
        """Abort the scope's running job unless it is computing ``key``."""
        with self._lock:
            current = self._by_scope.get(scope)
            if current is None or current.key == key:
                return
            del self._by_scope[scope]
        self._abort(current, scope)

    def _abort(self, job: Job | None, scope: str) -> None:
        if job is not None and not job.finished:
            self.on_supersede()
            job.cancel(RequestError(
                grpc.StatusCode.ABORTED, "superseded by a newer request for the same tenants",
                reason="SUPERSEDED", metadata={"scope": scope.split(":", 1)[0]}))

    def forget(self, scope: str, job: Job) -> None:
        with self._lock:
            if self._by_scope.get(scope) is job:
                del self._by_scope[scope]

    def __len__(self) -> int:
        return len(self._by_scope)
