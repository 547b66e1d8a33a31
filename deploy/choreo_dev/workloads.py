"""Manifests for the smoke workloads that prove fake GPU nodes really run pods."""

from __future__ import annotations

from typing import Any

from choreo_dev.fabric import GPU_RESOURCE
from choreo_dev.kube import KubeClient, wait_for


def gpu_job(name: str, namespace: str, gpus: int = 1) -> dict[str, Any]:
    """A batch/v1 Job with one pod that requests GPUs, so only a GPU node can take it."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": {"nvidia.com/gpu.present": "true"},
                    "containers": [
                        {
                            "name": "work",
                            "image": "busybox:1.36",
                            "command": ["true"],
                            "resources": {
                                "limits": {GPU_RESOURCE: str(gpus)},
                                "requests": {GPU_RESOURCE: str(gpus)},
                            },
                        }
                    ],
                }
            },
        },
    }


def job_condition(job: dict[str, Any]) -> str | None:
    """``Complete`` or ``Failed`` once the Job has finished, else ``None``."""
    for cond in job.get("status", {}).get("conditions") or []:
        if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
            return str(cond["type"])
    return None


def wait_job(client: KubeClient, name: str, namespace: str, timeout: float = 120.0) -> str:
    """Wait for a Job to finish and return how (``Complete`` or ``Failed``)."""
    path = f"/apis/batch/v1/namespaces/{namespace}/jobs/{name}"
    return wait_for(lambda: job_condition(client.get(path)), timeout, f"Job {namespace}/{name}")
