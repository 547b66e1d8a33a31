"""Prometheus metrics of the synthesizer, on their own registry and HTTP port.

A registry per server (not the process-global one) keeps servers started side by side, as
the tests do, from colliding over metric names.
"""

from __future__ import annotations

from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

# Solves range from milliseconds (cached shapes, small fabrics) to minutes (thousands of NPUs).
DURATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("choreo_synthesizer_requests", "Finished RPCs by status code",
                                ["method", "code"], registry=r)
        self.duration = Histogram("choreo_synthesizer_synthesis_duration_seconds",
                                  "Wall time of one request's synthesis in a worker",
                                  buckets=DURATION_BUCKETS, registry=r)
        self.queue_depth = Gauge("choreo_synthesizer_queue_depth",
                                 "Requests waiting for a worker", registry=r)
        self.busy = Gauge("choreo_synthesizer_workers_busy", "Workers running a request",
                          registry=r)
        self.cache_hits = Counter("choreo_synthesizer_cache_hits", "Requests answered from the "
                                  "result cache", registry=r)
        self.cache_misses = Counter("choreo_synthesizer_cache_misses", "Requests that needed a "
                                    "solve (or joined one in flight)", registry=r)
        self.not_modified = Counter("choreo_synthesizer_not_modified", "Requests answered "
                                    "not_modified: the client already held the result",
                                    registry=r)
        self.cache_bytes = Gauge("choreo_synthesizer_cache_bytes", "Bytes held by the result "
                                 "cache", registry=r)
        self.superseded = Counter("choreo_synthesizer_superseded", "Jobs aborted by a newer "
                                  "request for the same tenants", registry=r)
        self._http: WSGIServer | None = None

    def serve(self, port: int, host: str = "0.0.0.0") -> int:
        """Expose ``/metrics`` on ``port`` (0 picks a free one); returns the bound port."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self._http = server
        return int(server.server_address[1])

    def close(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
