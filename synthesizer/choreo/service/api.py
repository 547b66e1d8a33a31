"""The generated API modules under short names, generated first if missing or stale."""

from choreo.service import protos

protos.ensure()

from choreo.service.gen import synthesizer_pb2 as pb  # noqa: E402
from choreo.service.gen import synthesizer_pb2_grpc as pb_grpc  # noqa: E402

SERVICE = protos.SERVICE
SYNTHESIZE = f"/{SERVICE}/Synthesize"
SYNTHESIZE_STREAM = f"/{SERVICE}/SynthesizeStream"
# A 16,384-GPU AllGather's files, gzipped: 125 MB (a 4,096-GPU one 38 MB)
MAX_MESSAGE_BYTES = 256 << 20

__all__ = ["MAX_MESSAGE_BYTES", "SERVICE", "SYNTHESIZE", "SYNTHESIZE_STREAM", "pb", "pb_grpc"]
