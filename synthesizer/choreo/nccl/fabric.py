"""What NCCL sees of a choreo fabric: hosts, the GPUs of the communicator on each, how the
GPUs of a host reach each other (NVSwitch, direct NVLink or neither) and their NICs.

NCCL discovers this per host (``src/graph/topo.cc``); choreo's ``Topology`` holds it as node
names and links, so it is read back from there:

* a host is the prefix of an NPU's name (``node3/gpu5`` -> ``node3``); an NPU without a
  ``host/`` name is a host of its own (one GPU per node, as NCCL would run on a torus);
* a host's NVSwitch is a switch named with the host prefix that every GPU of the host has a
  usable link to; in-network reduction (NVLS) needs it to be in ``Topology.reducing``;
* a NIC is a usable link pair between a GPU and a switch outside the host (a rail or leaf
  switch); its rail is that switch. A failed NIC (either direction down) is no NIC at all.

Failed GPUs are not in the communicator (a job restarted after a GPU failure runs with the
ranks that are left), so a host may hold fewer GPUs than its neighbours.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from choreo.errors import InputError
from choreo.topology import Topology

NVLINK_KINDS = frozenset({"nvlink", "nvswitch", "xgmi"})
ARCHES = ("volta", "ampere", "hopper")


@dataclass(frozen=True)
class Nic:
    """One usable NIC: the GPU it hangs off, its rail switch and the two link ids."""

    gpu: int
    rail: int
    up: int
    down: int
    bandwidth: float


@dataclass(frozen=True)
class Host:
    """The communicator's GPUs on one host, in local order, and how they are joined."""

    name: str
    gpus: tuple[int, ...]
    nics: tuple[Nic, ...]
    switch: int | None  # the host's NVSwitch, when every GPU has a usable port on it
    nvls: bool  # that switch reduces in the network
    nvlink: bool  # GPUs reach each other over NVLink-class links (switch or direct)
    gpu_bandwidth: float  # slowest GPU's NVLink bandwidth into the host (B/s, one way)

    @property
    def ppn(self) -> int:
        return len(self.gpus)


@dataclass(frozen=True)
class NcclFabric:
    """The communicator as NCCL sees it: ``ranks`` in rank order, grouped into ``hosts`` in
    the order their first rank appears (NCCL's node order)."""

    topo: Topology
    ranks: tuple[int, ...]
    hosts: tuple[Host, ...]
    arch: str

    @property
    def n_nodes(self) -> int:
        return len(self.hosts)

    @property
    def n_ranks(self) -> int:
        return len(self.ranks)

    @property
    def ppn(self) -> float:
        return self.n_ranks / self.n_nodes

    @property
    def nvls(self) -> bool:
        """NVLS needs every host's GPUs on one reducing NVSwitch, and more than one of them."""
        return all(h.nvls and h.ppn > 1 for h in self.hosts)

    @property
    def nvlink(self) -> bool:
        return all(h.nvlink for h in self.hosts if h.ppn > 1)

    @property
    def has_nics(self) -> bool:
        return self.n_nodes > 1 and all(h.nics for h in self.hosts)

    @property
    def gpu_bandwidth(self) -> float:
        multi = [h.gpu_bandwidth for h in self.hosts if h.ppn > 1]
        return min(multi) if multi else 0.0

    @property
    def nic_bandwidth(self) -> float:
        """Slowest NIC any host uses, or (no NIC information) the fastest single link out of
        the slowest GPU: NCCL then sends over one path, like a host with one NIC. A GPU with
        no usable link out of its host (its only one failed) reaches the others through a
        peer's, so it does not count; 0 where no GPU has one."""
        if self.has_nics:
            return min(nic.bandwidth for h in self.hosts for nic in h.nics)
        best = []
        for h in self.hosts:
            for g in h.gpus:
                out = [self.topo.links[i].bandwidth for i in self.topo.out_links(g)
                       if self.topo.usable(i) and self.topo.links[i].dst not in h.gpus]
                if out:
                    best.append(max(out))
        return min(best, default=0.0)


def host_name(topo: Topology, v: int) -> str:
    name = topo.names[v] if topo.names else ""
    return name.split("/", 1)[0] if "/" in name else f"npu{v}"


def describe(topo: Topology, ranks: Sequence[int], arch: str | None = None) -> NcclFabric:
    """The NCCL view of the communicator ``ranks`` on ``topo``; ``arch`` (volta, ampere,
    hopper) picks NCCL's per-generation constants and is inferred when None."""
    if arch is not None and arch not in ARCHES:
        raise InputError(f"arch: unknown GPU generation {arch!r} (known: {', '.join(ARCHES)})")
    for v in ranks:
        if not 0 <= v < topo.num_nodes or not topo.is_npu(v):
            raise InputError(f"ranks: node {v} is not an NPU of {topo.name}")
        if v in topo.failed:
            raise InputError(f"ranks: NPU {topo.node_name(v)} has failed")
    groups: dict[str, list[int]] = {}
    for v in ranks:
        groups.setdefault(host_name(topo, v), []).append(v)
    hosts = tuple(_host(topo, name, sorted(gpus)) for name, gpus in groups.items())
    fab = NcclFabric(topo, tuple(ranks), hosts, "volta")
    return NcclFabric(topo, tuple(ranks), hosts, arch or _infer_arch(fab))


def _infer_arch(fab: NcclFabric) -> str:
    """NVLink SHARP exists from Hopper on; otherwise the per-GPU NVLink bandwidth tells the
    generation apart (V100 <= 150 GB/s, A100 300, H100 450 nominal each way)."""
    if any(h.nvls for h in fab.hosts):
        return "hopper"
    bw = fab.gpu_bandwidth
    return "hopper" if bw >= 320e9 else "ampere" if bw >= 200e9 else "volta"


def _host(topo: Topology, name: str, gpus: list[int]) -> Host:
    prefix = name + "/"
    local = set(gpus)

    def inside(node: int) -> bool:
        return node in local or (bool(topo.names) and topo.names[node].startswith(prefix))

    nics: list[Nic] = []
    switch_bw: dict[int, dict[int, float]] = {}
    direct_bw: dict[int, float] = {g: 0.0 for g in gpus}
    nvlink_direct = False
    for g in gpus:
        for i in topo.out_links(g):
            if not topo.usable(i):
                continue
            lk = topo.links[i]
            peer = lk.dst
            if topo.is_npu(peer):
                if peer in local:
                    direct_bw[g] += lk.bandwidth
                    nvlink_direct |= lk.kind in NVLINK_KINDS
                continue
            if inside(peer):
                switch_bw.setdefault(peer, {}).setdefault(g, 0.0)
                switch_bw[peer][g] += lk.bandwidth
                continue
            back = [j for j in topo.in_links(g) if topo.links[j].src == peer and topo.usable(j)]
            if back:
                nics.append(Nic(g, peer, i, back[0], min(lk.bandwidth,
                                                         topo.links[back[0]].bandwidth)))
    switch = None
    for sw, per_gpu in sorted(switch_bw.items()):
        ports_back = {topo.links[j].dst for j in topo.out_links(sw) if topo.usable(j)}
        if len(per_gpu) == len(gpus) and local <= ports_back:
            switch = sw
            break
    if switch is not None:
        gpu_bw = min(switch_bw[switch].values())
        nvlink = any(topo.links[i].kind in NVLINK_KINDS for i in topo.out_links(gpus[0])
                     if topo.links[i].dst == switch)
    else:
        gpu_bw = min(direct_bw.values()) if len(gpus) > 1 else 0.0
        nvlink = nvlink_direct
    nvls = switch is not None and switch in topo.reducing and switch not in topo.failed
    nics.sort(key=lambda n: (n.rail, n.gpu))
    return Host(name, tuple(gpus), tuple(nics), switch, nvls, nvlink, gpu_bw)
