"""Real synthesizer servers and requests quick or slow to solve, for the service tests.

No channel is mocked: every test talks gRPC over 127.0.0.1 to a server started here, either
in this process or as a subprocess (stopped by its PID), and every server is stopped.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from choreo.generators import build
from choreo.service.api import pb
from choreo.service.client import (
    Client,
    RequestOptions,
    TenantRequest,
    build_request,
    open_channel,
)
from choreo.service.ports import listen_port
from choreo.service.server import ServerConfig, SynthesizerServer

ROOT = Path(__file__).resolve().parents[2]


def quick_request(tenant: str = "quick", *, seed: int = 0, topology: str = "3d-rfs-16",
                  lo: int = 1 << 20, hi: int = 64 << 20, key: str = "",
                  deadline: float = 0.0) -> pb.SynthesizeRequest:
    """A 16-NPU AllReduce over 1..64 MiB in two buckets: well under a second to solve."""
    fabric = build(topology)
    return build_request(fabric, [TenantRequest.one(tenant, fabric.npus, "allreduce", lo, hi)],
                         RequestOptions(seed=seed, max_buckets=2, deadline_seconds=deadline),
                         key)


def slow_request(tenant: str = "slow", *, seed: int = 0, key: str = "",
                 deadline: float = 0.0) -> pb.SynthesizeRequest:
    """A 256-NPU AllReduce with many chunks and restarts: tens of seconds of solving."""
    fabric = build("torus-8x8x4")
    return build_request(fabric, [TenantRequest.one(tenant, fabric.npus, "allreduce", 1 << 30,
                                                    chunks=8)],
                         RequestOptions(restarts=64, seed=seed, deadline_seconds=deadline), key)


@dataclass
class Running:
    """An in-process server and a client for it."""

    server: SynthesizerServer
    address: str
    client: Client

    def metrics_text(self) -> str:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.server.metrics_port}/metrics",
                                    timeout=5) as resp:
            return str(resp.read().decode())


def start_server(**overrides: object) -> Running:
    settings: dict[str, Any] = {"host": "127.0.0.1", "port": listen_port(), "metrics_port": 0,
                                "warmup_topology": "ring-8", "grace": 5.0}
    cfg = ServerConfig(**{**settings, **overrides})
    server = SynthesizerServer(cfg)
    port = server.start()
    assert server.pool.wait_ready(60), "workers did not warm up"
    address = f"127.0.0.1:{port}"
    return Running(server, address, Client(open_channel(address)))


@dataclass
class Subprocess:
    """``python -m choreo.service serve`` in a child process."""

    proc: subprocess.Popen[str]
    port: int
    metrics_port: int
    log: Path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def terminate(self) -> None:
        os.kill(self.proc.pid, signal.SIGTERM)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


def wait_for_port(port: int, proc: subprocess.Popen[str] | None = None,
                  timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"server exited early with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"nothing listened on port {port} within {timeout} s")


def wait_serving(address: str, timeout: float = 60.0) -> list[int]:
    """Poll health until SERVING; returns every status seen on the way."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    seen: list[int] = []
    end = time.monotonic() + timeout
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < end:
            status = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5).status
            if not seen or seen[-1] != status:
                seen.append(status)
            if status == health_pb2.HealthCheckResponse.SERVING:
                return seen
            time.sleep(0.02)
    raise AssertionError(f"not SERVING within {timeout} s (saw {seen})")
