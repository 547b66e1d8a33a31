"""What the admission webhook adds to a pod, and pointing the API server at the webhook.

A pod selected by a CollectiveJob that has a schedule gets the schedule's ConfigMap as a
read-only volume at ``/etc/choreo`` (XML under ``msccl/``, the rank table at the root) and
what its dialect's runtime reads (``results.pod_env``) in every container, unless the
container sets it itself. A pod admitted before the schedule exists mounts the job's alias
ConfigMap and reads the switch that turns MSCCL off from it, in case NCCL turns out faster at
every size. Pods that already mount a choreo volume are left alone.

Where schedules are packed (compressed XML), the ConfigMap goes to a sidecar instead (an init
container that keeps running, ``choreo unpack``), which inflates it into a volume the pod's
containers read at the same path; they start once its first copy is there, and it follows
the ConfigMap's updates as the kubelet's own projection would.
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Iterable, Mapping
from typing import Any

from choreo_api import CollectiveJob
from choreo_operator import results
from choreo_operator.model import resumed

VOLUME = "choreo-schedule"
FILES_VOLUME = "choreo-files"  # the inflated files, where schedules are packed
UNPACKER = "choreo-unpack"
PACKED_PATH = "/etc/choreo-packed"
ANN_SCHEDULE = "choreo.dev/schedule"
ANN_JOB = "choreo.dev/collectivejob"


def find_job(pod: Mapping[str, Any], jobs: Iterable[CollectiveJob]) -> CollectiveJob | None:
    meta = pod.get("metadata") or {}
    namespace = meta.get("namespace")
    labels = meta.get("labels") or {}
    matches = sorted((j for j in jobs if j.namespace == namespace
                      and j.metadata.deletion_timestamp is None
                      and j.spec.selector.matches(labels)), key=lambda j: j.name)
    return matches[0] if matches else None


def schedule_for(pod: Mapping[str, Any], job: CollectiveJob) -> tuple[str, str] | None:
    """The ConfigMap this pod should mount and the prefix of its keys there: the job's, or
    the one holding its rank's part of a split schedule."""
    parts = resumed(job).config_map_parts
    if not parts:
        name = resumed(job).config_map
        return None if name is None else (name, "")
    meta = pod.get("metadata") or {}
    value = {**(meta.get("annotations") or {}),
             **(meta.get("labels") or {})}.get(job.spec.rank_label)
    try:
        rank = int(value) if value is not None else None
    except ValueError:
        rank = None
    if rank is None:
        return None
    return next(((p.name, p.key_prefix or "") for p in parts
                 if p.pod_rank == rank and p.name), None)


def mutation(pod: Mapping[str, Any], jobs: Iterable[CollectiveJob],
             unpack_image: str | None = None) -> dict[str, Any] | None:
    """The changed parts of the pod (``volumes``, ``containers``, annotations and, with
    ``unpack_image``, ``initContainers``), or None."""
    spec = pod.get("spec") or {}
    volumes = list(spec.get("volumes") or [])
    if any(v.get("name") == VOLUME for v in volumes):
        return None
    job = find_job(pod, jobs)
    if job is None:
        return None
    found = schedule_for(pod, job) if resumed(job).config_map else None
    dialect = job.spec.dialect
    env: list[dict[str, Any]]
    if found is not None:
        name, prefix = found
        files = list(resumed(job).files or ())
        source: dict[str, Any] = {"name": name, "items": results.volume_items(files, prefix)}
        env = [{"name": k, "value": v} for k, v in results.pod_env(files, dialect).items()]
    else:  # no schedule yet: the alias, filled in (and refreshed by the kubelet) once it exists
        name = results.alias_name(job.name)
        files = results.possible_files(job)
        source = {"name": name, "items": results.volume_items(files), "optional": True}
        env = [{"name": k, "value": v} for k, v in results.pod_env(files, dialect).items()]
        env += [{"name": k, "valueFrom": {"configMapKeyRef": {
            "name": name, "key": k, "optional": True}}} for k in results.MSCCL_OFF[dialect]]
    volumes.append({"name": VOLUME, "configMap": {**source, "defaultMode": 0o444}})
    change: dict[str, Any] = {"volumes": volumes}
    read_from = VOLUME
    if unpack_image is not None:
        volumes.append({"name": FILES_VOLUME, "emptyDir": {}})
        change["initContainers"] = [unpacker(unpack_image),
                                    *copy.deepcopy(spec.get("initContainers") or [])]
        read_from = FILES_VOLUME
    containers = []
    for c in spec.get("containers") or []:
        c = copy.deepcopy(c)
        have = {e.get("name") for e in c.get("env") or []}
        c["env"] = list(c.get("env") or []) + [e for e in env if e["name"] not in have]
        mounts = list(c.get("volumeMounts") or [])
        mounts.append({"name": read_from, "mountPath": results.MOUNT_PATH, "readOnly": True})
        c["volumeMounts"] = mounts
        containers.append(c)
    return {**change, "containers": containers,
            "annotations": {ANN_SCHEDULE: name, ANN_JOB: job.name}}


def unpacker(image: str) -> dict[str, Any]:
    """The sidecar that inflates the schedule's ConfigMap for the pod's containers. As a
    restartable init container it starts first, and the containers only once its startup
    probe finds the first copy (``..data``, as the kubelet names its own)."""
    return {
        "name": UNPACKER, "image": image, "restartPolicy": "Always",
        "args": ["unpack", "--source", PACKED_PATH, "--target", results.MOUNT_PATH],
        "volumeMounts": [{"name": VOLUME, "mountPath": PACKED_PATH, "readOnly": True},
                         {"name": FILES_VOLUME, "mountPath": results.MOUNT_PATH}],
        "startupProbe": {"exec": {"command": ["test", "-e", f"{results.MOUNT_PATH}/..data"]},
                         "periodSeconds": 1, "failureThreshold": 300},
        "resources": {"requests": {"cpu": "10m", "memory": "48Mi"},
                      "limits": {"memory": "256Mi"}},
        "securityContext": {"runAsNonRoot": True, "readOnlyRootFilesystem": True,
                            "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]}},
    }


async def point_at(api: Any, name: str, url: str, ca_pem: bytes) -> None:
    """Set every webhook of MutatingWebhookConfiguration ``name`` to ``url`` with our CA."""
    path = f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{name}"
    config = await api.get(path)
    hooks = config.get("webhooks") or []
    for hook in hooks:
        hook["clientConfig"] = {"url": url, "caBundle": base64.b64encode(ca_pem).decode()}
    await api.merge_patch(path, {"webhooks": hooks})
