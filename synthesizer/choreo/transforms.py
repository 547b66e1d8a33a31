"""What-if edits of a fabric: failures, degraded links and a tenant's view.

Every transform returns a new ``Topology`` with the same node ids and link indices, so
schedules, ``via`` lists and reports keep referring to the same things: a failed NPU stays in
``kinds`` (listed in ``failed``), a failed link stays in ``links`` with ``healthy=False``.

``--fail`` syntax (``parse_failures``), comma separated:

* ``npu:7`` or ``npu:node1/gpu3`` -- the NPU dies (by id or name);
* ``link:3-4`` -- every link between nodes 3 and 4, both directions, parallel ones included;
  ``link:17`` -- link index 17 only;
* ``degrade:1-2:0.5`` -- links between 1 and 2 keep half their bandwidth (factor in (0, 1]);
  ``degrade:17:0.25`` for one link index.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from choreo.errors import InputError
from choreo.topology import Link, NodeKind, Topology

FAILURE_KINDS = ("npu", "link", "degrade")


@dataclass(frozen=True)
class Failure:
    """One ``--fail`` item, kept as text until applied so names resolve against the fabric."""

    kind: str
    target: str
    factor: float = 0.0

    def __str__(self) -> str:
        return f"{self.kind}:{self.target}" + (
            f":{self.factor:g}" if self.kind == "degrade" else ""
        )


def _node(topo: Topology, ref: int | str, item: str) -> int:
    if isinstance(ref, str):
        text = ref.strip()
        if text.isdigit():
            ref = int(text)
        else:
            try:
                return topo.names.index(text)
            except ValueError:
                raise InputError(f"{item}: no node named '{text}' in {topo.name}") from None
    if not 0 <= ref < topo.num_nodes:
        raise InputError(f"{item}: node {ref} does not exist (0..{topo.num_nodes - 1})")
    return ref


def _npu(topo: Topology, ref: int | str, item: str) -> int:
    v = _node(topo, ref, item)
    if topo.kinds[v] is not NodeKind.NPU:
        raise InputError(f"{item}: {topo.node_name(v)} is a switch, not an NPU")
    return v


def _pair(topo: Topology, text: str, item: str) -> tuple[int, int]:
    """``a-b`` where a and b are ids or names; names may themselves contain '-'."""
    cuts = [i for i, ch in enumerate(text) if ch == "-"]
    for i in cuts:
        left, right = text[:i].strip(), text[i + 1 :].strip()
        try:
            return _node(topo, left, item), _node(topo, right, item)
        except InputError:
            if len(cuts) == 1:
                raise
    raise InputError(f"{item}: expected two nodes like 3-4, got '{text}'")


def _link_indices(topo: Topology, target: int | tuple[int, int] | str, item: str) -> list[int]:
    if isinstance(target, str):
        target = int(target) if target.strip().isdigit() else _pair(topo, target, item)
    if isinstance(target, int):
        if not 0 <= target < len(topo.links):
            raise InputError(f"{item}: link {target} does not exist (0..{len(topo.links) - 1})")
        return [target]
    a, b = (_node(topo, x, item) for x in target)
    found = [i for i in topo.out_links(a) if topo.links[i].dst == b]
    found += [i for i in topo.out_links(b) if topo.links[i].dst == a]
    if not found:
        raise InputError(f"{item}: no link between {topo.node_name(a)} and {topo.node_name(b)}")
    return sorted(found)


def _edit(topo: Topology, indices: Iterable[int], **changes: object) -> Topology:
    links = list(topo.links)
    for i in set(indices):
        links[i] = replace(links[i], **changes)  # type: ignore[arg-type]
    return topo.with_links(links)


# ---- transforms --------------------------------------------------------------------------
def fail_npus(topo: Topology, ids: Iterable[int | str]) -> Topology:
    """Mark NPUs (ids or names) failed; their links become unusable through ``failed``."""
    dead = {_npu(topo, v, f"npu:{v}") for v in ids}
    return replace(topo, failed=topo.failed | dead)


def fail_links(
    topo: Topology, targets: Iterable[int | tuple[int, int] | tuple[str, str] | str]
) -> Topology:
    """Mark links unhealthy: an ``int`` is a link index, a pair ``(a, b)`` (or ``"a-b"``)
    means every link between a and b in both directions."""
    bad: list[int] = []
    for t in targets:
        item = f"link:{t if not isinstance(t, tuple) else '-'.join(map(str, t))}"
        bad += _link_indices(topo, t, item)  # type: ignore[arg-type]
    return _edit(topo, bad, healthy=False)


def degrade_link(
    topo: Topology, target: int | tuple[int, int] | tuple[str, str] | str, factor: float
) -> Topology:
    """Scale the bandwidth of a link (index) or of all links between a pair by ``factor``."""
    label = target if not isinstance(target, tuple) else "-".join(map(str, target))
    item = f"degrade:{label}:{factor}"
    if not 0 < factor <= 1:
        raise InputError(f"{item}: factor must be in (0, 1], got {factor}")
    indices = _link_indices(topo, target, item)  # type: ignore[arg-type]
    links = list(topo.links)
    for i in indices:
        links[i] = replace(links[i], bandwidth=links[i].bandwidth * factor)
    return topo.with_links(links)


def restrict(topo: Topology, npus: Iterable[int | str], relay: bool) -> Topology:
    """A tenant's view of the fabric.

    With ``relay=True`` other NPUs may forward the tenant's data, so the fabric is unchanged
    (only the references are checked). With ``relay=False`` every link touching an NPU outside
    the tenant becomes unhealthy; switches still forward. Connectivity is the caller's check
    (``Topology.check_connected``), so it can name the tenant in the message.
    """
    mine = {_npu(topo, v, f"tenant NPU {v}") for v in npus}
    if not mine:
        raise InputError("tenant: no NPUs given")
    if relay:
        return topo
    others = set(topo.all_npus) - mine
    cut = [i for i, link in enumerate(topo.links) if link.src in others or link.dst in others]
    return _edit(topo, cut, healthy=False)


# ---- --fail ------------------------------------------------------------------------------
def parse_failures(text: str, where: str = "--fail") -> list[Failure]:
    """Parse ``npu:7,link:3-4,degrade:1-2:0.5`` (syntax only; references resolve on apply)."""
    out: list[Failure] = []
    for raw in (x.strip() for x in text.split(",")):
        if not raw:
            continue
        kind, sep, rest = raw.partition(":")
        kind = kind.strip().lower()
        if not sep or kind not in FAILURE_KINDS or not rest.strip():
            raise InputError(
                f"{where}: '{raw}' is not one of npu:ID, link:A-B, link:INDEX, degrade:A-B:FACTOR"
            )
        if kind == "degrade":
            target, sep, factor_text = rest.rpartition(":")
            try:
                factor = float(factor_text)
            except ValueError:
                factor = float("nan")
            if not sep or not target.strip() or not 0 < factor <= 1:
                raise InputError(f"{where}: '{raw}' needs a factor in (0, 1], like degrade:1-2:0.5")
            out.append(Failure(kind, target.strip(), factor))
        else:
            out.append(Failure(kind, rest.strip()))
    return out


def apply_failures(
    topo: Topology, failures: str | Sequence[Failure], where: str = "--fail"
) -> Topology:
    """Apply ``--fail`` items in order; a bad reference names the item."""
    items = parse_failures(failures, where) if isinstance(failures, str) else failures
    for f in items:
        try:
            if f.kind == "npu":
                topo = fail_npus(topo, [f.target])
            elif f.kind == "link":
                topo = fail_links(topo, [f.target])
            else:
                topo = degrade_link(topo, f.target, f.factor)
        except InputError as exc:
            raise InputError(f"{where}: {exc}") from None
    return topo


def link_between(topo: Topology, a: int, b: int) -> list[Link]:
    """Every link from ``a`` to ``b`` (parallel links included)."""
    return [topo.links[i] for i in topo.out_links(a) if topo.links[i].dst == b]
