"""Request failures as gRPC status codes with ``google.rpc`` details a client can act on.

Every failure the service reports is a ``RequestError``: the code, one human message, and
the machine-readable detail (BadRequest field violations, ErrorInfo, PreconditionFailure)
packed into ``grpc-status-details-bin`` by grpcio-status.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc
from google.protobuf import any_pb2
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

DOMAIN = "synthesizer.choreo.dev"


@dataclass
class RequestError(Exception):
    """A request that ends with a non-OK status; raised anywhere below the servicer."""

    code: grpc.StatusCode
    message: str
    violations: Sequence[tuple[str, str]] = ()  # (field path, description): BadRequest
    reason: str = ""  # ErrorInfo.reason, UPPER_SNAKE_CASE
    metadata: dict[str, str] = field(default_factory=dict)
    preconditions: Sequence[tuple[str, str, str]] = ()  # (type, subject, description)

    def __str__(self) -> str:
        return self.message

    def to_status(self) -> grpc.Status:
        details: list[any_pb2.Any] = []
        if self.violations:
            details.append(_pack(error_details_pb2.BadRequest(field_violations=[
                error_details_pb2.BadRequest.FieldViolation(field=f, description=d)
                for f, d in self.violations
            ])))
        if self.reason:
            details.append(_pack(error_details_pb2.ErrorInfo(
                reason=self.reason, domain=DOMAIN, metadata=self.metadata)))
        if self.preconditions:
            details.append(_pack(error_details_pb2.PreconditionFailure(violations=[
                error_details_pb2.PreconditionFailure.Violation(type=t, subject=s, description=d)
                for t, s, d in self.preconditions
            ])))
        status = status_pb2.Status(code=self.code.value[0], message=self.message, details=details)
        return rpc_status.to_status(status)


def invalid(path: str, message: str) -> RequestError:
    """INVALID_ARGUMENT naming the offending field."""
    return RequestError(grpc.StatusCode.INVALID_ARGUMENT, f"{path}: {message}",
                        violations=[(path, message)])


def _pack(message: Message) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


def details_of(err: grpc.RpcError) -> dict[str, object]:
    """Client side: the decoded ``google.rpc`` details of a failed call (empty if none)."""
    status = rpc_status.from_call(err)
    out: dict[str, object] = {}
    if status is None:
        return out
    for detail in status.details:
        for kind in (error_details_pb2.BadRequest, error_details_pb2.ErrorInfo,
                     error_details_pb2.PreconditionFailure):
            if detail.Is(kind.DESCRIPTOR):
                msg = kind()
                detail.Unpack(msg)
                out[kind.__name__] = msg
    return out
