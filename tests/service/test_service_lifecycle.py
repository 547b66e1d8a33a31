"""A server process from start to SIGTERM: warm-up, health, draining, exit; TLS; metrics."""

from __future__ import annotations

import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from service_helpers import Running, Subprocess, quick_request, wait_serving

from choreo.generators import build
from choreo.service.client import (
    Client,
    RequestOptions,
    TenantRequest,
    build_request,
    open_channel,
)

pytestmark = pytest.mark.slow

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _medium_request() -> object:
    """Seconds of solving on 64 NPUs: long enough to be in flight across a SIGTERM."""
    fabric = build("3d-rfs-64")
    return build_request(fabric, [TenantRequest.one("draining", fabric.npus, "allreduce",
                                                    1 << 30, chunks=8)],
                         RequestOptions(restarts=64))


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


def _health(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        return int(health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="choreo.synthesizer.v1.Synthesizer"),
            timeout=5).status)


def test_health_not_serving_while_warming_then_serving(
        subprocess_server: Callable[..., Subprocess]) -> None:
    server = subprocess_server("--workers", "1", "--warmup-topology", "torus-8x8x4")
    seen = wait_serving(server.address)
    assert seen[0] == NOT_SERVING
    assert seen[-1] == SERVING


def test_sigterm_drains_in_flight_work_and_refuses_new(
        subprocess_server: Callable[..., Subprocess]) -> None:
    server = subprocess_server("--workers", "1", "--queue", "2", "--grace", "120",
                               "--warmup-topology", "ring-8")
    wait_serving(server.address)
    channel = open_channel(server.address)
    client = Client(channel)
    call = client.future(_medium_request(), timeout=300)  # type: ignore[arg-type]
    # generous bounds: the machine may be shared; the assertions are about order, not speed
    end = time.monotonic() + 90
    while "choreo_synthesizer_workers_busy 1.0" not in _scrape(server.metrics_port):
        assert time.monotonic() < end, "the request never started"
        time.sleep(0.05)
    server.terminate()
    end = time.monotonic() + 30
    while _health(server.address) != NOT_SERVING:
        assert time.monotonic() < end, "health stayed SERVING after SIGTERM"
        time.sleep(0.02)
    with pytest.raises(grpc.RpcError) as info:
        client.synthesize(quick_request("latecomer"), timeout=10)
    assert info.value.code() is grpc.StatusCode.UNAVAILABLE
    assert call.running() or call.done()
    response = call.result(timeout=240)
    assert response.tenants[0].collectives[0].buckets[0].verification.ok
    assert server.proc.wait(timeout=30) == 0
    channel.close()
    assert "draining" in server.log.read_text()


def test_sigterm_grace_period_cancels_what_is_left(
        subprocess_server: Callable[..., Subprocess]) -> None:
    server = subprocess_server("--workers", "1", "--grace", "1", "--warmup-topology", "ring-8")
    wait_serving(server.address)
    with open_channel(server.address) as channel:
        call = Client(channel).future(_medium_request(), timeout=300)  # type: ignore[arg-type]
        end = time.monotonic() + 90
        while "choreo_synthesizer_workers_busy 1.0" not in _scrape(server.metrics_port):
            assert time.monotonic() < end
            time.sleep(0.05)
        t0 = time.monotonic()
        server.terminate()
        with pytest.raises(grpc.RpcError) as info:
            call.result(timeout=60)
        assert info.value.code() is grpc.StatusCode.UNAVAILABLE
        assert server.proc.wait(timeout=30) == 0
        assert time.monotonic() - t0 < 30  # grace 1 s: far less than the 120 s drain above


# ---- TLS -----------------------------------------------------------------------------------


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a server certificate for localhost/127.0.0.1 and a client certificate."""
    d = tmp_path_factory.mktemp("certs")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
             "/CN=choreo-test-ca", "-keyout", "ca.key", "-out", "ca.crt", cwd=d)
    (d / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    for who in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN=choreo-{who}",
                 "-keyout", f"{who}.key", "-out", f"{who}.csr", cwd=d)
        _openssl("x509", "-req", "-in", f"{who}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-days", "1", "-extfile", "san.ext", "-out", f"{who}.crt",
                 cwd=d)
    return d


def test_mutual_tls_handshake(server_factory: Callable[..., Running], certs: Path) -> None:
    running = server_factory(workers=1, queue=2, tls_cert=str(certs / "server.crt"),
                             tls_key=str(certs / "server.key"),
                             tls_client_ca=str(certs / "ca.crt"))
    address = running.address
    with open_channel(address, ca=str(certs / "ca.crt"), cert=str(certs / "client.crt"),
                      key=str(certs / "client.key")) as channel:
        resp = Client(channel).synthesize(quick_request("tls"), timeout=60)
        assert resp.tenants[0].collectives[0].buckets[0].verification.ok
    # no client certificate: the server refuses the handshake
    with open_channel(address, ca=str(certs / "ca.crt")) as channel, \
            pytest.raises(grpc.RpcError) as info:
        Client(channel).synthesize(quick_request("tls"), timeout=10)
    assert info.value.code() is grpc.StatusCode.UNAVAILABLE
    # plaintext against a TLS port fails too
    with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as info:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert info.value.code() is grpc.StatusCode.UNAVAILABLE


def test_server_only_tls(server_factory: Callable[..., Running], certs: Path) -> None:
    running = server_factory(workers=1, queue=2, tls_cert=str(certs / "server.crt"),
                             tls_key=str(certs / "server.key"))
    with open_channel(running.address, ca=str(certs / "ca.crt")) as channel:
        status = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=30, wait_for_ready=True).status
    assert status == SERVING


# ---- metrics and reflection ----------------------------------------------------------------


def test_metrics_are_exposed(server_factory: Callable[..., Running]) -> None:
    running = server_factory(workers=1, queue=2)
    request = quick_request("metrics")
    running.client.synthesize(request, timeout=60)
    running.client.synthesize(request, timeout=60)
    with pytest.raises(grpc.RpcError):
        running.client.synthesize(b"\xff\xff", timeout=10)
    text = running.metrics_text()
    assert 'choreo_synthesizer_requests_total{code="OK",method="Synthesize"} 2.0' in text
    assert ('choreo_synthesizer_requests_total{code="INVALID_ARGUMENT",method="Synthesize"} 1.0'
            in text)
    assert "choreo_synthesizer_cache_hits_total 1.0" in text
    assert "choreo_synthesizer_cache_misses_total 1.0" in text
    assert "choreo_synthesizer_synthesis_duration_seconds_count 1.0" in text
    assert 'choreo_synthesizer_synthesis_duration_seconds_bucket{le="300.0"} 1.0' in text
    assert "choreo_synthesizer_queue_depth 0.0" in text


def test_reflection_lists_the_service_only_when_enabled(
        server_factory: Callable[..., Running]) -> None:
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    def services(running: Running) -> list[str]:
        stub = reflection_pb2_grpc.ServerReflectionStub(running.client.channel)
        reqs = iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        try:
            # Channels check health before calling: wait until the fresh server serves.
            [resp] = list(stub.ServerReflectionInfo(reqs, timeout=30, wait_for_ready=True))
        except grpc.RpcError as err:
            assert err.code() is grpc.StatusCode.UNIMPLEMENTED
            return []
        return [s.name for s in resp.list_services_response.service]

    assert "choreo.synthesizer.v1.Synthesizer" in services(
        server_factory(workers=1, queue=1, reflection=True))
    assert services(server_factory(workers=1, queue=1)) == []


def test_concurrent_clients_all_succeed(server_factory: Callable[..., Running]) -> None:
    running = server_factory(workers=2, queue=16)
    results: list[bool] = []

    def one(i: int) -> None:
        resp = running.client.synthesize(quick_request(f"c{i % 4}", seed=i % 4), timeout=120)
        results.append(resp.tenants[0].collectives[0].buckets[0].verification.ok)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert results == [True] * 16
