"""The Synthesizer RPCs: validate, answer from the cache, or queue a job and wait for it.

Requests arrive as raw bytes and responses leave as bytes: a malformed message is then our
INVALID_ARGUMENT rather than gRPC's generic INTERNAL, and a cached answer is sent exactly as
stored. The one difference between a cached and a fresh answer, ``cache_hit``, is appended to
the stored bytes as an extra field: protobuf decoders let the last occurrence of a field win.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
from google.protobuf.message import DecodeError

from choreo.service.api import SERVICE, pb
from choreo.service.cache import Memo, ResultCache, cache_key
from choreo.service.convert import (
    Work,
    check_against,
    fabric_from_proto,
    options_from_proto,
    spec_key,
    tenants_from_proto,
)
from choreo.service.flights import Flights, scope_of
from choreo.service.metrics import Metrics
from choreo.service.pool import Event, Job, WorkerPool, deadline_error
from choreo.service.status import RequestError, invalid
from choreo.topology import Topology

log = logging.getLogger("choreo.service")

CACHE_HIT_FIELD = b"\x18\x01"  # field 3 (cache_hit), varint 1
WAIT_SLICE = 0.25  # seconds between checks of the caller's own deadline


@dataclass
class _Started:
    """A request past validation: either the cached bytes or a job to wait for."""

    cached: bytes | None = None
    job: Job | None = None
    scope: str = ""
    key: str = ""
    deadline: float | None = None


class Synthesizer:
    def __init__(self, pool: WorkerPool, cache: ResultCache, metrics: Metrics) -> None:
        self.pool = pool
        self.cache = cache
        self.metrics = metrics
        self.flights = Flights(on_supersede=metrics.superseded.inc)
        self.fabrics: Memo[tuple[Topology, str]] = Memo(64)
        # The cache key is a pure function of the request bytes, so a byte-identical repeat
        # (the common cache hit) skips parsing altogether.
        # With it goes the whole reply when the request was answered not_modified.
        self.keys: Memo[tuple[str, bytes | None]] = Memo(4096)
        self.draining = False
        self._inflight = 0
        self._idle = threading.Condition()

    def handler(self) -> grpc.GenericRpcHandler:
        def send(msg: bytes | pb.SynthesizeEvent) -> bytes:
            return msg if isinstance(msg, bytes) else msg.SerializeToString()

        return grpc.method_handlers_generic_handler(SERVICE, {
            "Synthesize": grpc.unary_unary_rpc_method_handler(
                self.synthesize, request_deserializer=None, response_serializer=None),
            "SynthesizeStream": grpc.unary_stream_rpc_method_handler(
                self.synthesize_stream, request_deserializer=None, response_serializer=send),
        })

    # ---- draining ----------------------------------------------------------------------------
    def wait_idle(self, timeout: float) -> bool:
        """After ``draining`` is set: wait for the RPCs in flight to finish."""
        with self._idle:
            return self._idle.wait_for(lambda: self._inflight == 0, timeout)

    def _enter(self, context: grpc.ServicerContext) -> None:
        """Count the RPC in flight until gRPC has ended it: a handler that has returned its
        response is not done while the megabytes are still being sent, and a drain that
        stopped the server then would cut them off."""
        with self._idle:
            self._inflight += 1
        if not context.add_callback(self._leave):
            self._leave()  # the call is already over

    def _leave(self) -> None:
        with self._idle:
            self._inflight -= 1
            self._idle.notify_all()

    # ---- RPCs --------------------------------------------------------------------------------
    def synthesize(self, raw: bytes, context: grpc.ServicerContext) -> bytes:
        self._enter(context)
        code = grpc.StatusCode.OK
        try:
            started = self._start(raw, context)
            if started.cached is not None:
                return started.cached
            assert started.job is not None
            for _ in self._follow(started, context):
                pass
            return self._result(started)
        except RequestError as err:
            code = err.code
            context.abort_with_status(err.to_status())
            raise  # not reached: abort_with_status raises
        except Exception:
            code = grpc.StatusCode.INTERNAL
            log.exception("Synthesize failed")
            raise
        finally:
            self._count("Synthesize", code, context)

    def synthesize_stream(self, raw: bytes,
                          context: grpc.ServicerContext) -> Iterator[bytes | pb.SynthesizeEvent]:
        self._enter(context)
        code = grpc.StatusCode.OK
        try:
            started = self._start(raw, context)
            if started.cached is not None:
                result = pb.SynthesizeResponse.FromString(started.cached)
                yield pb.SynthesizeEvent(result=result)
                return
            yield pb.SynthesizeEvent(progress=pb.Progress(
                stage="queued", message=f"{self.pool.depth} request(s) queued"))
            for ev in self._follow(started, context):
                yield pb.SynthesizeEvent(progress=pb.Progress(
                    stage=ev.stage, message=ev.message, done=ev.done, total=ev.total,
                    elapsed_seconds=ev.elapsed))
            yield pb.SynthesizeEvent(
                result=pb.SynthesizeResponse.FromString(self._result(started)))
        except RequestError as err:
            code = err.code
            context.abort_with_status(err.to_status())
        except Exception:
            code = grpc.StatusCode.INTERNAL
            log.exception("SynthesizeStream failed")
            raise
        finally:
            self._count("SynthesizeStream", code, context)

    def _count(self, method: str, code: grpc.StatusCode, context: grpc.ServicerContext) -> None:
        if code is grpc.StatusCode.OK and not context.is_active():
            code = grpc.StatusCode.CANCELLED
        self.metrics.requests.labels(method=method, code=code.name).inc()

    # ---- the steps ---------------------------------------------------------------------------
    def _start(self, raw: bytes, context: grpc.ServicerContext) -> _Started:
        if self.draining:
            raise RequestError(grpc.StatusCode.UNAVAILABLE,
                               "the server is draining; retry on another replica",
                               reason="DRAINING")
        wire = hashlib.sha256(raw).hexdigest()
        known = self.keys.get(wire)
        if known is not None:
            if known[1] is not None:
                self.metrics.not_modified.inc()
                return _Started(cached=known[1])
            cached = self.cache.get(known[0])
            if cached is not None:
                self.metrics.cache_hits.inc()
                return _Started(cached=cached)
        try:
            req = pb.SynthesizeRequest.FromString(raw)
        except DecodeError as err:
            raise invalid("request", f"not a valid SynthesizeRequest: {err}") from None
        if not req.HasField("fabric"):
            raise invalid("fabric", "is required")
        fabric, fingerprint = self._fabric(req.fabric)
        tenants = tenants_from_proto(req.tenants)
        options, hint = options_from_proto(req.options)
        key = cache_key(fingerprint, spec_key(tenants, options))
        if req.known_result_id and req.known_result_id == key:
            reply = pb.SynthesizeResponse(
                result_id=key, fabric_fingerprint=fingerprint, engine=options.engine,
                not_modified=True, cache_hit=True).SerializeToString()
            self.keys.put(wire, (key, reply))
            self.metrics.not_modified.inc()
            # The caller is settled on this answer: older work for its tenants is moot.
            self.flights.supersede(scope_of(req.idempotency_key, (t.name for t in tenants)),
                                   key)
            return _Started(cached=reply)
        self.keys.put(wire, (key, None))
        cached = self.cache.get(key)
        if cached is not None:
            self.metrics.cache_hits.inc()
            return _Started(cached=cached)
        self.metrics.cache_misses.inc()
        check_against(fabric, tenants)
        deadline = _deadline(context, hint)
        work = Work(fabric, tenants, options, key)
        scope = scope_of(req.idempotency_key, (t.name for t in tenants))
        job = self.flights.join_or_start(
            scope, key, deadline, make=lambda: Job(work, key, deadline),
            submit=self.pool.submit)
        if not context.add_callback(job.detach):
            job.detach()  # the caller left during validation
        return _Started(job=job, scope=scope, key=key, deadline=deadline)

    def _fabric(self, msg: pb.FabricSnapshot) -> tuple[Topology, str]:
        """Parse a fabric once per distinct snapshot; its fingerprint is part of the cache key."""
        wire = hashlib.sha256(msg.SerializeToString(deterministic=True)).hexdigest()
        known = self.fabrics.get(wire)
        if known is None:
            topo = fabric_from_proto(msg)
            known = (topo, topo.fingerprint())
            self.fabrics.put(wire, known)
        return known

    def _follow(self, started: _Started, context: grpc.ServicerContext) -> Iterator[Event]:
        """Yield the job's progress events until it ends or this caller's deadline passes."""
        job = started.job
        assert job is not None
        seen = 0
        while not job.finished:
            if started.deadline is not None and time.monotonic() >= started.deadline + 1.0:
                raise deadline_error()  # the job lives on for a more patient waiter
            if not context.is_active():
                return
            for ev in job.wait(seen, WAIT_SLICE):
                seen += 1
                yield ev

    def _result(self, started: _Started) -> bytes:
        job = started.job
        assert job is not None
        if not job.finished:  # the caller went away; the job ends when its last waiter does
            raise RequestError(grpc.StatusCode.CANCELLED, "the client went away",
                               reason="CANCELLED")
        self.flights.forget(started.scope, job)
        if job.error is not None:
            raise job.error
        assert job.result is not None
        self.cache.put(started.key, job.result + CACHE_HIT_FIELD)  # stored as a hit is sent
        self.metrics.cache_bytes.set(self.cache.size)
        return job.result


def _deadline(context: grpc.ServicerContext, hint: float) -> float | None:
    """The earlier of the call's own deadline and the request's server-side hint."""
    now = time.monotonic()
    ends = []
    remaining = context.time_remaining()
    if remaining is not None and remaining < 1e8:
        ends.append(now + remaining)
    if hint > 0:
        ends.append(now + hint)
    return min(ends) if ends else None

