"""The node agent's settings: each one's flag, ``CHOREO_AGENT_*`` variable, default and help.

The Pod's own facts come from the downward API under their usual names (``NODE_NAME``,
``POD_NAME``, ``POD_NAMESPACE``, ``POD_UID``) when neither a flag nor a ``CHOREO_AGENT_*``
variable sets them.
"""

from __future__ import annotations

import os
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def _env(name: str) -> str | None:
    return os.environ.get(name) or None


class AgentConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CHOREO_AGENT_", frozen=True, extra="forbid")

    backend: Literal["auto", "nvml", "sim"] = Field(
        "auto", description="auto: NVML when an NVIDIA driver is present, else sim")
    node: str | None = Field(default_factory=lambda: _env("NODE_NAME"),
                             description="this node's name (else $NODE_NAME)")
    fabric: str | None = Field(None, description="sim backend: built-in topology name or "
                               "topology file")
    fabric_node: str | None = Field(
        None, description="sim backend: which machine of the fabric, name prefix (node3) or "
        "position (3); else the node name, else the Node's choreo.dev/fabric-index label")
    script: str | None = Field(None, description="sim backend: YAML fault script "
                               "(docs/agent.md)")
    noise: float = Field(0.02, ge=0, lt=1, description="sim backend: relative measurement "
                         "noise (standard deviation)")
    seed: int = Field(0, description="sim backend: random seed")
    dcgm_url: str | None = Field(None, description="NVML backend: read error counters and "
                                 "XIDs from a DCGM exporter")
    nccl_tests_dir: list[str] = Field(
        default_factory=list, description="NVML backend: directory with sendrecv_perf and "
        "alltoall_perf, repeatable (PATH is searched too)")
    sysfs: str = Field("/sys", description="sysfs root (tests point it elsewhere)")
    interval: float = Field(600.0, gt=0, description="seconds between full re-measurements "
                            "(jittered by 10%)")
    poll: float = Field(0.5, gt=0, description="seconds between health polls")
    stagger: float = Field(30.0, ge=0, description="window over which nodes spread their "
                           "first measurement (by name hash)")
    fail_after: int = Field(2, ge=1, description="consecutive bad polls before a device "
                            "counts as failed")
    recover_after: float = Field(30.0, ge=0, description="seconds a failed device must stay "
                                 "good to recover (doubles per flap)")
    change_threshold: float = Field(0.1, ge=0, lt=1, description="relative change of alpha "
                                    "or bandwidth worth a NodeFabric patch")
    duration: float | None = Field(None, gt=0, description="exit after this many seconds")
    namespace: str = Field(default_factory=lambda: _env("POD_NAMESPACE") or "choreo-system",
                           description="namespace of the NodeFabric (else $POD_NAMESPACE, "
                           "else choreo-system)")
    pod_name: str | None = Field(default_factory=lambda: _env("POD_NAME"),
                                 description="owner Pod (else $POD_NAME)")
    pod_uid: str | None = Field(default_factory=lambda: _env("POD_UID"),
                                description="owner Pod's UID (else $POD_UID, else read from "
                                "the Pod)")
    pod_namespace: str | None = Field(default_factory=lambda: _env("POD_NAMESPACE"),
                                      description="owner Pod's namespace (else "
                                      "$POD_NAMESPACE)")
    kubeconfig: str | None = Field(None, description="kubeconfig file (else $KUBECONFIG, "
                                   "else the in-cluster account)")
    api: bool = Field(True, description="talk to Kubernetes (--no-api: log and serve "
                      "metrics only)")
    metrics_port: int = Field(9464, ge=-1, le=65535, description="port for /metrics and "
                              "/healthz (0: a free one, -1: off)")
    metrics_address: str = Field("0.0.0.0", description="address /metrics binds")
    log_level: str = Field("INFO", description="logging level")
