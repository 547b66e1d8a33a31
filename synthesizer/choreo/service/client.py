"""A small Python client: build requests from choreo types and call a synthesizer.

Used by ``choreo synthesize --remote``, the load benchmark, the tests and the operator (its
asyncio client shares the request types, ``build_request`` and ``channel_options``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import grpc

from choreo.collectives import Collective
from choreo.msccl.packed import Codec, inflate_xml
from choreo.service.api import MAX_MESSAGE_BYTES, SERVICE, SYNTHESIZE, SYNTHESIZE_STREAM, pb
from choreo.service.convert import CODEC_OF_ENCODING, fabric_to_proto
from choreo.topology import Topology

ENCODING_OF_CODEC = {codec: encoding for encoding, codec in CODEC_OF_ENCODING.items()}


class CollectiveLike(Protocol):
    """What a request says of one collective: ``CollectiveRequest`` or the operator's
    CollectiveJob spec (``choreo_api``), which reads the same."""

    @property
    def collective(self) -> str: ...
    @property
    def min_bytes(self) -> int: ...
    @property
    def max_bytes(self) -> int: ...
    @property
    def root(self) -> int: ...
    @property
    def chunks(self) -> int | None: ...


@dataclass(frozen=True)
class CollectiveRequest:
    """One collective over a size range (``max_bytes`` 0: just ``min_bytes``)."""

    collective: str
    min_bytes: int
    max_bytes: int = 0
    root: int = 0
    chunks: int | None = None
    max_buckets: int = 0  # size buckets for this range alone; 0: the request's options say


@dataclass(frozen=True)
class TenantRequest:
    """One tenant as every client states it: the CLI, the benchmarks and the operator."""

    name: str
    npus: Sequence[int]
    collectives: Sequence[CollectiveLike]
    weight: float = 1.0
    # Where the client cuts a large compressed file (each pod's ranks): exclusive rank ends;
    # empty: per rank. The parts compress together, and are joined without compressing again.
    part_ends: tuple[int, ...] = ()

    @classmethod
    def one(cls, name: str, npus: Sequence[int], collective: Collective | str, min_bytes: int,
            max_bytes: int = 0, chunks: int | None = None, root: int = 0,
            weight: float = 1.0) -> TenantRequest:
        """A tenant with a single collective."""
        coll = collective.value if isinstance(collective, Collective) else collective
        return cls(name, npus, (CollectiveRequest(coll, min_bytes, max_bytes, root, chunks),),
                   weight)


@dataclass(frozen=True)
class RequestOptions:
    """How to solve and what to send back; zero or empty leaves the server's default."""

    dialect: str = ""
    instances: int = 0
    protocol: str = ""
    restarts: int = 0
    max_buckets: int = 0
    deadline_seconds: float = 0.0
    ship_slower_than_nccl: bool = False  # files even where NCCL is predicted faster
    seed: int = 0
    engine: str = ""
    codec: Codec | None = None  # XML compressed (large tenants' files are tens of MB)


def build_request(fabric: Topology | pb.FabricSnapshot, tenants: Sequence[TenantRequest],
                  options: RequestOptions | None = None, key: str = "") -> pb.SynthesizeRequest:
    """The request for ``tenants`` on ``fabric``; ``key`` makes retries idempotent."""
    o = options or RequestOptions()
    snapshot = fabric if isinstance(fabric, pb.FabricSnapshot) else fabric_to_proto(fabric)
    req = pb.SynthesizeRequest(
        fabric=snapshot, idempotency_key=key,
        options=pb.Options(restarts=o.restarts, seed=o.seed, dialect=o.dialect,
                           instances=o.instances, proto=o.protocol,
                           deadline_seconds=o.deadline_seconds, max_buckets=o.max_buckets,
                           xml_encoding=ENCODING_OF_CODEC[o.codec],
                           ship_slower_than_nccl=o.ship_slower_than_nccl, engine=o.engine))
    for t in tenants:
        specs = []
        for c in t.collectives:
            spec = pb.CollectiveSpec(collective=c.collective, min_bytes=c.min_bytes,
                                     max_bytes=c.max_bytes, root=c.root,
                                     max_buckets=getattr(c, "max_buckets", 0))
            if c.chunks is not None:
                spec.chunks = c.chunks
            specs.append(spec)
        req.tenants.add(name=t.name, npus=list(t.npus), collectives=specs, weight=t.weight,
                        relay=pb.Tenant.OWN_NPUS_ONLY, part_ends=list(t.part_ends))
    return req


# Spread calls over every replica the target resolves to (a headless Service's pods by
# ``dns:///``, or a list such as ``ipv4:127.0.0.1:50051,127.0.0.1:50052``), send none to a
# replica whose health is not SERVING (starting or draining), and retry a call whose replica
# went away on another one: requests carry idempotency keys, so a retry is safe.
SERVICE_CONFIG = {
    "loadBalancingConfig": [{"round_robin": {}}],
    "healthCheckConfig": {"serviceName": SERVICE},
    "methodConfig": [{
        "name": [{"service": SERVICE}],
        "retryPolicy": {"maxAttempts": 5, "initialBackoff": "0.1s", "maxBackoff": "2s",
                        "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]},
    }],
}


def channel_options(server_name: str | None = None) -> list[tuple[str, int | str]]:
    """Options for every channel to the synthesizer, sync or asyncio."""
    options: list[tuple[str, int | str]] = [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.service_config", json.dumps(SERVICE_CONFIG)),
        ("grpc.enable_retries", 1),
        # A retry resends the request from this buffer: large fabrics must fit in it.
        ("grpc.per_rpc_retry_buffer_size", MAX_MESSAGE_BYTES),
        ("grpc.retry_buffer_size", 4 * MAX_MESSAGE_BYTES),
        ("grpc.initial_reconnect_backoff_ms", 200),
        ("grpc.max_reconnect_backoff_ms", 2000),
    ]
    if server_name:
        options.append(("grpc.ssl_target_name_override", server_name))
    return options


def open_channel(address: str, *, ca: str | None = None, cert: str | None = None,
                 key: str | None = None, server_name: str | None = None) -> grpc.Channel:
    """Plaintext unless a CA is given; with ``cert``/``key`` as well, mutual TLS."""
    options = channel_options(server_name)
    if ca is None:
        return grpc.insecure_channel(address, options=options)
    creds = grpc.ssl_channel_credentials(
        root_certificates=Path(ca).read_bytes(),
        private_key=Path(key).read_bytes() if key else None,
        certificate_chain=Path(cert).read_bytes() if cert else None)
    return grpc.secure_channel(address, creds, options=options)


class Client:
    """Typed calls on a channel; errors surface as ``grpc.RpcError``."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.channel = channel
        self._unary = channel.unary_unary(
            SYNTHESIZE, request_serializer=_serialize,
            response_deserializer=pb.SynthesizeResponse.FromString)
        self._stream = channel.unary_stream(
            SYNTHESIZE_STREAM, request_serializer=_serialize,
            response_deserializer=pb.SynthesizeEvent.FromString)

    def synthesize(self, request: pb.SynthesizeRequest | bytes,
                   timeout: float | None = None) -> pb.SynthesizeResponse:
        return self._unary(request, timeout=timeout)

    def future(self, request: pb.SynthesizeRequest | bytes,
               timeout: float | None = None) -> grpc.Future:
        return self._unary.future(request, timeout=timeout)

    def stream(self, request: pb.SynthesizeRequest | bytes,
               timeout: float | None = None) -> Iterator[pb.SynthesizeEvent]:
        return self._stream(request, timeout=timeout)


def bucket_body(bucket: pb.Bucket) -> str | bytes:
    """A bucket's MSCCL XML as it was sent: compressed (bytes) or plain text."""
    return bucket.xml_zstd or bucket.xml_gzip or bucket.xml


def bucket_member_ends(bucket: pb.Bucket) -> list[int]:
    """Where the members of a bucket's compressed XML end (empty: one member)."""
    return list(bucket.xml_zstd_frame_ends or bucket.xml_gzip_member_ends)


def bucket_xml(bucket: pb.Bucket) -> str:
    """A bucket's MSCCL XML whichever encoding it was sent in."""
    return inflate_xml(bucket_body(bucket))


def _serialize(msg: pb.SynthesizeRequest | bytes) -> bytes:
    """Bytes pass through untouched, so tests can send malformed messages."""
    return msg if isinstance(msg, bytes) else msg.SerializeToString()
