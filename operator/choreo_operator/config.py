"""The operator's settings: each one's flag, ``CHOREO_OPERATOR_*`` variable, default and help."""

from __future__ import annotations

import os
import socket

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Config(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CHOREO_OPERATOR_", frozen=True,
                                      extra="forbid")

    synthesizer: str = Field("127.0.0.1:50051", description="address of `choreo serve`")
    synthesizer_ca: str | None = Field(None, description="CA (PEM) of the synthesizer; "
                                       "enables TLS")
    kubeconfig: str | None = Field(None, description="kubeconfig file (else $KUBECONFIG, "
                                   "else in-cluster)")
    metrics_port: int = Field(9464, ge=-1, description="Prometheus /metrics port; -1 off, "
                              "0 a free one")
    metrics_addr: str = Field("127.0.0.1", description="address /metrics binds")
    webhook_port: int = Field(9443, ge=0, description="admission webhook HTTPS port; 0 off")
    webhook_addr: str = Field("127.0.0.1", description="address the webhook binds")
    webhook_host: str | None = Field(None, description="host name the API server dials "
                                     "(else the address)")
    webhook_cert_dir: str = Field("/tmp/choreo-operator-certs", description="tls.crt, "
                                  "tls.key and ca.crt to serve with; generated if absent")
    webhook_config: str = Field("choreo-operator", description="MutatingWebhookConfiguration "
                                "to point at this webhook ('' leaves it)")
    debounce: float = Field(0.1, gt=0, description="seconds without new events before a "
                            "round starts")
    max_delay: float = Field(2.0, gt=0, description="longest a burst may postpone a round "
                             "(seconds)")
    timeout: float = Field(60.0, gt=0, description="deadline of one synthesis call (seconds)")
    restarts: int = Field(2, ge=0, description="randomized restarts per synthesis")
    max_requests: int = Field(8, ge=1, description="synthesis calls in flight at once; more "
                              "groups wait in the operator, not refused by a busy synthesizer "
                              "(about twice the workers of all synthesizer replicas)")
    max_buckets: int = Field(4, ge=1, description="size buckets per collective")
    split_bytes: int = Field(900 * 1024, gt=0, description="cut a schedule per pod above "
                             "this size, consecutive pods' parts sharing ConfigMaps of up to "
                             "this size")
    keep_replaced: float = Field(
        300.0, ge=0, description="seconds the ConfigMaps of a replaced schedule stay once no "
        "pod mounts them: a failed device that recovers within that (an Xid reset, a flapping "
        "link) gets its schedule back without a byte written; 0 deletes them at once")
    unpack_image: str | None = Field(
        None, description="image (choreo's own) of the sidecar the webhook adds to tenant "
        "pods to inflate compressed (zstd) schedules: ConfigMaps then hold a tenth of the "
        "bytes or less; unset, they hold plain XML and pods mount it directly")
    liveness: str | None = Field(None, description="kopf liveness endpoint, e.g. "
                                 "http://127.0.0.1:8080/healthz")
    leader_election: bool = Field(True, description="one of several replicas: only the "
                                  "holder of a Lease reconciles")
    lease_namespace: str = Field(
        default_factory=lambda: os.environ.get("POD_NAMESPACE", "default"),
        description="namespace of the Lease (else $POD_NAMESPACE, else default)")
    lease_name: str = Field("choreo-operator", description="name of the Lease")
    identity: str = Field(
        default_factory=lambda: os.environ.get("POD_NAME") or socket.gethostname(),
        description="this replica's name in the Lease, unique per replica (else $POD_NAME, "
        "else the host name); a restart under the same name takes its Lease back at once")
    log_level: str = Field("INFO", description="logging level")
