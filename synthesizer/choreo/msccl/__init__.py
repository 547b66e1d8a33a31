"""MSCCL XML for training pods: lowering, validation, interpretation, buckets, per-node split."""

from choreo.msccl.api import to_xml
from choreo.msccl.buckets import bucket_files
from choreo.msccl.interpret import RunResult, Stall, run
from choreo.msccl.split import MAX_CONFIGMAP_BYTES, fits_configmap, split_per_node
from choreo.msccl.validate import validate
from choreo.msccl.violation import Violation

__all__ = [
    "MAX_CONFIGMAP_BYTES",
    "RunResult",
    "Stall",
    "Violation",
    "bucket_files",
    "fits_configmap",
    "run",
    "split_per_node",
    "to_xml",
    "validate",
]
