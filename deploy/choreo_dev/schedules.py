"""A tenant's published schedule read back from its ConfigMap(s) and checked like MSCCL would.

A schedule over the operator's split size is published cut per pod, each part keeping only
that pod's ``<gpu>`` elements under its own key prefix, several parts to a ConfigMap; reading
it back joins the parts into the whole algorithm again, so the same checks
(``msccl.validate``, ``msccl.run``) apply either way.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any

from choreo import msccl
from choreo_dev.kube import ApiException, KubeClient
from choreo_operator import results


@dataclass
class Published:
    """The XML files (joined across parts), the rank table and the ConfigMaps they came from."""

    files: dict[str, str]
    ranks: list[dict[str, Any]]
    configmaps: list[str]
    missing: list[str] = field(default_factory=list)

    @property
    def placed(self) -> set[tuple[str, int]]:
        return {(str(r["node"]), int(r["gpu"])) for r in self.ranks}


def _get(client: KubeClient, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return dict(client.get(f"/api/v1/namespaces/{namespace}/configmaps/{name}"))
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def join_parts(parts: list[str]) -> str:
    """One algorithm from per-pod parts: the first part's header with every part's GPUs."""
    root = ET.fromstring(parts[0])
    for gpu in list(root.findall("gpu")):
        root.remove(gpu)
    gpus = [g for text in parts for g in ET.fromstring(text).findall("gpu")]
    for gpu in sorted(gpus, key=lambda g: int(g.get("id", "0"))):
        root.append(gpu)
    return ET.tostring(root, encoding="unicode")


def load(client: KubeClient, namespace: str, status: dict[str, Any]) -> Published | None:
    """The schedule a CollectiveJob's status names, or None if it names none."""
    name = status.get("configMap")
    if not name:
        return None
    parts = [(p["name"], p.get("keyPrefix") or "")
             for p in status.get("configMapParts") or []] or [(name, "")]
    names = list(dict.fromkeys(n for n, _ in parts))
    found = {n: cm for n in names if (cm := _get(client, namespace, n)) is not None}
    missing = [n for n in names if n not in found]
    if not found:
        return Published({}, [], names, missing)
    # packed files inflated; a part per pod holds that pod's ranks under its prefix
    texts = [(results.xml_files(found[n], prefix),
              json.loads(found[n]["data"][prefix + results.RANKS_KEY]))
             for n, prefix in parts if n in found]
    files = {k: join_parts([t[0][k] for t in texts]) if len(texts) > 1 else texts[0][0][k]
             for k in sorted(texts[0][0])}
    ranks = sorted((r for _, rs in texts for r in rs), key=lambda r: r["rank"])
    return Published(files, ranks, names, missing)


def problems(published: Published) -> list[str]:
    """Why MSCCL would refuse or miscompute the schedule: nothing for a good one."""
    out = [f"ConfigMap {m} is missing" for m in published.missing]
    if not published.files:
        out.append("no MSCCL XML file")
    for key, xml in sorted(published.files.items()):
        out += [f"{key}: {e}" for e in msccl.validate(xml)][:3]
        run = msccl.run(xml)
        if run.ngpus != len(published.ranks):
            out.append(f"{key}: {run.ngpus} GPUs for {len(published.ranks)} ranks")
        if run.errors or run.stalls:
            out.append(f"{key}: run failed: {(run.errors + run.stalls)[:2]}")
    return out
