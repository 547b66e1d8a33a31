"""The NodeFabric spec an agent publishes, and whether a new one is worth a write.

Re-measured alphas and bandwidths wobble by a few percent from run to run; writing every
wobble would wake the operator and make it resynthesize for nothing. A new spec is
significant only if something other than the numbers changed (a device, a link, health,
a count) or a number moved by more than the relative ``threshold``.
"""

from __future__ import annotations

from collections.abc import Mapping

from choreo_agents.model import Fit, Inventory, LinkSpec, Peer
from choreo_api import Device, LinkFit, NodeFabricSpec, NodeGpu, NodeLink, NodeNic

ALPHA_FLOOR = 50e-9
"""Alpha changes below 50 ns are noise whatever their relative size."""


def link_healthy(link: LinkSpec, bad: Mapping[Device, str]) -> bool:
    """Usable: the link itself, both GPU ends and (for a NIC link) the NIC are good."""
    ends = [Device.of_gpu(link.src), link.device]
    if link.peer.gpu is not None:
        ends.append(Device.of_gpu(link.peer.gpu))
    if link.peer.nic is not None:
        ends.append(Device.of_nic(link.peer.nic))
    return not any(k in bad for k in ends)


def fabric_spec(
    node: str,
    inventory: Inventory,
    fits: Mapping[tuple[int, Peer], Fit],
    bad: Mapping[Device, str],
) -> NodeFabricSpec:
    """The NodeFabric spec: measured values where a fit exists, nominal ones otherwise."""
    return NodeFabricSpec(
        node_name=node,
        backend=inventory.backend,
        gpus=tuple(
            NodeGpu(index=g.index, uuid=g.uuid or None, pci_bus_id=g.pci_bus_id or None,
                    model=g.model or None, healthy=Device.of_gpu(g.index) not in bad)
            for g in inventory.gpus
        ),
        links=tuple(
            _link(link, fits.get((link.src, link.peer)), bad) for link in inventory.links
        ),
        nics=tuple(
            NodeNic(name=n.name, rail=n.rail, bandwidth=n.bandwidth, nearest_gpu=n.nearest_gpu,
                    healthy=Device.of_nic(n.name) not in bad)
            for n in inventory.nics
        ),
    )


def _link(link: LinkSpec, fit: Fit | None, bad: Mapping[Device, str]) -> NodeLink:
    alpha, bandwidth = link.alpha, link.bandwidth
    if fit is not None and fit.bandwidth > 0:
        alpha, bandwidth = fit.alpha, fit.bandwidth / link.count
    return NodeLink(
        src=link.src, dst_gpu=link.peer.gpu, dst_switch=link.peer.switch, dst_nic=link.peer.nic,
        kind=link.kind, count=link.count, alpha=alpha, bandwidth=bandwidth,
        healthy=link_healthy(link, bad),
        fit=None if fit is None else LinkFit(
            samples=fit.samples, residual_seconds=fit.residual_seconds,
            relative_error=fit.relative_error,
        ),
    )  # fmt: skip


def significant(old: NodeFabricSpec | None, new: NodeFabricSpec, threshold: float) -> bool:
    """Whether ``new`` differs from ``old`` beyond measurement noise."""
    if old is None:
        return True
    if _shape(old) != _shape(new):
        return True
    for a, b in zip(old.links, new.links, strict=True):
        for x, y, floor in ((a.alpha or 0.0, b.alpha or 0.0, ALPHA_FLOOR),
                            (a.bandwidth, b.bandwidth, 0.0)):  # fmt: skip
            if abs(x - y) > max(threshold * max(abs(x), abs(y)), floor):
                return True
    return False


_MEASURED = LinkFit()


def _shape(spec: NodeFabricSpec) -> NodeFabricSpec:
    """The spec without measured numbers and fit details (only whether a link is measured)."""
    links = tuple(
        link.model_copy(update={"alpha": None, "bandwidth": 1.0, "fit": link.fit and _MEASURED})
        for link in spec.links
    )
    return spec.model_copy(update={"links": links})


def status_counts(spec: NodeFabricSpec) -> tuple[int, int]:
    """(healthy GPUs, healthy links) of a spec."""
    return sum(g.healthy for g in spec.gpus), sum(link.healthy for link in spec.links)
