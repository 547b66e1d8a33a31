"""A model of NCCL 2.2x as it runs on a choreo fabric: its channels, its choice of algorithm
and protocol, and the time that choice takes on the fabric's links (``nccl_baseline``)."""

from choreo.nccl.model import NcclResult, nccl_baseline

__all__ = ["NcclResult", "nccl_baseline"]
