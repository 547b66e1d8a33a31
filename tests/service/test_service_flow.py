"""Queueing, deadlines, cancellation and supersession on a one-worker server.

A "slow" request keeps the only worker busy for tens of seconds; every test checks that the
worker is free again within a few seconds of the slow request being given up, which it
could not be if the abandoned solve kept running.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
import pytest
from service_helpers import Running, quick_request, slow_request

from choreo.service.status import details_of

pytestmark = pytest.mark.slow

FREED_WITHIN = 8.0  # seconds: respawn a worker and solve a quick request (slow one: > 30 s)


def _wait_busy(running: Running, timeout: float = 30.0) -> None:
    """Until the worker has taken a job (the busy gauge says so)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if running.server.metrics.busy._value.get() >= 1:
            return
        time.sleep(0.02)
    raise AssertionError("the worker never started the slow request")


def _assert_worker_free(running: Running, tenant: str) -> None:
    t0 = time.monotonic()
    resp = running.client.synthesize(quick_request(tenant), timeout=FREED_WITHIN)
    assert resp.tenants[0].collectives[0].buckets[0].verification.ok
    assert time.monotonic() - t0 < FREED_WITHIN


@pytest.fixture
def one_worker(server_factory: Callable[..., Running]) -> Running:
    return server_factory(workers=1, queue=1)


def test_full_queue_is_resource_exhausted_with_error_info(one_worker: Running) -> None:
    running = one_worker
    first = running.client.future(slow_request("q1"), timeout=120)
    _wait_busy(running)
    second = running.client.future(slow_request("q2"), timeout=120)
    end = time.monotonic() + 10
    while running.server.pool.depth < 1 and time.monotonic() < end:
        time.sleep(0.02)
    with pytest.raises(grpc.RpcError) as info:
        running.client.synthesize(quick_request("q3"), timeout=30)
    err = info.value
    assert err.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert details_of(err)["ErrorInfo"].reason == "QUEUE_FULL"  # type: ignore[attr-defined]
    assert "choreo_synthesizer_queue_depth 1.0" in running.metrics_text()
    first.cancel()
    second.cancel()
    _assert_worker_free(running, "q4")
    assert "choreo_synthesizer_queue_depth 0.0" in running.metrics_text()


def test_client_deadline_is_deadline_exceeded_and_frees_the_worker(one_worker: Running) -> None:
    running = one_worker
    t0 = time.monotonic()
    with pytest.raises(grpc.RpcError) as info:
        running.client.synthesize(slow_request("d1"), timeout=2.0)
    assert info.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - t0 < 5
    _assert_worker_free(running, "d2")


def test_server_side_deadline_hint_is_deadline_exceeded(one_worker: Running) -> None:
    running = one_worker
    t0 = time.monotonic()
    with pytest.raises(grpc.RpcError) as info:
        running.client.synthesize(slow_request("h1", deadline=1.5), timeout=60)
    err = info.value
    assert err.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    assert details_of(err)["ErrorInfo"].reason == "DEADLINE"  # type: ignore[attr-defined]
    assert time.monotonic() - t0 < 10
    _assert_worker_free(running, "h2")


def test_cancelled_call_frees_the_worker(one_worker: Running) -> None:
    running = one_worker
    call = running.client.future(slow_request("c1"), timeout=120)
    _wait_busy(running)
    assert call.cancel()
    with pytest.raises(grpc.FutureCancelledError):
        call.result()
    _assert_worker_free(running, "c2")
    end = time.monotonic() + 10
    text = ""
    while time.monotonic() < end:
        text = running.metrics_text()
        if 'code="CANCELLED"' in text:
            break
        time.sleep(0.1)
    assert 'choreo_synthesizer_requests_total{code="CANCELLED",method="Synthesize"} 1.0' in text


def test_newer_request_for_the_same_tenant_aborts_the_older(one_worker: Running) -> None:
    running = one_worker
    older = running.client.future(slow_request("team-a", seed=1), timeout=120)
    _wait_busy(running)
    t0 = time.monotonic()
    newer = running.client.synthesize(quick_request("team-a", seed=2), timeout=FREED_WITHIN)
    assert time.monotonic() - t0 < FREED_WITHIN
    assert newer.tenants[0].name == "team-a"
    with pytest.raises(grpc.RpcError) as info:
        older.result(timeout=10)
    err = info.value
    assert err.code() is grpc.StatusCode.ABORTED
    assert details_of(err)["ErrorInfo"].reason == "SUPERSEDED"  # type: ignore[attr-defined]
    assert running.server.metrics.superseded._value.get() == 1


def test_not_modified_reply_also_aborts_older_work(one_worker: Running) -> None:
    running = one_worker
    settled = running.client.synthesize(quick_request("team-b", seed=5), timeout=60)
    older = running.client.future(slow_request("team-b", seed=6), timeout=120)
    _wait_busy(running)
    request = quick_request("team-b", seed=5)
    request.known_result_id = settled.result_id
    assert running.client.synthesize(request, timeout=10).not_modified
    with pytest.raises(grpc.RpcError) as info:
        older.result(timeout=10)
    assert info.value.code() is grpc.StatusCode.ABORTED
    _assert_worker_free(running, "team-c")


def test_same_idempotency_key_supersedes_across_tenant_names(one_worker: Running) -> None:
    running = one_worker
    older = running.client.future(slow_request("x", key="job-7"), timeout=120)
    _wait_busy(running)
    running.client.synthesize(quick_request("y", key="job-7"), timeout=FREED_WITHIN)
    with pytest.raises(grpc.RpcError) as info:
        older.result(timeout=10)
    assert info.value.code() is grpc.StatusCode.ABORTED


def test_identical_retry_joins_the_running_job(one_worker: Running) -> None:
    """Same content, same scope: one solve serves both callers (queue=1 has room for no
    second slow job beside the running one, yet both succeed)."""
    running = one_worker
    request = quick_request("joiner", seed=3, topology="3d-rfs-64", hi=1 << 30)
    first = running.client.future(request, timeout=120)
    _wait_busy(running)
    second = running.client.future(request, timeout=120)
    a, b = first.result(), second.result()
    assert not a.cache_hit and not b.cache_hit  # b joined the solve, it was not answered later
    assert a.tenants == b.tenants
    assert running.server.metrics.duration._sum.get() > 0
    samples = [s for m in running.server.metrics.duration.collect() for s in m.samples
               if s.name.endswith("_count")]
    assert samples[0].value == 1


def test_leaving_joiner_does_not_cancel_the_others(one_worker: Running) -> None:
    running = one_worker
    request = quick_request("stayer", seed=4, topology="3d-rfs-64", hi=1 << 30)
    staying = running.client.future(request, timeout=120)
    _wait_busy(running)
    leaving = running.client.future(request, timeout=120)
    time.sleep(0.2)
    leaving.cancel()
    resp = staying.result()
    assert resp.tenants[0].collectives[0].buckets[0].verification.ok
