"""The NodeFabric spec an agent publishes, and whether a new one is worth a write.

Re-measured alphas and bandwidths wobble by a few percent from run to run; writing every
wobble would wake the operator and make it resynthesize for nothing. A new spec is
significant only if something other than the numbers changed (a device, a link, health,
a count) or a number moved by more than the relative ``threshold``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from choreo_agents.model import DeviceKey, Fit, Inventory, LinkSpec, Peer

NUMERIC = ("alphaSeconds", "bandwidthBytesPerSecond")
ALPHA_FLOOR = 50e-9
"""Alpha changes below 50 ns are noise whatever their relative size."""


def link_healthy(link: LinkSpec, bad: Mapping[DeviceKey, str]) -> bool:
    """Usable: the link itself, both GPU ends and (for a NIC link) the NIC are good."""
    ends = [DeviceKey.of_gpu(link.src), link.device]
    if link.peer.gpu is not None:
        ends.append(DeviceKey.of_gpu(link.peer.gpu))
    if link.peer.nic is not None:
        ends.append(DeviceKey.of_nic(link.peer.nic))
    return not any(k in bad for k in ends)


def fabric_spec(
    node: str,
    inventory: Inventory,
    fits: Mapping[tuple[int, Peer], Fit],
    bad: Mapping[DeviceKey, str],
) -> dict[str, Any]:
    """The NodeFabric spec: measured values where a fit exists, nominal ones otherwise."""
    return {
        "nodeName": node,
        "backend": inventory.backend,
        "gpus": [
            _drop_empty(
                {
                    "index": g.index,
                    "uuid": g.uuid,
                    "pciBusId": g.pci_bus_id,
                    "model": g.model,
                    "healthy": DeviceKey.of_gpu(g.index) not in bad,
                }
            )
            for g in inventory.gpus
        ],
        "links": [_link(link, fits.get((link.src, link.peer)), bad) for link in inventory.links],
        "nics": [
            _drop_empty(
                {
                    "name": n.name,
                    "rail": n.rail,
                    "bandwidthBytesPerSecond": n.bandwidth,
                    "nearestGPU": n.nearest_gpu,
                    "healthy": DeviceKey.of_nic(n.name) not in bad,
                }
            )
            for n in inventory.nics
        ],
    }


def _link(link: LinkSpec, fit: Fit | None, bad: Mapping[DeviceKey, str]) -> dict[str, Any]:
    doc: dict[str, Any] = {"src": link.src}
    if link.peer.gpu is not None:
        doc["dstGPU"] = link.peer.gpu
    elif link.peer.switch is not None:
        doc["dstSwitch"] = link.peer.switch
    else:
        doc["dstNIC"] = link.peer.nic
    alpha, bandwidth = link.alpha, link.bandwidth
    if fit is not None and fit.bandwidth > 0:
        alpha, bandwidth = fit.alpha, fit.bandwidth / link.count
    doc.update(
        kind=link.kind,
        count=link.count,
        alphaSeconds=alpha,
        bandwidthBytesPerSecond=bandwidth,
        healthy=link_healthy(link, bad),
    )
    if fit is not None:
        doc["fit"] = {
            "samples": fit.samples,
            "residualSeconds": fit.residual_seconds,
            "relativeError": fit.relative_error,
        }
    return doc


def _drop_empty(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if v is not None and v != ""}


def significant(old: Mapping[str, Any] | None, new: Mapping[str, Any], threshold: float) -> bool:
    """Whether ``new`` differs from ``old`` beyond measurement noise."""
    if old is None:
        return True
    if _shape(old) != _shape(new):
        return True
    for a, b in zip(old.get("links", []), new.get("links", []), strict=True):
        for field in NUMERIC:
            x, y = float(a.get(field, 0.0)), float(b.get(field, 0.0))
            floor = ALPHA_FLOOR if field == "alphaSeconds" else 0.0
            if abs(x - y) > max(threshold * max(abs(x), abs(y)), floor):
                return True
    return False


def _shape(spec: Mapping[str, Any]) -> Any:
    """The spec without measured numbers and fit details (only whether a link is measured)."""
    links = [
        {**{k: v for k, v in link.items() if k not in NUMERIC and k != "fit"}, "fit": "fit" in link}
        for link in spec.get("links", [])
    ]
    return {**spec, "links": links}


def status_counts(spec: Mapping[str, Any]) -> tuple[int, int]:
    """(healthy GPUs, healthy links) of a spec."""
    gpus = sum(1 for g in spec.get("gpus", []) if g.get("healthy", True))
    links = sum(1 for link in spec.get("links", []) if link.get("healthy", True))
    return gpus, links
