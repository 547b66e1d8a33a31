"""The operator's settings, from command-line flags."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Config:
    synthesizer: str = "127.0.0.1:50051"
    synthesizer_ca: str | None = None
    kubeconfig: str | None = None
    metrics_port: int = 9464
    metrics_addr: str = "127.0.0.1"
    webhook_port: int = 9443
    webhook_addr: str = "127.0.0.1"
    webhook_host: str | None = None
    webhook_cert_dir: str = "/tmp/choreo-operator-certs"
    webhook_config: str = "choreo-operator"
    quiet_seconds: float = 0.1
    max_delay_seconds: float = 2.0
    timeout_seconds: float = 60.0
    restarts: int = 2
    max_buckets: int = 4
    split_bytes: int = 900 * 1024
    liveness: str | None = None
    leader_election: bool = True
    lease_namespace: str = "default"
    lease_name: str = "choreo-operator"
    identity: str = ""  # this replica's name in the Lease (the pod's name)
