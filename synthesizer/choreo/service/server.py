"""The synthesizer server: gRPC, health, reflection, TLS, metrics, workers, draining.

Life cycle, as a Deployment behind a Service sees it:

1. start: the port opens at once with health NOT_SERVING; it turns SERVING when every
   worker process has started and warmed up, so no request waits for imports.
2. SIGTERM: health turns NOT_SERVING and new requests get UNAVAILABLE (clients retry on
   another replica) while requests in flight may finish within the grace period; then the
   gRPC server stops, cancelling whatever is left, and the workers are killed.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from concurrent import futures
from pathlib import Path
from types import FrameType

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from choreo.errors import InputError
from choreo.service.api import MAX_MESSAGE_BYTES, SERVICE
from choreo.service.cache import ResultCache
from choreo.service.metrics import Metrics
from choreo.service.pool import PoolStats, WorkerPool
from choreo.service.servicer import Synthesizer

log = logging.getLogger("choreo.service")

SWITCH_INTERVAL = 0.0005  # seconds


def rpc_server(workers: int, queue: int, max_message_bytes: int) -> grpc.Server:
    """A gRPC server with the service's thread pool and options, no handlers yet. Requests
    waiting for a worker hold a thread each; 32 more keep cache hits, health checks and
    refusals answered while every worker is busy."""
    options = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.so_reuseport", 0),
        # Clients reconnect (and resolve the headless Service again) now and then, so
        # replicas added later get their share of the requests.
        ("grpc.max_connection_age_ms", 5 * 60 * 1000),
        ("grpc.max_connection_age_grace_ms", 10 * 60 * 1000),
    ]
    pool = futures.ThreadPoolExecutor(max_workers=workers + queue + 32,
                                      thread_name_prefix="choreo-rpc")
    return grpc.server(pool, options=options)


class ServerConfig(BaseSettings):
    """``choreo serve``'s settings: each one's flag, ``CHOREO_SERVE_*`` variable and default."""

    model_config = SettingsConfigDict(env_prefix="CHOREO_SERVE_", frozen=True, extra="forbid")

    host: str = Field("[::]", description="address to listen on ([::]: all)")
    port: int = Field(50051, ge=0, le=65535, description="gRPC port (0: a free one)")
    metrics_port: int = Field(9090, ge=-1, le=65535, description="Prometheus /metrics port; "
                              "-1 turns the endpoint off")
    workers: int = Field(default_factory=lambda: os.cpu_count() or 1, ge=1,
                         description="synthesis processes (default: one per CPU)")
    queue: int = Field(16, ge=0, description="requests that may wait for a worker before "
                       "RESOURCE_EXHAUSTED")
    cache_mib: int = Field(256, ge=0, description="result cache size in MiB")
    grace: float = Field(30.0, ge=0, description="seconds requests in flight may take to "
                         "finish after SIGTERM")
    tls_cert: str | None = Field(None, description="server certificate (PEM); with --tls-key "
                                 "enables TLS")
    tls_key: str | None = Field(None, description="server private key (PEM)")
    tls_client_ca: str | None = Field(None, description="CA (PEM) that client certificates "
                                      "must chain to (mutual TLS)")
    reflection: bool = Field(False, description="enable gRPC server reflection")
    warmup_topology: str = Field("3d-rfs-16", description="built-in topology each worker "
                                 "solves once before the server reports SERVING ('' skips)")
    worker_nice: int = Field(10, ge=0, description="CPU niceness of the worker processes, so "
                             "cache hits and health checks win the CPU over solving (0 keeps "
                             "the server's)")
    max_message_bytes: int = Field(MAX_MESSAGE_BYTES, gt=0, description="largest gRPC "
                                   "message sent or received")


def server_credentials(cfg: ServerConfig) -> grpc.ServerCredentials | None:
    """TLS from mounted files (for example a Kubernetes Secret); mTLS with a client CA."""
    if not (cfg.tls_cert or cfg.tls_key or cfg.tls_client_ca):
        return None
    if not (cfg.tls_cert and cfg.tls_key):
        raise InputError("--tls-cert/--tls-key: TLS needs both a certificate and its key")
    cert, key = (_read(p, "--tls-cert") for p in (cfg.tls_cert, cfg.tls_key))
    ca = _read(cfg.tls_client_ca, "--tls-client-ca") if cfg.tls_client_ca else None
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca,
                                       require_client_auth=ca is not None)


def _read(path: str, flag: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as err:
        raise InputError(f"{flag}: cannot read {path}: {err.strerror}") from None


class SynthesizerServer:
    def __init__(self, cfg: ServerConfig) -> None:
        self.cfg = cfg
        self.metrics = Metrics()
        self.pool = WorkerPool(cfg.workers, cfg.queue, cfg.warmup_topology, PoolStats(
            queue_depth=self.metrics.queue_depth.set, busy=self.metrics.busy.set,
            duration=self.metrics.duration.observe), nice=cfg.worker_nice)
        self.servicer = Synthesizer(self.pool, ResultCache(cfg.cache_mib << 20), self.metrics)
        self.health = health.HealthServicer(experimental_non_blocking=True)
        self.grpc = rpc_server(cfg.workers, cfg.queue, cfg.max_message_bytes)
        self.grpc.add_generic_rpc_handlers((self.servicer.handler(),))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.grpc)
        if cfg.reflection:
            from grpc_reflection.v1alpha import reflection

            reflection.enable_server_reflection(
                (SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME), self.grpc)
        self.port = 0
        self.metrics_port: int | None = None
        self._stopped = threading.Event()
        self._stopping = threading.Lock()

    def start(self) -> int:
        """Listen, start the workers, and turn SERVING once they are warm; returns the port."""
        # Validating a fresh request is milliseconds of Python; with the default 5 ms switch
        # interval a cache hit on another thread could wait that long for the GIL.
        sys.setswitchinterval(SWITCH_INTERVAL)
        self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        address = f"{self.cfg.host}:{self.cfg.port}"
        creds = server_credentials(self.cfg)
        try:
            self.port = (self.grpc.add_secure_port(address, creds) if creds
                         else self.grpc.add_insecure_port(address))
        except RuntimeError as err:
            raise InputError(f"--port: cannot listen on {address}: {err}") from None
        if self.cfg.metrics_port >= 0:
            host = "127.0.0.1" if self.cfg.host in ("127.0.0.1", "localhost") else "0.0.0.0"
            self.metrics_port = self.metrics.serve(self.cfg.metrics_port, host)
        self.grpc.start()
        self.pool.start()
        threading.Thread(target=self._become_ready, name="choreo-warmup", daemon=True).start()
        log.info("synthesizer listening on %s (%s), metrics on %s", self.port,
                 "TLS" if creds else "plaintext", self.metrics_port)
        return self.port

    def _become_ready(self) -> None:
        while not self._stopped.is_set() and not self.servicer.draining:
            if self.pool.wait_ready(timeout=0.5):
                if not self.servicer.draining:
                    self._set_health(health_pb2.HealthCheckResponse.SERVING)
                    log.info("synthesizer ready: %d worker(s) warm", self.cfg.workers)
                return

    def _set_health(self, status: int) -> None:
        for name in ("", SERVICE):
            self.health.set(name, status)

    def stop(self, grace: float | None = None) -> None:
        """Drain: refuse new work, let work in flight finish within ``grace``, then stop."""
        with self._stopping:
            if self._stopped.is_set():
                return
            grace = self.cfg.grace if grace is None else grace
            self.servicer.draining = True
            self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
            log.info("draining: up to %.0f s for requests in flight", grace)
            if not self.servicer.wait_idle(grace):
                log.warning("grace period over; cancelling the requests still in flight")
            self.pool.close()
            self.grpc.stop(grace=1.0).wait()
            self.metrics.close()
            self._stopped.set()

    def wait(self) -> None:
        self._stopped.wait()

    def install_signal_handlers(self) -> None:
        """SIGTERM (Kubernetes) and SIGINT (a terminal) start a drain on a side thread."""
        def on_signal(signum: int, _frame: FrameType | None) -> None:
            log.info("received %s", signal.Signals(signum).name)
            threading.Thread(target=self.stop, name="choreo-drain", daemon=True).start()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
