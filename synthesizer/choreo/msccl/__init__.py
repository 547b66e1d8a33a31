"""MSCCL XML for training pods: lowering, validation, interpretation, buckets, per-node split."""

from choreo.msccl.api import to_xml
from choreo.msccl.violation import Violation

__all__ = ["Violation", "to_xml"]
