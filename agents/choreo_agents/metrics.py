"""Prometheus metrics and ``/healthz`` on one small HTTP server.

``/healthz`` fails when the agent's loop has not completed a tick recently, which is what
a liveness probe should restart; a failing API server or NVML does not fail it, because a
restart would not fix those and would only lose the agent's health history.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

LINK_LABELS = ("node", "src", "dst", "kind")


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.link_alpha = Gauge(
            "choreo_link_alpha_seconds",
            "Link latency alpha (fit or nominal).",
            LINK_LABELS,
            registry=r,
        )
        self.link_bandwidth = Gauge(
            "choreo_link_bandwidth_bytes_per_second",
            "Link bandwidth per physical link (fit or nominal).",
            LINK_LABELS,
            registry=r,
        )
        self.link_healthy = Gauge(
            "choreo_link_healthy", "1 if the link is usable, else 0.", LINK_LABELS, registry=r
        )
        self.link_fit_error = Gauge(
            "choreo_link_fit_relative_error",
            "Relative standard error of the bandwidth fit.",
            LINK_LABELS,
            registry=r,
        )
        self.link_errors = Gauge(
            "choreo_link_error_rate",
            "NVLink error counter rate per second.",
            (*LINK_LABELS, "counter"),
            registry=r,
        )
        self.gpu_healthy = Gauge(
            "choreo_gpu_healthy", "1 if the GPU is healthy, else 0.", ("node", "gpu"), registry=r
        )
        self.probe_duration = Histogram(
            "choreo_probe_duration_seconds",
            "Time to measure a set of links.",
            ("node", "scope"),
            buckets=(0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300),
            registry=r,
        )
        self.probe_failures = Counter(
            "choreo_probe_failures_total", "Links whose measurement failed.", ("node",), registry=r
        )
        self.api_writes = Counter(
            "choreo_api_writes_total",
            "Writes to the API server by object and outcome.",
            ("node", "object", "outcome"),
            registry=r,
        )
        self.transitions = Counter(
            "choreo_health_transitions_total",
            "Debounced device state changes.",
            ("node", "type", "state"),
            registry=r,
        )
        self.last_tick = Gauge(
            "choreo_agent_last_tick_timestamp_seconds",
            "When the loop last ran.",
            ("node",),
            registry=r,
        )

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _Handler(BaseHTTPRequestHandler):
    metrics: AgentMetrics
    alive: Callable[[], bool]

    def do_GET(self) -> None:
        if self.path.startswith("/metrics"):
            self._send(200, self.metrics.exposition(), CONTENT_TYPE_LATEST)
        elif self.path.startswith("/healthz"):
            ok = type(self).alive()
            self._send(200 if ok else 503, b"ok\n" if ok else b"agent loop stalled\n", "text/plain")
        else:
            self._send(404, b"not found\n", "text/plain")

    def _send(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return  # scrapes every few seconds would drown the agent's own log


class MetricsServer:
    """Serves ``/metrics`` and ``/healthz`` from a daemon thread."""

    def __init__(
        self, metrics: AgentMetrics, alive: Callable[[], bool], host: str, port: int
    ) -> None:
        handler = type("Handler", (_Handler,), {"metrics": metrics, "alive": staticmethod(alive)})
        self.server = ThreadingHTTPServer((host, port), handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


class Heartbeat:
    """Tracks loop progress for ``/healthz``."""

    def __init__(self, stale_after: float) -> None:
        self.stale_after = stale_after
        self._last = time.monotonic()

    def beat(self) -> None:
        self._last = time.monotonic()

    def alive(self) -> bool:
        return time.monotonic() - self._last <= self.stale_after
