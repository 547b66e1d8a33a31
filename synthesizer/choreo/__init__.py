"""choreo: topology-aware collective synthesis for GPU/NPU clusters."""

__version__ = "0.1.0"
