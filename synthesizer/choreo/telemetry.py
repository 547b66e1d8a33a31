"""Measured collective bandwidth from inside a training job, for dashboards to set beside
the bandwidth choreo predicted for the same tenant.

A training script wraps its collectives::

    from choreo.telemetry import Reporter

    reporter = Reporter(port=9500)              # serves /metrics; job and namespace from env
    with reporter.measure("allreduce", grad, name="grads"):   # a tensor or a byte count
        torch.distributed.all_reduce(grad)

and every rank exposes ``choreo_measured_busbw_bytes_per_second{namespace,job,collective,
rank}``, where ``collective`` is the collective's name in the CollectiveJob
(``spec.collectives[].name``, by default the collective's kind), exactly the labels of the
operator's ``choreo_tenant_predicted_busbw_bytes_per_second``.

Sizes and bandwidths follow nccl-tests (``size`` is the collective's buffer size; busbw =
algbw x the collective's bus factor), the same definitions the synthesizer uses for
its predictions, so the two are directly comparable. torch is optional: without it (or
without an initialised process group) the caller passes ``world_size`` and the timing is
plain wall-clock.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from choreo.collectives import Collective, Demand
from choreo.errors import InputError

LABELS = ("namespace", "job", "collective", "rank")


@dataclass(frozen=True)
class Measurement:
    """One timed collective."""

    collective: Collective
    size_bytes: int
    world_size: int
    seconds: float

    @property
    def algbw(self) -> float:
        """Bytes per second of the collective's buffer (nccl-tests algbw)."""
        return self.size_bytes / self.seconds

    @property
    def busbw(self) -> float:
        """algbw scaled by the bus factor, so all collectives compare with link speed."""
        return self.algbw * bus_factor(self.collective, self.world_size)


def bus_factor(collective: Collective, world_size: int) -> float:
    """NCCL's busbw/algbw ratio, taken from the synthesizer's own demand model."""
    return Demand(collective, tuple(range(world_size)), 1).bus_factor()


def _torch_dist() -> Any | None:
    """``torch.distributed`` when it is importable and a process group is up."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    return dist if dist.is_available() and dist.is_initialized() else None


def _synchronize() -> None:
    """Wait for queued GPU work, so the clock brackets the collective and nothing else."""
    try:
        import torch
    except ImportError:
        return
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def size_of(buffer: Any) -> int:
    """Bytes of a tensor (``numel * element_size``), an object with ``nbytes``, or an int."""
    if isinstance(buffer, bool):
        raise InputError("size: expected a tensor or a byte count, got a bool")
    if isinstance(buffer, int):
        return buffer
    if hasattr(buffer, "numel") and hasattr(buffer, "element_size"):
        return int(buffer.numel()) * int(buffer.element_size())
    if hasattr(buffer, "nbytes"):
        return int(buffer.nbytes)
    raise InputError(f"size: expected a tensor or a byte count, got {type(buffer).__name__}")


class Reporter:
    """Times collectives and serves their algbw/busbw on a Prometheus endpoint.

    ``port=None`` serves nothing (the registry can still be read); ``port=0`` picks a free
    port, available as ``reporter.port``. ``namespace`` and ``job`` default to
    ``$CHOREO_NAMESPACE``/``$POD_NAMESPACE`` and ``$CHOREO_JOB`` so that series join the
    operator's ``choreo_tenant_predicted_busbw_bytes_per_second`` on the same labels.
    """

    def __init__(
        self,
        port: int | None = 9500,
        *,
        namespace: str | None = None,
        job: str | None = None,
        rank: int | None = None,
        addr: str = "0.0.0.0",
    ) -> None:
        self.namespace = namespace or os.environ.get(
            "CHOREO_NAMESPACE", os.environ.get("POD_NAMESPACE", "default"))
        self.job = job or os.environ.get("CHOREO_JOB", "")
        if not self.job:
            raise InputError("job: name the CollectiveJob (argument or $CHOREO_JOB)")
        dist = _torch_dist()
        if rank is None:
            rank = int(dist.get_rank()) if dist is not None else int(os.environ.get("RANK", "0"))
        self.rank = rank
        self.registry = CollectorRegistry()
        self._busbw = Gauge("choreo_measured_busbw_bytes_per_second",
                            "Bus bandwidth of the last timed collective (nccl-tests busbw)",
                            LABELS, registry=self.registry)
        self._algbw = Gauge("choreo_measured_algbw_bytes_per_second",
                            "Algorithm bandwidth of the last timed collective (size / time)",
                            LABELS, registry=self.registry)
        self._count = Counter("choreo_measured_collectives", "Timed collectives",
                              LABELS, registry=self.registry)
        self._seconds = Counter("choreo_measured_collective_seconds",
                                "Wall time spent in timed collectives", LABELS,
                                registry=self.registry)
        self._http: Any | None = None
        self.port: int | None = None
        if port is not None:
            server, _thread = start_http_server(port, addr=addr, registry=self.registry)
            self._http = server
            self.port = int(server.server_address[1])

    def record(self, collective: str | Collective, size: Any, seconds: float,
               world_size: int | None = None, name: str | None = None) -> Measurement:
        """Account one collective that took ``seconds``; returns its bandwidths.

        ``name`` is the collective's name in the CollectiveJob, so that the series joins the
        prediction for it; without one the collective's kind stands in.
        """
        kind = collective if isinstance(collective, Collective) else Collective.parse(collective)
        if not seconds > 0:
            raise InputError(f"seconds: must be positive, got {seconds}")
        m = Measurement(kind, size_of(size), self._world_size(world_size), seconds)
        labels = (self.namespace, self.job, name or kind.value, str(self.rank))
        self._busbw.labels(*labels).set(m.busbw)
        self._algbw.labels(*labels).set(m.algbw)
        self._count.labels(*labels).inc()
        self._seconds.labels(*labels).inc(seconds)
        return m

    @contextmanager
    def measure(self, collective: str | Collective, size: Any,
                world_size: int | None = None, name: str | None = None) -> Iterator[None]:
        """Time the block (GPU work synchronised at both ends) and record it.

        Nothing is recorded when the block raises: a failed collective has no bandwidth.
        """
        _synchronize()
        start = time.perf_counter()
        yield
        _synchronize()
        self.record(collective, size, time.perf_counter() - start, world_size, name)

    def close(self) -> None:
        """Stop serving /metrics."""
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def _world_size(world_size: int | None) -> int:
        if world_size is None:
            dist = _torch_dist()
            if dist is None:
                raise InputError("world_size: required when torch.distributed is not "
                                 "initialised")
            world_size = int(dist.get_world_size())
        if world_size < 2:
            raise InputError(f"world_size: a collective needs at least 2 ranks, got {world_size}")
        return world_size
