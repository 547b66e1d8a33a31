"""The operator's side of the synthesizer API: one request per tenant group, async.

Requests are the service client's (``choreo.service.client``: ``TenantRequest``,
``RequestOptions``, ``build_request``). They carry an idempotency key (``<scope>:<inputs
hash>``) so a retried call joins the in-flight or cached solve, and a newer request for the
same group supersedes the older one on the server. Errors are sorted into what the operator
does next.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import grpc
import grpc.aio

from choreo.service.api import SYNTHESIZE, pb
from choreo.service.client import channel_options


class Outcome(enum.StrEnum):
    RETRY = "retry"  # the service is down, slow, busy or superseded us: try again later
    INFEASIBLE = "infeasible"  # the fabric cannot carry the tenant (disconnected, failed GPU)
    REJECTED = "rejected"  # the request itself is wrong (a collective the dialect lacks, ...)


@dataclass(eq=False)
class SynthesisError(Exception):
    outcome: Outcome
    code: str
    message: str

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


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


def classify(code: grpc.StatusCode, details: str) -> SynthesisError:
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        outcome = Outcome.INFEASIBLE
    elif code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE,
                  grpc.StatusCode.UNIMPLEMENTED):
        outcome = Outcome.REJECTED
    else:
        outcome = Outcome.RETRY
    return SynthesisError(outcome, code.name, details)
