"""Watches the agent's own NodeFabric for a re-measurement request (an annotation).

A watch rather than polling: a thousand agents polling their objects every few seconds
would be a steady load on the API server for an event that happens rarely.
"""

from __future__ import annotations

import logging
import threading

from choreo_agents.publisher import PROBE_REQUEST
from choreo_agents.schedule import Backoff
from choreo_api import API_VERSION
from choreo_api.kube import CALL_ERRORS, Kube

log = logging.getLogger(__name__)


class RequestWatcher:
    def __init__(self, api: Kube, node: str, namespace: str, requested: threading.Event) -> None:
        self.api = api
        self.node = node
        self.path = f"/apis/{API_VERSION}/namespaces/{namespace}/nodefabrics"
        self.requested = requested
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="probe-requests", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.stop.set()

    def _run(self) -> None:
        backoff = Backoff(initial=1.0, maximum=60.0)
        params = {"fieldSelector": f"metadata.name={self.node}"}
        while not self.stop.is_set():
            try:
                for event in self.api.watch(self.path, params, timeout_seconds=30):
                    if self.stop.is_set():
                        return
                    obj = event.get("object", {})
                    annotations = obj.get("metadata", {}).get("annotations") or {}
                    if event.get("type") in ("ADDED", "MODIFIED") and PROBE_REQUEST in annotations:
                        self.requested.set()
                backoff.succeeded()
            except (*CALL_ERRORS, ValueError) as exc:
                delay = backoff.failed(0.0)
                log.warning(
                    "watch on NodeFabric %s failed: %s (retry in %.1f s)", self.node, exc, delay
                )
                self.stop.wait(delay)
