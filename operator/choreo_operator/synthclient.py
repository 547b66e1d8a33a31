"""The operator's side of the synthesizer API: one request per tenant group, async.

Requests carry an idempotency key (``<scope>:<inputs hash>``) so a retried call joins the
in-flight or cached solve, and a newer request for the same group supersedes the older one
on the server. Errors are sorted into what the operator does next.
"""

from __future__ import annotations

import enum
import gzip
from collections.abc import Sequence
from dataclasses import dataclass

import grpc
import grpc.aio

from choreo.service.api import SYNTHESIZE, pb
from choreo.service.client import channel_options
from choreo.service.convert import fabric_to_proto
from choreo.topology import Topology
from choreo_operator.model import CollectiveSpec


class Outcome(enum.StrEnum):
    RETRY = "retry"  # the service is down, slow, busy or superseded us: try again later
    INFEASIBLE = "infeasible"  # the fabric cannot carry the tenant (disconnected, failed GPU)
    REJECTED = "rejected"  # the request itself is wrong (a collective the dialect lacks, ...)


@dataclass(frozen=True)
class TenantRequest:
    name: str
    npus: tuple[int, ...]
    collectives: tuple[CollectiveSpec, ...]
    weight: float


@dataclass(frozen=True)
class RequestOptions:
    dialect: str = "executor"
    instances: int = 1
    protocol: str = "Simple"
    restarts: int = 2
    max_buckets: int = 4
    deadline_seconds: float = 30.0
    ship_slower_than_nccl: bool = False  # a member asked for files NCCL would beat


@dataclass(eq=False)
class SynthesisError(Exception):
    outcome: Outcome
    code: str
    message: str

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


def build_request(fabric: Topology, tenants: Sequence[TenantRequest], options: RequestOptions,
                  key: str) -> pb.SynthesizeRequest:
    req = pb.SynthesizeRequest(
        fabric=fabric_to_proto(fabric), idempotency_key=key,
        options=pb.Options(restarts=options.restarts, seed=0, dialect=options.dialect,
                           instances=options.instances, proto=options.protocol,
                           deadline_seconds=options.deadline_seconds,
                           max_buckets=options.max_buckets,
                           xml_encoding=pb.Options.XML_GZIP,
                           ship_slower_than_nccl=options.ship_slower_than_nccl))
    for t in tenants:
        specs = []
        for c in t.collectives:
            spec = pb.CollectiveSpec(collective=c.collective, min_bytes=c.min_bytes,
                                     max_bytes=c.max_bytes, root=c.root)
            if c.chunks is not None:
                spec.chunks = c.chunks
            specs.append(spec)
        req.tenants.add(name=t.name, npus=list(t.npus), collectives=specs, weight=t.weight,
                        relay=pb.Tenant.OWN_NPUS_ONLY)
    return req


class SynthesizerClient:
    """An async channel to ``choreo serve``; plaintext unless a CA is given.

    ``address`` is a gRPC target: with several replicas (``dns:///`` a headless Service, or
    an ``ipv4:`` list) calls are spread over the ready ones and retried on another."""

    def __init__(self, address: str, ca: bytes | None = None) -> None:
        options = channel_options()
        if ca is None:
            self.channel = grpc.aio.insecure_channel(address, options=options)
        else:
            self.channel = grpc.aio.secure_channel(
                address, grpc.ssl_channel_credentials(root_certificates=ca), options=options)
        self._call = self.channel.unary_unary(
            SYNTHESIZE, request_serializer=pb.SynthesizeRequest.SerializeToString,
            response_deserializer=pb.SynthesizeResponse.FromString)

    async def synthesize(self, request: pb.SynthesizeRequest,
                         timeout: float) -> pb.SynthesizeResponse:
        try:
            return await self._call(request, timeout=timeout)
        except grpc.aio.AioRpcError as err:
            raise classify(err.code(), err.details() or "") from None

    async def close(self) -> None:
        await self.channel.close()


def bucket_xml(bucket: pb.Bucket) -> str:
    """The bucket's MSCCL XML, inflated if the server sent it compressed."""
    return gzip.decompress(bucket.xml_gzip).decode() if bucket.xml_gzip else bucket.xml


def classify(code: grpc.StatusCode, details: str) -> SynthesisError:
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        outcome = Outcome.INFEASIBLE
    elif code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE,
                  grpc.StatusCode.UNIMPLEMENTED):
        outcome = Outcome.REJECTED
    else:
        outcome = Outcome.RETRY
    return SynthesisError(outcome, code.name, details)
