"""Rail-aligned AllGather, ReduceScatter and AllReduce on multi-GPU hosts with one NIC per GPU.

On such fabrics the bound is the NICs (many hosts) or the GPUs' NVSwitch ports (few hosts),
and the greedy matcher's choices across the two levels leave 3-7% of it unused. The plan
here is the packing of broadcast trees that reaches both (ForestColl's trees, written down
for rails): every rank's shard crosses the hosts on its own rail, once into each host, and
each GPU hands what arrives on its rail to its host mates over NVSwitch. Where hosts are few
the NVSwitch ports are the bound and the NICs have room, so the first ``relay`` chunks of
every shard also cross on the other rails (a mate relays them), which moves load from the
NVSwitch ports onto the NICs until both take equally long.

Per shard of ``chunks`` chunks, rank ``(h, u)`` (host ``h``, slot ``u``):

* sends its shard over NVSwitch to every mate, the relayed chunks first;
* sends its whole shard on rail ``u`` to ``(h', u)`` on every other host ``h'`` (rotating,
  so every NIC receives from one peer at a time; the last rounds in pieces that shrink
  towards the end, so the mates' copies of the last arrivals end soon after them);
* forwards the unrelayed chunks of each shard that arrives on its rail to its mates;
* sends the relayed chunks of its mates' shards on its rail to every other host, last: they
  end where they land, so they fill the NICs while the NVSwitch ports drain (in a
  ReduceScatter, also while a NIC waits for the mates to have a piece of the own shard).

Each rail round costs a NIC a send's latency, and a plan of many hosts has many rounds. So
after a round or two of its own shard a rank may send blocks of ``group`` mates' shards
instead (consecutive ranks: one range of the buffer; a block of all the host's shards holds
the sender's own too, which its MSCCL program reads from another buffer, so the lowering
cuts those sends at it, ``msccl.layout.own_apart``): a round of blocks reaches ``group``
hosts, one per rail of each group of slots, so every NIC still carries its share and
receives from one host at a time, in about ``1 / group`` the rounds (``block_moves``). A
port then forwards a block in one send a mate, and where the ports are the bound a round
of blocks relays too: its block's first chunks reach the receiver's group mates on their
own rails, not through the port.

Under a spine (rail leaves per block, ``rail_layout``) a shard sent along the rail to every
host would cross the oversubscribed uplinks once per host of another block. There the rail
rounds cross into each other block once and the host in that block forwards the shard to
its block mates, half of a block's hosts crossing at a time where there are enough, or
tenants under the same leaves taking turns (``rail_moves``).

Every chunk reaches every rank once (a broadcast tree per shard), so ReduceScatter is the
same plan on reversed links, inverted in time, and AllReduce that ReduceScatter followed by
the AllGather, both cut into the same chunks. Sends are tagged with their start in a
per-GPU estimate (`_Estimate`), routed on the fabric and timed by the congestion simulator,
like the hierarchical AllReduce (``choreo.hierarchy``).
"""

from __future__ import annotations

import collections
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from choreo.collectives import Collective, Demand
from choreo.errors import InputError
from choreo.hierarchy import MAX_HOST_STEPS, Hop, hosts_of
from choreo.msccl.layout import MAX_CNT
from choreo.routing import timed_plan
from choreo.schedule import Op, Schedule
from choreo.topology import Link, Topology

ENGINE = "rail-gather"
COLLECTIVES = (Collective.ALLGATHER, Collective.REDUCESCATTER, Collective.ALLREDUCE)
# Chunks per shard the estimate chooses from, up to what one MSCCL step moves (``MAX_CNT``):
# finer chunks make the rail's last pieces and the relayed share finer (on switch2d-16x16
# the ports balance at 1/49 of a shard relayed).
CHUNK_CHOICES = (1, 2, 4, 8, 16, 32, 64)
# The rail's last pieces: (chunks of the last one, 0 for whole rounds to the end; how fast
# the ones before it shrink; in how many last rounds each, 0 for across rounds).
TAILS = ((0, 0.5, 0), *itertools.product((1, 2), (0.5, 0.75, 0.87), (0, 2, 3, 4)))
SPLITS = (1, 2, 4, 8)  # pieces of the own shard that leave on the rail one after another


def layout(fabric: Topology, demand: Demand) -> list[list[int]] | None:
    """``rail_layout``'s hosts, or None where the plan does not apply."""
    found = rail_layout(fabric, demand)
    return None if found is None else found[0]


def rail_layout(fabric: Topology, demand: Demand) -> tuple[list[list[int]], int] | None:
    """Per host, its rank indices in slot order, and the number of blocks, where the plan
    applies: an AllGather, ReduceScatter or AllReduce over several hosts that all hold the
    same slots, on a rail fabric: every rank has one working link to its host's switch and
    one to a switch outside (its NIC). A *block* is the hosts whose ranks of each slot
    share that rail switch (one block: every slot's ranks share one; several: rail leaves
    under a spine, for an AllGather: inverted, the plan's forwards would have a GPU reduce
    what its block sends while its mates send theirs, which lowers only in some cases, and
    the greedy engine was faster there); every block holds as many of the demand's hosts,
    and the hosts come block by block. None elsewhere (the greedy engine plans those: direct
    GPU links or several NICs per GPU break the plan's model of two ports)."""
    if demand.collective not in COLLECTIVES:
        return None
    hosts = hosts_of(fabric, demand.ranks)
    if hosts is None or len(hosts) < 2:
        return None
    slots = [s for s, _ in hosts[0]]
    if len(slots) < 2 or any([s for s, _ in h] != slots for h in hosts):
        return None
    blocks: dict[tuple[int, ...], list[list[int]]] = {}
    for members in hosts:
        ports = [_ports(fabric, demand.ranks[r]) for _, r in members]
        if any(p is None for p in ports) or len({p[0] for p in ports if p}) != 1:
            return None
        rails = tuple(p[1] for p in ports if p)
        blocks.setdefault(rails, []).append([r for _, r in members])
    leaves = [sw for rails in blocks for sw in set(rails)]
    if len(set(leaves)) != len(leaves) or len({len(b) for b in blocks.values()}) != 1:
        return None  # a rail switch in two blocks, or blocks of unlike sizes
    if len(blocks) == 1:
        return [[r for _, r in h] for h in hosts], 1
    if demand.collective is not Collective.ALLGATHER:
        return None  # inverted, a gateway reduces what its block sends while its mates do
    return [h for block in blocks.values() for h in block], len(blocks)


def _ports(fabric: Topology, v: int) -> tuple[int, int] | None:
    """(host switch, rail switch) of NPU ``v`` where it has exactly one working link to
    each and one back from each, and none to another NPU."""
    prefix = fabric.names[v].split("/", 1)[0] + "/"
    inside: list[int] = []
    outside: list[int] = []
    for k in fabric.out_links(v):
        if not fabric.usable(k):
            continue
        dst = fabric.links[k].dst
        if fabric.is_npu(dst):
            return None
        (inside if fabric.names[dst].startswith(prefix) else outside).append(dst)
    if len(inside) != 1 or len(outside) != 1:
        return None
    back = [fabric.links[k].src for k in fabric.in_links(v) if fabric.usable(k)]
    if sorted(back) != sorted(inside + outside):
        return None
    return inside[0], outside[0]


def hops(fabric: Topology, ranks: Sequence[int]) -> tuple[Hop, Hop]:
    """Cost of a send between host mates and of one along a rail, at the slowest of the
    ranks' links (measured rates differ link to link; the plan's rounds go at the pace of the
    slowest, as the greedy engine plans near-equal links at the slowest of them)."""
    host: list[Link] = []
    rail: list[Link] = []
    for v in ranks:
        ports = _ports(fabric, v)
        assert ports is not None  # ``layout`` has checked
        for k in (*fabric.out_links(v), *fabric.in_links(v)):
            link = fabric.links[k]
            if fabric.usable(k):
                (host if ports[0] in (link.src, link.dst) else rail).append(link)
    def slowest(links: list[Link]) -> Hop:  # a send's circuit holds a link up and one down
        return Hop(2 * max(lk.alpha for lk in links), 1 / min(lk.bandwidth for lk in links))

    return slowest(host), slowest(rail)


@dataclass(frozen=True)
class Shape:
    """One candidate plan: ``chunks`` per shard, the first ``relay`` of them crossing on every
    rail; the own shard leaves on the rail in pieces (the relayed chunks, then the rest in
    ``split`` parts), and the last rail rounds of the last piece in pieces that shrink by
    ``taper`` down to ``tail`` chunks (in each of the last ``rounds`` rounds, or across
    rounds where that is 0), or where ``cuts`` are given (``paced_cuts``, the last first)
    in those. In a ReduceScatter (the plan inverted) a piece goes to the mates before it
    leaves on the rail, or where ``late`` (all but the last piece) after, or where
    ``between`` between its first two rail rounds, which alone are cut into the pieces.
    ``group`` above 1 (without pieces of the own shard): the rail rounds after the first
    send blocks of that many mates' shards (``widths``, ``block_moves``), the last of them
    cut as ``cuts`` says; a ReduceScatter's own shard then goes to the mates in two parts
    around its last rail round (``_grouped``), the first ``part`` chunks (half where 0)
    leaving first. ``relay`` there: in each round of blocks of ``group`` the block's first ``relay``
    chunks reach the receiver's group mates on their own rails (``relay_ahead``), last, and
    its forwards to them leave those out."""

    chunks: int
    relay: int
    tail: int
    split: int = 1
    late: bool = False
    taper: float = 0.5
    rounds: int = 0
    cuts: tuple[int, ...] = ()
    between: bool = False
    group: int = 1
    part: int = 0

    def widths(self, hosts: int) -> list[int]:
        """Shards each rail round sends (``hosts - 1`` in all): 1 in every round where
        ``group`` is 1; else blocks of ``group`` mates' shards, after a round of the own
        shard (the NIC's work while the mates' shards come) and as few rounds of smaller
        blocks (powers of two, the smallest first) as leave those whole."""
        if self.group == 1:
            return [1] * (hosts - 1)
        whole, rest = divmod(hosts - 1, self.group)
        if not rest:
            whole, rest = whole - 1, self.group
        first = [1] + [1 << b for b in range((rest - 1).bit_length()) if (rest - 1) >> b & 1]
        return first + [self.group] * whole

    def singles(self, hosts: int) -> int:
        """The first rail rounds, those that send the own shard alone."""
        widths = self.widths(hosts)
        return next((k for k, w in enumerate(widths) if w > 1), len(widths))

    def cut_widths(self, hosts: int, reduced: bool) -> list[int]:
        """Chunks of each rail round that ``cuts`` may cut in a plan of blocks, in order: all
        of them, but a ReduceScatter's own shard's rounds, which go whole (``_grouped``)."""
        widths = [w * self.chunks for w in self.widths(hosts)]
        return widths[self.singles(hosts):] if reduced else widths

    @property
    def pieces(self) -> tuple[tuple[int, int], ...]:
        """The own shard's pieces in order: (first chunk, end chunk)."""
        rest = self.chunks - self.relay
        cuts = [self.relay + k * rest // self.split for k in range(self.split + 1)]
        head = ((0, self.relay),) if self.relay else ()
        return head + tuple((a, b) for a, b in itertools.pairwise(cuts) if b > a)

    def rail_units(self, hosts: int, lo: int, hi: int, cut: bool = True
                   ) -> list[tuple[int, int, int]]:
        """Rail sends of chunks ``lo..hi-1`` of the own shard in order: (round, first, end).
        Where ``cut`` and ``tail``, the last rounds go in pieces that grow back from the
        last one, ``tail`` chunks, by ``1 / taper`` each (within each of the last ``rounds``
        rounds, or across rounds until a whole one where ``rounds`` is 0): a piece arrives
        while the one before it is copied to the mates, so the copies end soon after the
        last arrival."""
        if self.group > 1:
            return self._block_units(hosts, cut)
        if cut and self.cuts:
            return self._cut_units(hosts, lo, hi)
        units: list[tuple[int, int, int]] = []
        size, k, at = self.tail, hosts - 1, hi
        while cut and self.tail and k >= 1 and not (at == hi and size >= hi - lo):
            if self.rounds and k <= hosts - 1 - self.rounds:
                break
            first = max(lo, at - size)
            units.append((k, first, at))
            size = max(size + 1, int(size / self.taper))  # a cut at a round start is kept
            k, at = (k - 1, hi) if first == lo else (k, first)
            if self.rounds and at == hi:
                size = self.tail
        units += [(j, lo, at if j == k else hi) for j in range(k, 0, -1) if at > lo or j < k]
        return units[::-1]

    def _block_units(self, hosts: int, cut: bool) -> list[tuple[int, int, int]]:
        """``rail_units`` where the rounds send blocks (``widths``): each round's chunks
        of its block, the last rounds in ``cuts`` (the last first) where ``cut``."""
        widths = [w * self.chunks for w in self.widths(hosts)]
        units: list[tuple[int, int, int]] = []
        k, at = len(widths), widths[-1]
        for size in self.cuts if cut else ():
            if k < 1:
                break
            first = max(0, at - size)
            units.append((k, first, at))
            if first:
                at = first
            else:
                k -= 1
                at = widths[k - 1] if k else 0
        units += [(j, 0, at if j == k else widths[j - 1]) for j in range(k, 0, -1)
                  if at > 0 or j < k]
        return units[::-1]

    def _cut_units(self, hosts: int, lo: int, hi: int) -> list[tuple[int, int, int]]:
        """``rail_units`` with the last pieces as ``cuts`` says, each within its round."""
        units: list[tuple[int, int, int]] = []
        k, at = hosts - 1, hi
        for size in self.cuts:
            if k < 1:
                break
            first = max(lo, at - size)
            units.append((k, first, at))
            k, at = (k - 1, hi) if first == lo else (k, first)
        units += [(j, lo, at if j == k else hi) for j in range(k, 0, -1) if at > lo or j < k]
        return units[::-1]


@dataclass
class _Estimate:
    """The sends of one GPU (every GPU alike), each with its estimated start: ``nvl`` are
    (start, turn, first chunk, end chunk, whose shard: -k for the rail round k's, 0 own),
    ``nic`` are (start, round, first chunk, end chunk, mate turn or 0 for the own shard;
    in a plan of blocks, the other host its relayed chunks go to, ``_Nic.send``)."""

    nvl: list[tuple[float, int, int, int, int]]
    nic: list[tuple[float, int, int, int, int]]
    end: float
    # MSCCL steps of one GPU's sends, each at both ends (a step per MAX_CNT chunks of a
    # range and per buffer it spans; a mean over the host's GPUs where they differ)
    steps: float


@dataclass
class _Nic:
    """One GPU's NIC in ``estimate``: its sends in order (``_Estimate.nic``), when it is
    free, and what arrives on it (every GPU alike: when, round, first chunk, end; the
    relayed chunks land where they arrive and are not forwarded)."""

    rail: Hop
    cb: float
    relayed: int
    hosts: int
    u: float = 0.0
    sends: list[tuple[float, int, int, int, int]] = field(default_factory=list)
    arrivals: list[tuple[float, int, int, int]] = field(default_factory=list)
    relays: collections.deque[list[int]] = field(default_factory=collections.deque)
    copied: dict[int, float] = field(default_factory=dict)

    def send(self, k: int, a: int, b: int, after: float = 0.0, other: int = 0) -> None:
        """Chunks ``a..b-1`` of what round ``k`` sends (the own shard, or a block of mates'
        shards) on the rail, not before ``after``; where ``other`` (1 ..), a plan of blocks'
        relayed chunks to the round's ``other``-th other host (``relay_ahead``), which land
        where they arrive."""
        u = self.u if self.u >= after else after
        self.sends.append((u, k, a, b, other))
        self.u = u = u + self.rail.alpha + (b - a) * self.cb * self.rail.beta
        if not other:
            self.arrivals.append((u, k, a if a > self.relayed else self.relayed, b))

    def mates_copied(self, copied: dict[int, float]) -> None:
        """The mates have their relayed chunks here at ``copied`` (turn -> when): their
        rail sends, in that order, to every other host (``relays``: each mate's turn and
        the next round it sends in)."""
        self.copied = copied
        self.relays = collections.deque([turn, 1] for turn in sorted(copied,
                                                                     key=copied.__getitem__))

    def relay(self, until: float) -> None:
        """Send the mates' relayed chunks on the rail, in turn, while they end by ``until``
        (all of them where it is infinite)."""
        secs = self.rail.time(self.relayed * self.cb)
        while self.relays:
            turn, k = self.relays[0]
            start = max(self.u, self.copied[turn])
            left = self.hosts - k
            fit = left if until == math.inf or secs <= 0 else min(
                left, int((until - start) / secs))
            if fit <= 0:
                return
            self.sends.extend((start + j * secs, k + j, 0, self.relayed, turn)
                              for j in range(fit))
            self.u = start + fit * secs
            if fit < left:
                self.relays[0][1] = k + fit
                return
            self.relays.popleft()


def estimate(shape: Shape, mates: int, hosts: int, shard: float, host: Hop, rail: Hop,
             reduced: bool = True, record: bool = True) -> _Estimate:
    """Start of every send of one GPU, its NVSwitch port and NIC each serving its sends one
    at a time in plan order: a forward waits for its arrival, a relayed send for the mate's
    copy (every GPU sends its ``turn``-th copy to the mate ``turn`` places on). Where the
    plan is ``reduced`` (a ReduceScatter, the plan inverted) no two sends of the same own
    chunks overlap: inverted, each adds into the one buffer MSCCL holds them in, so they
    run one after another. A piece of the own shard then leaves on the rail once the mates
    have it (the NIC sends the mates' relayed chunks while it waits, where they fit), or,
    ``between``, goes to the mates between its first two rail rounds, the port's forwards
    filling around those copies. Rounds of blocks of mates' shards (``group``): see
    ``_grouped``. Without ``record`` the forwards are counted but not listed, for the
    search."""
    cb = shard / shape.chunks
    pieces = shape.pieces
    between = reduced and shape.between and len(pieces) > 1
    # A ReduceScatter's own pieces go to the mates before they leave on the rail; without
    # relayed chunks all but the last go after, so the NIC starts at once.
    late = reduced and shape.late and not shape.relay and len(pieces) > 1 and not between
    nic = _Nic(rail, cb, 0 if shape.group > 1 else shape.relay, hosts)
    nvl: list[tuple[float, int, int, int, int]] = []
    busy: list[tuple[float, float]] = []  # the own shard's copies the port forwards around
    if between:
        end = _between(shape, mates, hosts, cb, host, nic, nvl, busy)
    elif shape.group > 1:
        end = _grouped(shape, mates, hosts, cb, host, nic, nvl, busy, reduced)
    else:
        end = _before(shape, mates, hosts, cb, host, nic, nvl, late, reduced)
    nic.relay(math.inf)
    port_steps = len(nvl)  # the own shard's copies, a step each
    t = 0.0 if between else end
    # Forward the unrelayed part of what came. A piece that has arrived by the time the
    # NVSwitch port is free joins the one before it where it continues it (same round, next
    # chunks): a port that falls behind pays one send's latency for both, not one a piece.
    came = [a for a in sorted(nic.arrivals) if a[3] > a[2]]
    ahead = collections.deque(busy)  # the copies of the own pieces the port has not passed
    # A plan of blocks that relays chunks: in its rounds of ``group`` the first turns
    # (``forward_mates``) had the block's first ``relay`` chunks from their own rails.
    inside = shape.group - 1 if shape.group > 1 and shape.relay else 0
    relayed_rounds = {k for k, w in enumerate(shape.widths(hosts), 1)
                      if w == shape.group} if inside else set()
    i = 0
    while i < len(came):
        at, k, lo, hi = came[i]
        t = max(t, at)
        i += 1
        while i < len(came) and came[i][1] == k and came[i][2] == hi and came[i][0] <= t:
            hi = came[i][3]
            i += 1
        while ahead and ahead[0][1] <= t:
            ahead.popleft()
        if k in relayed_rounds:  # (first chunk, end chunk, first turn, end turn)
            rest = max(lo, shape.relay)
            legs = [(rest, hi, 1, inside + 1)] * (hi > rest) + [(lo, hi, inside + 1, mates)]
            forward_steps = sum((e - f) * msccl_steps(b - a) for a, b, f, e in legs)
            took = sum((e - f) * host.time((b - a) * cb) for a, b, f, e in legs)
        else:  # the common case, kept cheap for the search
            legs = [(lo, hi, 1, mates)]
            forward_steps, took = ((mates - 1) * msccl_steps(hi - lo),
                                   (mates - 1) * host.time((hi - lo) * cb))
        port_steps += forward_steps
        if not record and not (ahead and ahead[0][0] < t + took):
            t += took
            continue
        for a, b, first, stop in legs:
            one = host.time((b - a) * cb)
            for turn in range(first, stop):
                while ahead and ahead[0][0] < t + one:  # a send at a time around the copies
                    t = max(t, ahead.popleft()[1])
                if record:
                    nvl.append((t, turn, a, b, -k))
                t += one
    if busy:
        nvl.sort()
    return _Estimate(nvl, nic.sends, max(t, nic.u, end),
                     port_steps + _rail_steps(shape, mates, hosts, nic.sends))


def msccl_steps(chunks: int) -> int:
    """MSCCL steps of a send of ``chunks`` consecutive chunks in one buffer."""
    return -(-chunks // MAX_CNT)


def _rail_steps(shape: Shape, mates: int, hosts: int,
                sends: Sequence[tuple[float, int, int, int, int]]) -> float:
    """MSCCL steps of one GPU's rail ``sends`` (``_Estimate.nic``), the mean over a host's
    GPUs: a round of blocks of the whole host's shards is cut at the sender's own
    (``msccl.layout.own_apart``), which lies at another place of the block on each GPU."""
    whole = {k for k, w in enumerate(shape.widths(hosts), 1) if w == mates > 1}
    c, total = shape.chunks, 0.0
    for _, k, a, b, _ in sends:
        if k not in whole:
            total += msccl_steps(b - a)
            continue
        for p in range(mates):
            edges = [a, *(e for e in (p * c, p * c + c) if a < e < b), b]
            total += sum(msccl_steps(y - x) for x, y in itertools.pairwise(edges)) / mates
    return total


def _before(shape: Shape, mates: int, hosts: int, cb: float, host: Hop, nic: _Nic,
            nvl: list[tuple[float, int, int, int, int]], late: bool, reduced: bool) -> float:
    """``estimate``'s own shard where its pieces go to the mates before they leave on the
    rail (all at once in an AllGather; in a ReduceScatter one after another, the NIC
    waiting for each, or, ``late``, all but the last after). Returns when the port's
    copies end."""
    pieces = shape.pieces
    t = 0.0
    # turn -> when the mate ``turn`` places back had copied its relayed chunks here
    copied: dict[int, float] = {}
    done = []  # when the mates have each piece of the own shard
    for lo, hi in pieces[-1:] if late else pieces:
        t = _copy(shape, lo, hi, t, mates, host.time((hi - lo) * cb), nvl, copied)
        done.append(t)
    nic.mates_copied(copied)
    last = len(pieces) - 1
    for i, (lo, hi) in enumerate(pieces):
        if reduced and not late:  # the NIC waits for the piece's copies: relay meanwhile
            nic.relay(done[i])
        after = done[-1] if late else done[i]
        for j, (k, a, b) in enumerate(shape.rail_units(hosts, lo, hi, cut=i == last)):
            nic.send(k, a, b, after if j == 0 and reduced and (not late or i == last) else 0.0)
        if late and i < last:
            nic.arrivals.append((nic.u, 0, lo, hi))
    return t


def _between(shape: Shape, mates: int, hosts: int, cb: float, host: Hop, nic: _Nic,
             nvl: list[tuple[float, int, int, int, int]],
             busy: list[tuple[float, float]]) -> float:
    """``estimate``'s own shard where its pieces go to the mates between their first two
    rail rounds (a ReduceScatter's, so no two sends of a chunk overlap): the whole shard
    leaves on the rail at once, its first two rounds cut into the pieces; each piece's
    copies follow its first round on the port, and its second round waits for them (the
    NIC sends the mates' relayed chunks meanwhile, where they fit). Fills ``nvl`` with the
    copies and ``busy`` with their spans; returns when the port's copies end."""
    edges = sorted({lo for lo, _ in shape.pieces})
    units: list[tuple[int, int, int]] = []
    for k, a, b in shape.rail_units(hosts, 0, shape.chunks):
        # the relayed chunks always apart: where they land nothing was reduced into them
        # (inverted, they lie in the input buffer, the rest's partial sums elsewhere)
        cuts = [a, *(e for e in edges if a < e < b and (k <= 2 or e == shape.relay)), b]
        units += [(k, x, y) for x, y in itertools.pairwise(cuts)]
    sent: list[tuple[float, int, int]] = []  # the first round's: (end, first chunk, end chunk)
    for k, a, b in (unit for unit in units if unit[0] == 1):
        nic.send(k, a, b)
        sent.append((nic.u, a, b))
    t = 0.0
    copied: dict[int, float] = {}
    for lo, hi in shape.pieces:
        start = max(t, *(end for end, a, b in sent if a < hi and lo < b))
        t = _copy(shape, lo, hi, start, mates, host.time((hi - lo) * cb), nvl, copied)
        busy.append((start, t))
    nic.mates_copied(copied)
    for k, a, b in units[len(sent):]:
        after = 0.0
        if k == 2:
            after = max(done for (_, done), (lo, hi) in zip(busy, shape.pieces, strict=True)
                        if lo < b and a < hi)
            nic.relay(after)
        nic.send(k, a, b, after)
    return t


def block_of(slot: int, mates: int, group: int) -> int:
    """The first slot of the block of ``group`` mates' shards that ``slot`` sends on its rail:
    the next block's (its own shard lies in another buffer), or, where a block is the whole
    host's, that one."""
    return (slot // group + 1) % (mates // group) * group


def _block_slots(slot: int, mates: int, group: int) -> range:
    """The slots whose shards ``slot`` sends in a block of ``group`` (``block_of``)."""
    first = block_of(slot, mates, group)
    return range(first, first + group)


def block_moves(widths: Sequence[int], mates: int) -> list[list[tuple[int, int]]]:
    """Per rail round of blocks of ``widths`` shards, per slot: how many hosts on it sends
    and the first slot of the block it sends. A round of blocks of ``w`` shards reaches
    ``w`` hosts, slot ``p`` the ``p % w``-th, so every host receives from one host on each
    rail, and from each host every block once (a host's ``mates / w`` blocks go on as many
    rails)."""
    rounds, at = [], 1
    for w in widths:
        rounds.append([(at + p % w, p if w == 1 else block_of(p, mates, w))
                       for p in range(mates)])
        at += w
    return rounds


def forward_mates(slot: int, mates: int, group: int, relayed: bool) -> list[int]:
    """The slots a GPU forwards what came on its rail to, in order (the ``turn``-th first),
    each turn a permutation of the slots, so no GPU receives from two mates at once: the
    mate ``turn`` places on. Where a plan of blocks relays chunks, the mates of its own
    group of slots come first: in a round of blocks of ``group`` they had the block's
    relayed chunks from their own rails (``relay_ahead``) and take the rest; after them the
    other groups', a group and a place in it at a time. (Inverted, a ReduceScatter's first
    reduction into a block then covers all of it: MSCCL holds a range in one buffer.)"""
    if not relayed:
        return [(slot + d) % mates for d in range(1, mates)]
    groups, (block, place) = mates // group, divmod(slot, group)
    return [(block + b) % groups * group + (place + e) % group
            for b in range(groups) for e in range(0 if b else 1, group)]


def relay_ahead(ahead: int, slot: int, group: int, e: int) -> int:
    """How many hosts on a GPU sends its ``e``-th relayed send (1 .. ``group - 1``) of a
    round of blocks of ``group`` in which its block goes ``ahead`` hosts on: to each other
    host of the round, where another slot of its group receives that block (``block_moves``)
    and forwards it to this GPU's rail peer without the relayed chunks (``forward_mates``)."""
    return ahead - slot % group + (slot + e) % group


def copy_turns(mates: int, group: int) -> list[int]:
    """The order a GPU copies its own shard to its mates in (turn ``d``: the mate ``d``
    places on): where shards go on the rail in blocks, the mate one place back first, so
    that a GPU has the shards of the mates just after it, its block, soonest."""
    return list(range(mates - 1, 0, -1)) if group > 1 else list(range(1, mates))


def _grouped(shape: Shape, mates: int, hosts: int, cb: float, host: Hop, nic: _Nic,
             nvl: list[tuple[float, int, int, int, int]], busy: list[tuple[float, float]],
             reduced: bool) -> float:
    """``estimate``'s rail rounds where they send blocks of mates' shards (``widths``): a
    round of blocks leaves once their shards have come (every GPU alike, so at the slowest
    slot's). In an AllGather the own shard goes to the mates at once; returns when those
    copies end. In a ReduceScatter (no two sends of the own chunks overlap) the last round
    of the own shard goes in two parts (``Shape.part``), each part's copies while the NIC
    sends the other; ``busy`` then holds the copies' spans, the port forwarding around
    them, and it returns 0."""
    c = shape.chunks
    widths = shape.widths(hosts)
    singles = shape.singles(hosts)
    units = shape.rail_units(hosts, 0, c)
    if reduced and shape.relay:  # inverted, the relayed chunks are reduced apart from the rest
        units = [(k, x, y) for k, a, b in units for x, y in itertools.pairwise(
            [a, *([shape.relay] if a < shape.relay < b and widths[k - 1] == shape.group
                  else []), b])]
    if reduced:
        first = shape.part or c // 2
        assert 0 < first < c, "a ReduceScatter's blocks need two chunks a shard at least"
        for k, a, b in units:
            if k < singles:
                nic.send(k, a, b)
        start = nic.u  # the NIC sends the first part while the second goes to the mates
        nic.send(singles, 0, first)
        first_sent = nic.u
        second = _copy(shape, first, c, start, mates, host.time((c - first) * cb), nvl, {})
        nic.send(singles, first, c, second)
        t0 = max(second, first_sent)
        end = _copy(shape, 0, first, t0, mates, host.time(first * cb), nvl, {})
        busy += [(start, second), (t0, end)]
        seconds = host.time(first * cb)
    else:
        t0, seconds = 0.0, host.time(c * cb)
        end = _copy(shape, 0, c, t0, mates, seconds, nvl, {})
    # when every GPU has the shards of the block it sends, per block size: a mate ``d``
    # places on copies to it ``d``-th (``copy_turns``)
    ready = {g: t0 + seconds * max((x - p) % mates for p in range(mates)
                                   for x in _block_slots(p, mates, g))
             for g in set(widths) - {1}}
    nic.mates_copied({})
    for k, a, b in units:
        if k > singles or not reduced:
            nic.send(k, a, b, ready[widths[k - 1]] if k > singles else 0.0)
    for k, w in enumerate(widths, 1):  # relayed chunks last: they land where they arrive
        for e in range(1, w if shape.relay and w == shape.group else 1):
            nic.send(k, 0, shape.relay, other=e)
    return 0.0 if reduced else end


def _copy(shape: Shape, lo: int, hi: int, t: float, mates: int, seconds: float,
          nvl: list[tuple[float, int, int, int, int]], copied: dict[int, float]) -> float:
    """The own shard's chunks ``lo..hi-1`` to every mate from ``t``, ``seconds`` each, in
    ``nvl``; where they are the relayed ones, when each mate has them in ``copied`` (turn
    -> when), in the order ``copy_turns`` gives. Returns when the port is done."""
    for turn in copy_turns(mates, shape.group):
        nvl.append((t, turn, lo, hi, 0))
        t += seconds
        if lo == 0 and shape.relay:
            copied[turn] = t
    return t


def paced_cuts(widths: Sequence[int], mates: int, cb: float, host: Hop, rail: Hop,
               lag: float) -> tuple[int, ...]:
    """The last rail pieces of rounds of ``widths`` chunks (of ``cb`` bytes each; in
    order), the last first, such that the NVSwitch port ends at most ``lag`` after the last
    arrival. The NIC and the port are a two-stage flow shop: each piece is forwarded to the
    mates while the next arrives, so from the end backwards each piece may take the port as
    long as ``lag`` and whatever the NIC took longer than the port on the pieces after it.
    Small pieces lose to the port's per-send latency, so the last ones are no smaller than
    needed, and they grow back to whole rounds as the NIC's lead builds up. Empty where
    the port keeps pace with whole rounds, or where at ``lag`` the pieces would never grow
    (the port is slower than the NIC at their size)."""
    def nic(x: int) -> float:
        return rail.time(x * cb)

    def port(x: int) -> float:
        return (mates - 1) * host.time(x * cb)

    cuts: list[int] = []
    lead = 0.0  # the NIC's lead over the port so far
    k = len(widths) - 1
    left = widths[k] if k >= 0 else 0  # the round's chunks left
    while k >= 0:
        chunks = widths[k]
        allowed = int(((lag + lead) / (mates - 1) - host.alpha) / (cb * host.beta))
        if allowed >= chunks and left == chunks:
            break
        if allowed < 1 or (allowed < chunks and nic(allowed) <= port(allowed)):
            return ()
        x = min(allowed, left)
        cuts.append(x)
        lead += nic(x) - port(x)
        left -= x
        if not left:
            k -= 1
            left = widths[k] if k >= 0 else 0
    return tuple(cuts)


# The port's lags ``search`` paces the last rail pieces for (in a whole piece's time on the
# port), on the ways (chunks, relayed chunks, split) whose other tails estimated fastest
LAGS = tuple(k / 64 for k in range(1, 49))
PACED_WAYS = 4


def chunk_choices(shard: float, rail: Hop, choices: Sequence[int] = CHUNK_CHOICES
                  ) -> list[int]:
    """``choices`` but those whose chunks cross a rail in less time than a send's latency
    (finer chunks there cost more in latency than their finer pieces gain); the first
    always stays."""
    return [c for i, c in enumerate(choices) if not i or shard / c * rail.beta >= rail.alpha]


def search(mates: int, hosts: int, shard: float, host: Hop, rail: Hop, reduced: bool,
           choices: Sequence[int] = CHUNK_CHOICES, steps: int = MAX_HOST_STEPS,
           relayed: bool = True, groups: Sequence[int] = ()) -> tuple[float, Shape]:
    """The earliest estimated end and its shape, over ``choices`` of chunks per shard, among
    shapes whose node files take at most ``steps`` MSCCL steps (every GPU's sends, a step at
    each end; the earliest of all where none does). The relayed share ``f`` balances the
    two ports: a GPU takes
    ``(hosts - 1) * (1 + (mates - 1) * f)`` shards on its NIC and
    ``(mates - 1) * (1 + (1 - f) * (hosts - 1))`` over NVSwitch. Without ``relayed`` no
    chunk is relayed (hosts under a spine: ``rail_moves``)."""
    a, b = rail.beta, host.beta
    m1, h1 = mates - 1, hosts - 1
    f = max(0.0, (m1 * b * (1 + h1) - h1 * a) / (h1 * m1 * (a + b)))
    best: tuple[float, Shape] = (float("inf"), Shape(1, 0, 0))
    fitting: tuple[float, Shape] | None = None
    seen: set[tuple[object, ...]] = set()  # tails that cut the same pieces are one candidate
    tried: dict[tuple[int, int, int, bool, bool], float] = {}  # each way's fastest estimate

    def consider(shape: Shape) -> None:
        nonlocal best, fitting
        lo, hi = _tailed(shape)
        key = (shape.chunks, shape.relay, shape.split, shape.late, shape.between,
               shape.group, shape.part, tuple(shape.rail_units(hosts, lo, hi)))
        if key in seen:
            return
        seen.add(key)
        est = estimate(shape, mates, hosts, shard, host, rail, reduced, record=False)
        if shape.group == 1:
            way = key[:5]
            tried[way] = min(tried.get(way, est.end), est.end)
        if est.end < best[0] * (1 - 1e-9):
            best = (est.end, shape)
        if 2 * mates * est.steps <= steps and (
                fitting is None or est.end < fitting[0] * (1 - 1e-9)):
            fitting = (est.end, shape)

    for c in chunk_choices(shard, rail, choices):
        relays = {min(c - 1, max(0, int(f * c) + d)) for d in (0, 1)} if relayed else {0}
        for r in sorted(relays):
            for split in (k for k in SPLITS if k <= c - r):
                # a ReduceScatter's own pieces go to the mates first, all but the last
                # after (late: without relayed chunks), or between their first two rounds
                # (not under a spine, whose rounds forward)
                ways = [(False, False)]
                if reduced and len(Shape(c, r, 0, split).pieces) > 1:
                    ways += [(True, False)] * (not r) + [(False, True)] * relayed
                for tail, taper, rounds in TAILS:
                    for late, between in ways:
                        consider(Shape(c, r, tail, split, late, taper, rounds, between=between))
        for g in groups:  # blocks of mates' shards, paced tails
            if c > 1 or not reduced:
                grouped = Shape(c, 0, 0, group=g)
                consider(grouped)
                _pace(grouped, hosts, mates, shard, host, rail, consider, reduced)
                for r in block_relays(g, c, mates, hosts, host, rail) if relayed else ():
                    for part in own_parts(c, mates, host, rail) if reduced else (0,):
                        _even(replace(grouped, relay=r, part=part), hosts, consider, reduced)
    # The fastest few ways, with their last pieces paced by the ports instead
    for c, r, split, late, between in sorted(tried, key=tried.__getitem__)[:PACED_WAYS]:
        _pace(Shape(c, r, 0, split, late, between=between), hosts, mates, shard, host, rail,
              consider)
    return fitting or best


def _pace(shape: Shape, hosts: int, mates: int, shard: float, host: Hop, rail: Hop,
          consider: Callable[[Shape], None], reduced: bool = False) -> None:
    """``consider`` ``shape`` with its last rail pieces paced by both ports (``paced_cuts``)
    at each of ``LAGS`` (a ReduceScatter's blocks: within the rounds of blocks, its own
    shard's rounds kept whole)."""
    cb = shard / shape.chunks
    if shape.group > 1:
        widths = shape.cut_widths(hosts, reduced)
    else:
        lo, hi = _tailed(shape)
        widths = [hi - lo] * (hosts - 1)
    whole = (mates - 1) * host.time(cb * widths[-1])
    for lag in LAGS:
        paced = paced_cuts(widths, mates, cb, host, rail, lag * whole)
        if paced:
            consider(replace(shape, cuts=paced))


def block_relays(group: int, chunks: int, mates: int, hosts: int, host: Hop, rail: Hop
                 ) -> list[int]:
    """The relayed chunks (``Shape.relay``) to try for a plan of blocks of ``group`` where
    the NVSwitch ports are the bound (none elsewhere): 0 and the two counts nearest the
    share ``x`` of a shard that balances the ports. Each of the ``R`` relayed sends a GPU
    makes (``group - 1`` per round of ``group``) moves ``x`` of a shard from a port onto a
    NIC: ``hosts - 1 + R x`` shards on the NIC, ``(mates - 1) hosts - R x`` on the port."""
    a, b = rail.beta, host.beta
    sends = (group - 1) * Shape(chunks, 0, 0, group=group).widths(hosts).count(group)
    x = ((mates - 1) * hosts * b - (hosts - 1) * a) / (sends * (a + b)) if sends else 0.0
    if x <= 0:
        return []
    return sorted({0} | {min(chunks - 1, max(1, int(x * chunks) + d)) for d in (0, 1)})


def own_parts(chunks: int, mates: int, host: Hop, rail: Hop) -> list[int]:
    """The first parts (``Shape.part``) a ReduceScatter of blocks tries for its own shard's
    last rail round: half (0), and the two nearest the share ``a`` whose rail send takes as
    long as the rest's copies to the mates, ``a rail = (1 - a) (mates - 1) host`` per byte.
    Where the ports are the bound, a port that copied the rest then waits for the NIC no
    longer than a chunk's difference (dgx-h100-4: 46 us with halves of 16 chunks)."""
    b = (mates - 1) * host.beta
    a = chunks * b / (rail.beta + b)
    return sorted({0} | {p for p in (int(a), int(a) + 1) if 0 < p < chunks and 2 * p != chunks})


def _even(shape: Shape, hosts: int, consider: Callable[[Shape], None],
          reduced: bool = False) -> None:
    """``consider`` ``shape`` (a plan of blocks) with every round of blocks cut into even
    pieces (``Shape.cuts``) of half a shard to four shards: where the NVSwitch ports are
    the bound, a port that falls behind then forwards what has come while the rest of a
    round arrives, joining what has come by then, instead of waiting for whole rounds."""
    c = shape.chunks
    widths = shape.cut_widths(hosts, reduced)
    consider(shape)
    for piece in sorted({max(1, c // 2), c, 2 * c, 4 * c}):
        consider(replace(shape, cuts=even_cuts(widths, piece)))


def even_cuts(widths: Sequence[int], piece: int) -> tuple[int, ...]:
    """``Shape.cuts`` that cut rounds of ``widths`` chunks into pieces of ``piece`` (each
    round's first piece what is left), the last first."""
    return tuple(piece for w in reversed(widths) for _ in range(-(-w // piece)))


def _tailed(shape: Shape) -> tuple[int, int]:
    """The chunks whose last rail rounds the tail cuts: the own shard's last piece, or the
    whole shard where its pieces part only for their first two rounds (``between``)."""
    return (0, shape.chunks) if shape.between else shape.pieces[-1]


# A place's send in one rail round under a spine, all relative to the sender ``(b, i)``
# (block ``b``, place ``i`` in it): it sends to ``(b + across, i + along)`` the shard of
# ``(b - back, i)``: its own (``back`` 0), or one that came across the spine from there.
Move = tuple[int, int, int]


def rail_moves(blocks: int, per: int, own_first: bool = False) -> list[tuple[Move, ...]]:
    """Each rail round's move of every place, for ``per`` hosts in each of ``blocks`` blocks
    (rounds ``1 .. blocks * per - 1``). A rank sends its shard across the spine to its own
    place in every other block, and to every other place in its block; a rank forwards what
    came across to every other place in its block (after it came). So every shard crosses
    into each other block once, the least a spine can carry, and in every round each rank
    sends one shard and receives one. One block: round ``k`` sends to the host ``k`` places
    on, the rotation.

    Half of a block's places cross in one round where each half has two places or more
    (a 2:1 spine carries half of what its NICs send): the lower half crosses while the
    upper half sends one place on among itself, then the other way round; the rounds after
    (every crossing done) are the rest of the sends within the block, a permutation each.
    Elsewhere all places cross together, each crossing followed by its forwards. Either
    way ``own_first`` starts the other way (the upper half first; the rounds within the
    block first), so that two tenants under the same leaves take turns on the spine."""
    if blocks == 1:
        return [((0, k, 0),) * per for k in range(1, per)]
    if per < 4:
        own = [(0, d, 0) for d in range(1, per)]
        across = [m for db in range(1, blocks)
                  for m in [(db, 0, 0), *((0, d, db) for d in range(1, per))]]
        return [(m,) * per for m in (own + across if own_first else across + own)]
    halves = [list(range(per // 2)), list(range(per // 2, per))]
    if own_first:
        halves.reverse()
    left = [{(d, back): 1 for d in range(1, per) for back in range(blocks)}
            for _ in range(per)]  # each place's sends within the block still to go
    crossed: list[list[int]] = [[] for _ in range(per)]

    def along(i: int, to: int) -> Move:
        """Place ``i``'s send to place ``to``: a forward of what came across first, else
        its own shard."""
        d = (to - i) % per
        back = min((x for x in crossed[i] if left[i].get((d, x))), default=0)
        del left[i][(d, back)]
        return (0, d, back)

    rounds: list[tuple[Move, ...]] = []
    for db in range(1, blocks):
        for cross, stay in (halves, halves[::-1]):
            moves: list[Move] = [(0, 0, 0)] * per
            for i in cross:
                crossed[i].append(db)
                moves[i] = (db, 0, 0)
            for j, i in enumerate(stay):
                moves[i] = along(i, stay[(j + 1) % len(stay)])
            rounds.append(tuple(moves))
    while left[0]:  # what is left is as many sends from each place as into it
        rounds.append(tuple(along(i, to) for i, to in enumerate(_matching(left, per))))
    return rounds


def _matching(left: list[dict[tuple[int, int], int]], per: int) -> list[int]:
    """A target place for every place among its sends left (``(d, back)``: to ``d`` places
    on), every place the target of one: a perfect matching, which a graph with as many
    edges out of every place as into it always has (Kuhn's augmenting paths)."""
    targets = [sorted({(i + d) % per for d, _ in left[i]}) for i in range(per)]
    owner = [-1] * per

    def augment(i: int, seen: set[int]) -> bool:
        for t in targets[i]:
            if t not in seen:
                seen.add(t)
                if owner[t] < 0 or augment(owner[t], seen):
                    owner[t] = i
                    return True
        return False

    for i in range(per):
        if not augment(i, set()):
            raise AssertionError("the sends left within a block have no perfect matching")
    to = [0] * per
    for t, i in enumerate(owner):
        to[i] = t
    return to


def plan(demand: Demand, hosts: list[list[int]], shape: Shape, host: Hop, rail: Hop,
         reduced: bool = False, blocks: int = 1,
         moves: Sequence[tuple[Move, ...]] = ()) -> np.ndarray:
    """AllGather sends in rank space: rows of (estimated start, estimated seconds, src rank,
    dst rank, first chunk, chunk count); ``reduced``: to be inverted into a ReduceScatter.
    ``hosts`` come block by block (``rail_layout``), their rail rounds as ``moves`` says
    (``rail_moves`` where none are given)."""
    mates, nh, c = len(hosts[0]), len(hosts), shape.chunks
    per = nh // blocks
    moves = moves or rail_moves(blocks, per)
    assert blocks == 1 or not shape.relay, "a spine's plan relays no chunk"
    shard = demand.size / demand.n
    est = estimate(shape, mates, nh, shard, host, rail, reduced)
    cb = shard / c
    if shape.group > 1:
        return _block_plan(hosts, shape, est, host, rail, cb)
    # where what place i receives in round k comes from: (blocks back, place)
    came: list[list[tuple[int, int]]] = []
    for round_moves in moves:
        sender = [(0, 0)] * per
        for j, (across, step, back) in enumerate(round_moves):
            sender[(j + step) % per] = (across + back, j)
        came.append(sender)

    def at(b: int, i: int) -> list[int]:
        return hosts[b % blocks * per + i % per]

    rows = []
    for h, members in enumerate(hosts):
        b, i = divmod(h, per)
        for p, r in enumerate(members):
            for start, turn, lo, hi, whose in est.nvl:
                back, j = came[-whose - 1][i] if whose else (0, i)  # whose = -k: round k's
                rows.append((start, host.time((hi - lo) * cb), r, members[(p + turn) % mates],
                             at(b - back, j)[p] * c + lo, hi - lo))
            for start, k, lo, hi, turn in est.nic:
                across, step, back = moves[k - 1][i]
                origin = at(b - back, i)[p] if turn == 0 else members[(p - turn) % mates]
                rows.append((start, rail.time((hi - lo) * cb), r, at(b + across, i + step)[p],
                             origin * c + lo, hi - lo))
    return np.asarray(rows, dtype=np.float64).reshape(-1, 6)


def _block_plan(hosts: list[list[int]], shape: Shape, est: _Estimate, host: Hop, rail: Hop,
                cb: float) -> np.ndarray:
    """``plan``'s rows where the rail rounds send blocks of mates' shards
    (``block_moves``; one block of hosts, each host's ranks consecutive)."""
    mates, nh, c, g = len(hosts[0]), len(hosts), shape.chunks, shape.group
    moves = block_moves(shape.widths(nh), mates)
    rows = []
    for h, members in enumerate(hosts):
        for p, r in enumerate(members):
            forwards = forward_mates(p, mates, g, shape.relay > 0)
            for start, turn, lo, hi, whose in est.nvl:
                if whose:  # what came in round -whose, from the host that many back
                    ahead, first = moves[-whose - 1][p]
                    origin = hosts[(h - ahead) % nh][first]
                    to = forwards[turn - 1]
                else:
                    origin, to = r, (p + turn) % mates
                rows.append((start, host.time((hi - lo) * cb), r, members[to],
                             origin * c + lo, hi - lo))
            for start, k, lo, hi, e in est.nic:
                ahead, first = moves[k - 1][p]
                if e:
                    ahead = relay_ahead(ahead, p, g, e)
                rows.append((start, rail.time((hi - lo) * cb), r, hosts[(h + ahead) % nh][p],
                             members[first] * c + lo, hi - lo))
    return np.asarray(rows, dtype=np.float64).reshape(-1, 6)


@dataclass(frozen=True)
class RailPlan:
    """One demand's plan before it is laid out: its hosts, port costs, phases (reduced or
    not, and the shape) and their estimated total time, the demand alone."""

    hosts: list[list[int]]
    host: Hop
    rail: Hop
    phases: list[tuple[bool, Shape]]
    estimate: float
    blocks: int = 1  # ``rail_layout``'s
    moves: tuple[tuple[Move, ...], ...] = ()  # ``rail_moves``' (its default where empty)
    queued: float = 1.0  # ``_spine_slowdown``: above 1, crossings wait for uplink lanes


def plans(fabric: Topology, demands: Sequence[Demand]) -> list[RailPlan]:
    """Every demand's shapes: the estimate ``synthesize`` compares before laying the plan
    out (the slowest demand's; sharing links can only add to it), and what it lays out.
    Demands under a spine take turns on it (``_turns``)."""
    found = []
    for t, d in enumerate(demands):
        layout_ = rail_layout(fabric, d)
        if layout_ is None:
            raise InputError(f"tenants[{t}]: the rail plan needs an AllGather, ReduceScatter "
                             "or AllReduce over several hosts alike, every rank on a rail")
        found.append(layout_)
    costs = [hops(fabric, d.ranks) for d in demands]
    rounds = _turns(fabric, demands, found, [rail for _, rail in costs])
    return [_shape(fabric, d, hosts, blocks, host, rail, moves) for d, (hosts, blocks),
            (host, rail), moves in zip(demands, found, costs, rounds, strict=True)]


def _turns(fabric: Topology, demands: Sequence[Demand],
           found: Sequence[tuple[list[list[int]], int]], rails: Sequence[Hop]
           ) -> list[tuple[tuple[Move, ...], ...]]:
    """Per demand (``rail_layout``'s hosts and blocks, its rail cost), its rail rounds
    (``rail_moves``): under a spine, each demand in turn starts the way (``own_first``)
    whose crossings meet the fewest of the demands' before it on one lane of an uplink,
    every other one where both meet as many. A GPU's lane is its place among its leaf's
    GPUs that cross, round robin, as ``choreo.resources`` assigns them; slot 0's GPU stands
    for its host."""
    leaf: dict[int, int] = {}
    for d, (hosts, blocks) in zip(demands, found, strict=True):
        if blocks > 1:
            for first, *_ in hosts:
                leaf[d.ranks[first]] = _leaf(fabric, d.ranks[first])
    place: dict[int, int] = {}
    seen: collections.Counter[int] = collections.Counter()
    for v in sorted(leaf):
        place[v] = seen[leaf[v]]
        seen[leaf[v]] += 1
    busy: collections.Counter[tuple[int, int, int]] = collections.Counter()
    chosen: list[tuple[tuple[Move, ...], ...]] = []
    spined = 0  # demands under a spine so far
    for d, (hosts, blocks), rail in zip(demands, found, rails, strict=True):
        per = len(hosts) // blocks
        if blocks == 1:
            chosen.append(tuple(rail_moves(1, per)))
            continue
        lanes = _uplink_lanes(fabric, leaf[d.ranks[hosts[0][0]]], rail)
        ways = [tuple(rail_moves(blocks, per, own_first)) for own_first in (False, True)]
        uses = []
        for moves in ways:
            use: collections.Counter[tuple[int, int, int]] = collections.Counter()
            for k, round_moves in enumerate(moves):
                for h, members in enumerate(hosts):
                    v = d.ranks[members[0]]
                    if round_moves[h % per][0]:
                        use[(leaf[v], k, place[v] % lanes)] += 1
            uses.append(use)
        clashes = [sum(max(0, busy[key] + n - 1) for key, n in use.items()) for use in uses]
        way = int(clashes[1] < clashes[0] or (clashes[1] == clashes[0] and spined % 2 == 1))
        busy.update(uses[way])
        chosen.append(ways[way])
        spined += 1
    return chosen


def block_groups(hosts: list[list[int]], blocks: int) -> tuple[int, ...]:
    """The block sizes (``Shape.group``) the rail rounds may send mates' shards in: powers
    of two that divide a host's slots (all of them: the whole host's shards, the sender's
    own among them) and are fewer than the other hosts (a round of the own shard comes
    first); none under a spine, or where a host's ranks are not consecutive in slot order
    (a block is one range of the buffer). Larger blocks take fewer rounds, so fewer sends'
    latencies on the NIC (dgx-h100-16, 1 GiB AllGather: 2.8210 ms in blocks of 2, 2.8177
    in blocks of 8)."""
    mates, nh = len(hosts[0]), len(hosts)
    if blocks > 1 or any(m != list(range(m[0], m[0] + mates)) for m in hosts):
        return ()
    return tuple(g for g in (1 << k for k in range(1, mates.bit_length()))
                 if mates % g == 0 and g < nh - 1)


def _shape(fabric: Topology, d: Demand, hosts: list[list[int]], blocks: int, host: Hop,
           rail: Hop, moves: tuple[tuple[Move, ...], ...]) -> RailPlan:
    mates, nh, shard = len(hosts[0]), len(hosts), d.size / d.n
    relayed = blocks == 1
    groups = block_groups(hosts, blocks)
    if d.collective is Collective.ALLREDUCE:  # its ReduceScatter, then its AllGather
        def phases(c: int) -> list[tuple[bool, tuple[float, Shape]]]:
            """Both phases with chunks ``c``, in one node file: each within half the budget
            where the best of each would not fit together."""
            found = [(r, search(mates, nh, shard, host, rail, r, (c,), relayed=relayed,
                                groups=groups)) for r in (True, False)]
            steps = sum(2 * mates * estimate(shape, mates, nh, shard, host, rail, r,
                                             record=False).steps for r, (_, shape) in found)
            if steps <= MAX_HOST_STEPS:
                return found
            return [(r, search(mates, nh, shard, host, rail, r, (c,), MAX_HOST_STEPS // 2,
                               relayed, groups)) for r in (True, False)]

        pairs = [phases(c) for c in chunk_choices(shard, rail)]
        best = min(pairs, key=lambda ph: ph[0][1][0] + ph[1][1][0])
    else:
        reduced = d.collective is Collective.REDUCESCATTER
        best = [(reduced, search(mates, nh, shard, host, rail, reduced, relayed=relayed,
                                 groups=groups))]
    queued = _spine_slowdown(fabric, d.ranks[hosts[0][0]], rail, moves)
    return RailPlan(hosts, host, rail, [(reduced, found[1]) for reduced, found in best],
                    sum(found[0] for _, found in best) * queued, blocks, moves, queued)


def _spine_slowdown(fabric: Topology, rank: int, rail: Hop,
                    moves: Sequence[tuple[Move, ...]]) -> float:
    """How much longer than the estimate the rail rounds take where more of a block's
    places cross the spine at once than its uplink has lanes (``choreo.resources``): the
    crossing rounds take that many times as long, the demand alone. 1 on one block."""
    crossing = [sum(across > 0 for across, _, _ in m) for m in moves]
    if not any(crossing):
        return 1.0
    lanes = _uplink_lanes(fabric, _leaf(fabric, rank), rail)
    return sum(max(1.0, c / lanes) for c in crossing) / len(moves)


def _leaf(fabric: Topology, rank: int) -> int:
    """The rail switch (leaf) of ``rank``'s NIC."""
    ports = _ports(fabric, rank)
    assert ports is not None  # ``rail_layout`` has checked
    return ports[1]


def _uplink_lanes(fabric: Topology, leaf: int, rail: Hop) -> int:
    """How many sends at the rail's pace ``leaf``'s uplink carries at once (its lanes in
    ``choreo.resources``; the fastest uplink where it has several, as one route takes one)."""
    up = max((fabric.links[k].bandwidth for k in fabric.out_links(leaf)
              if fabric.usable(k) and not fabric.is_npu(fabric.links[k].dst)), default=0.0)
    return max(1, int(up * rail.beta * (1 + 1e-9)))


def rail_gather(fabric: Topology, demands: Sequence[Demand],
                shaped: Sequence[RailPlan] | None = None) -> Schedule:
    """Every demand's rail-aligned plan, routed on ``fabric`` and simulated jointly (tenants
    that share links delay each other as the simulator says). Sends go through switches,
    never through another GPU (``Router``'s ``transit``), so no rank relays another's data:
    where a rail link is slow the cheapest path is otherwise a detour through other GPUs
    and rails, on links the plan counts as free. ``shaped``: ``plans`` already found."""
    shaped = plans(fabric, demands) if shaped is None else shaped
    planned: list[Demand] = []
    shapes: list[dict[str, object]] = []
    cols: list[np.ndarray] = []
    for d, p in zip(demands, shaped, strict=True):
        d = replace(d, chunks=p.phases[0][1].chunks)
        planned.append(d)
        shapes.append({"phases": [asdict(shape) for _, shape in p.phases],
                       **({"blocks": p.blocks} if p.blocks > 1 else {})})
        raws = [(plan(d, p.hosts, shape, p.host, p.rail, reduced, p.blocks, p.moves), reduced)
                for reduced, shape in p.phases]
        cols.append(in_sequence([(phase(raw, reduced), float((raw[:, 0] + raw[:, 1]).max()))
                                 for raw, reduced in raws]))
    return lay_out(fabric, planned, cols, ENGINE, {"engine": ENGINE, "shapes": shapes})


def phase(rows: np.ndarray, reduced: bool) -> np.ndarray:
    """An AllGather plan's rows (``plan``'s columns) with their op appended; ``reduced``:
    reversed and inverted in time, its ReduceScatter."""
    out = np.empty((len(rows), 7), order="F")  # written and read a column at a time
    if reduced:
        np.subtract(float((rows[:, 0] + rows[:, 1]).max()), rows[:, 0], out=out[:, 0])
        out[:, 0] -= rows[:, 1]
        out[:, 1], out[:, 2], out[:, 3] = rows[:, 1], rows[:, 3], rows[:, 2]
        out[:, 4:6] = rows[:, 4:6]
    else:
        out[:, :6] = rows
    out[:, 6] = int(Op.REDUCE if reduced else Op.COPY)
    return out


def in_sequence(phases: Sequence[tuple[np.ndarray, float]]) -> np.ndarray:
    """Phases' rows (``phase``'s) with each phase's estimated length, one after another:
    every phase starts where the one before is estimated to end (an AllReduce's AllGather
    after its ReduceScatter)."""
    out, offset = [], 0.0
    for rows, length in phases:
        rows[:, 0] += offset
        out.append(rows)
        offset += length
    return np.concatenate(out) if len(out) > 1 else out[0]


def lay_out(fabric: Topology, planned: Sequence[Demand], rows: Sequence[np.ndarray],
            engine: str, meta: dict[str, object]) -> Schedule:
    """Every demand's rows (``phase``'s, in its rank indices) routed on ``fabric`` and
    simulated jointly: tenants that share links delay each other as the simulator says.
    Sends go through switches, never through another GPU (``Router``'s ``transit``)."""
    def column(k: int, npus: bool = False) -> np.ndarray:
        """Column ``k`` of every tenant's rows as integers; ``npus``: rank indices mapped
        to the tenant's NPUs."""
        return np.concatenate([
            (np.asarray(d.ranks, dtype=np.int64)[r[:, k].astype(np.int64)] if npus
             else r[:, k].astype(np.int64)) for d, r in zip(planned, rows, strict=True)])

    tenant = np.repeat(np.arange(len(rows), dtype=np.int64), [len(r) for r in rows])
    step = np.unique(np.concatenate([r[:, 0] for r in rows]),
                     return_inverse=True)[1].astype(np.int64)
    src, dst = column(2, npus=True), column(3, npus=True)
    chunk, count, op = column(4), column(5), column(6)
    nbytes = max(d.size / d.n for d in planned)
    return timed_plan(fabric, fabric, tuple(planned), nbytes, tenant, step, src, dst, chunk,
                      op, count, engine=engine, meta=meta, transit=False)
